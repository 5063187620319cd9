"""sim.plan.copies: DualPipe's two copies of the model in `sim.estimate`, against closed forms and 1F1B's estimate.

Each copy's P stages hold the whole model, so device r holds one copy's stage r and the
other's stage P-1-r: its weights and gradients are 1F1B's stage r's plus stage P-1-r's
(twice 1F1B's where the stages are equal), its optimizer state the same over the two
copies' replicas (ZeRO-1 shards over 2 dp). The two copies of a stage reduce their gradients
as one group of 2 dp ranks (`Topology.mirrored`), each after its last backward; DualPipe's
mirror symmetry has both reach it at the same time.
"""
from __future__ import annotations

from dataclasses import fields

import pytest

import sim
from sim.cost.data_parallel import grad_reduce_times
from sim.hardware.network import collective_time, links_of
from sim.hardware.topology import Topology
from sim.plan import bounds as plan_bounds, space as plan_space
from sim.plan.layout import Layout
from sim.schedule.kinds import Kind

RUN = dict(tp=1, pp=4, dp=2, global_batch=64)


def _estimates(model: str, gpu: str, zero: int, **run):
    run = {**RUN, **run}
    return {s: sim.estimate(model, gpu, schedule=s, zero=zero, **run) for s in ("1f1b", "dualpipe")}


@pytest.mark.parametrize("zero", [0, 1])
def test_each_device_holds_one_stage_of_each_copy(zero):
    e = _estimates("llama3-8b", "h100-80gb", zero)
    one, two = ([m[k] for m in e[s].memory_parts] for s in ("1f1b", "dualpipe") for k in ("weights",))
    P = RUN["pp"]
    assert e["dualpipe"].layers_per_stage == e["1f1b"].layers_per_stage * 2 == [8] * 8
    assert e["dualpipe"].layer_layout == e["1f1b"].layer_layout  # one copy's, which holds the model
    assert two == pytest.approx([one[r] + one[P - 1 - r] for r in range(P)], rel=1e-12)
    assert two[1:-1] == pytest.approx([2 * w for w in one[1:-1]], rel=1e-12)  # equal stages: twice 1F1B's
    parts = [[m[k] for m in e[s].memory_parts] for s in ("1f1b", "dualpipe") for k in ("grads", "optimizer")]
    grads1, opt1, grads2, opt2 = parts
    assert grads2 == pytest.approx([grads1[r] + grads1[P - 1 - r] for r in range(P)], rel=1e-12)
    share = 2 if zero else 1  # ZeRO-1: each copy's state over the 2 dp replicas of both copies
    assert opt2 == pytest.approx([(opt1[r] + opt1[P - 1 - r]) / share for r in range(P)], rel=1e-12)


def test_the_copies_reduce_as_one_group_of_both_copies_replicas():
    """REDUCE_GRAD of a stage: the 2 dp ranks of devices r and P-1-r, one all-reduce (ZeRO-1:
    a reduce-scatter, then the all-gather) of the stage's gradients."""
    e = sim.estimate("llama3-8b", "h100-80gb", schedule="dualpipe", zero=0, tp=1, pp=4, dp=4, global_batch=64)
    lay, topo = e.layout, e.layout.topology()
    assert topo.mirrored("dp") == topo.placed((0, 1, 2, 3, 12, 13, 14, 15))  # devices 0 and 3, dp 4 each
    assert topo.mirrored("dp").nodes == 2  # the pp axis outermost: across nodes of 8
    params = [8 * sim.MODELS["llama3-8b"].params().per_layer]  # a middle stage: its 8 layers
    grad = 4.0  # fp32 gradients under bf16
    one = collective_time(links_of(e.profile), "all_reduce", params[0] * grad, topo.mirrored("dp_cp"))
    reduces = {ev.action.stage: ev.end - ev.start for ev in e.result.events if ev.action.kind is Kind.REDUCE_GRAD}
    assert reduces[1] == pytest.approx(one) and reduces[5] == pytest.approx(one)  # a middle stage, both copies
    assert grad_reduce_times(sim.MODELS["llama3-8b"], e.profile, lay, params, [0])[0] == pytest.approx(one)
    # overlap_grad_reduce: each right after its copy's last backward, whole (a device holds two stages)
    o = sim.estimate("llama3-8b", "h100-80gb", schedule="dualpipe", zero=0, tp=1, pp=4, dp=4, global_batch=64,
                     overlap_grad_reduce=True)
    assert [ev.end - ev.start for ev in o.result.events if ev.action.kind is Kind.REDUCE_GRAD and ev.action.stage == 1] \
        == [pytest.approx(one)]


@pytest.mark.parametrize("model, gpu, run", [
    ("llama3-8b", "h100-80gb", dict(tp=1, pp=4, dp=2, global_batch=64)),
    ("deepseek-v3-671b", "h100-80gb", dict(tp=2, pp=8, dp=16, ep=32, global_batch=512, sequence_parallel=True))])
def test_the_copies_reach_their_reduction_together_and_the_computes_are_the_bare_schedules(model, gpu, run):
    """By DualPipe's mirror symmetry, each stage's two copies end their backwards at the same
    time, so their REDUCE_GRADs start together (the one collective waits for neither); and the
    computes end as the schedule's without reductions does under the estimate's own costs."""
    e = sim.estimate(model, gpu, schedule="dualpipe", zero=1, **run)
    P = run["pp"]
    starts = {ev.action.stage: ev.start for ev in e.result.events if ev.action.kind is Kind.REDUCE_GRAD}
    assert sorted(starts) == list(range(2 * P))
    for i in range(P):  # the first copy's stage i and the second copy's (stage P + i)
        assert starts[i] == pytest.approx(starts[P + i], rel=1e-12)
    config = Layout(tp=run["tp"], pp=P, dp=run["dp"], schedule="dualpipe", virtual=2, zero=1,
                    sequence_parallel=run.get("sequence_parallel", False), ep=run.get("ep", 1),
                    global_batch=run["global_batch"])
    costs = plan_bounds.Bounds(sim.MODELS[model], gpu).costs(config)[0]
    bare_costs = sim.Costs(**{f.name: getattr(costs, f.name) for f in fields(costs)} | {"grad_reduce": 0.0})
    bare = sim.simulate(sim.make_schedule("dualpipe", P, e.layout.micro_batches), bare_costs)
    assert e.result.compute_end == pytest.approx(bare.makespan, rel=1e-12)
    assert e.result.makespan > bare.makespan  # the reductions after the last computes


def test_dualpipe_is_dualpipev_twice():
    """DualPipe on 2P devices is two mirrored DualPipeV's of P devices each: with the same
    layers a stage and reduction groups of the same size (2 x 2 and 4 replicas), the same memory
    and reductions, and the same step but for the sends between the middle devices."""
    two = sim.estimate("llama3-70b", "h100-80gb", tp=8, pp=8, dp=2, global_batch=128, schedule="dualpipe", zero=1,
                       sequence_parallel=True)
    one = sim.estimate("llama3-70b", "h100-80gb", tp=8, pp=4, dp=4, global_batch=128, schedule="dualpipev", zero=1,
                       sequence_parallel=True)
    assert two.layers_per_stage == one.layers_per_stage * 2 == [10] * 16
    assert max(two.peak_memory) == pytest.approx(max(one.peak_memory), rel=1e-9)
    assert two.time_parts["grad_reduce"] == pytest.approx(one.time_parts["grad_reduce"], rel=1e-9)
    # the steps differ by the transfers between the two middle devices, which DualPipeV's turn on one device has not
    assert two.step_time == pytest.approx(one.step_time, rel=1e-3)


def test_zero_2_and_3_are_refused_and_left_out_of_the_search():
    with pytest.raises(ValueError, match="zero=3 with schedule 'dualpipe' .2 copies of the model. is not modelled"):
        sim.estimate("llama3-8b", "h100-80gb", tp=1, pp=4, dp=2, global_batch=64, schedule="dualpipe", zero=3)
    configs = plan_space.configurations(sim.MODELS["llama3-8b"], 16, 64, schedules=["dualpipe"])
    assert configs and all(c.zero <= 1 and c.pp % 2 == 0 and c.pp > 1 for c in configs)


def test_mirrored_groups_join_device_p_and_its_mirror():
    t = Topology(tp=2, pp=4, dp=2, gpus_per_node=8)
    assert t.groups("dp")[:2] == [(0, 2), (1, 3)]
    assert t.mirrored("dp") == t.placed((0, 2, 12, 14))  # device 0's dp group and device 3's
    assert Topology(tp=1, pp=2, dp=2).mirrored("dp") == t.placed((0, 1, 2, 3)) == Topology(1, 1, 4).group("dp")


def test_a_mixture_of_experts_holds_both_copies_experts_and_one_dispatch_buffer():
    """DeepSeek-V3 (61 layers, the first 3 dense) over pp 8: device r holds 1F1B's stage r and
    stage P-1-r, dense and expert weights alike, and the dispatcher's buffers once."""
    run = dict(tp=2, pp=8, dp=16, ep=32, global_batch=512, sequence_parallel=True, zero=1)
    one, two, v = (sim.estimate("deepseek-v3-671b", "h100-80gb", schedule=s, **run) for s in ("1f1b", "dualpipe", "dualpipev"))
    P = run["pp"]
    assert two.layers_per_stage == one.layers_per_stage * 2 and sum(one.layers_per_stage) == 61
    w1, w2 = ([m["weights"] for m in e.memory_parts] for e in (one, two))
    assert w2 == pytest.approx([w1[r] + w1[P - 1 - r] for r in range(P)], rel=1e-12)
    assert sum(w2) == pytest.approx(2 * sum(w1), rel=1e-12)  # the parameters twice
    assert sum(m["weights"] for m in v.memory_parts) == pytest.approx(sum(w1), rel=1e-12)  # DualPipeV: once
    buffers = [m.get("dispatch_buffers", 0.0) for m in two.memory_parts]
    assert buffers == pytest.approx([m.get("dispatch_buffers", 0.0) for m in one.memory_parts])


@pytest.mark.parametrize("P, M", [(4, 8), (4, 20), (8, 16), (8, 40)])
def test_table_2s_bubble_holds_on_the_estimates_path_under_equal_costs(P, M):
    """One copy's P equal stages repeated for both copies (`repeat_costs`), REDUCE_GRADs of no
    time added (`sim.add_grad_reduce`, as `sim.estimate` adds them): DualPipe's bubble is still
    the DeepSeek-V3 report's Table 2, (P/2-1)(F&B + B - 3W), F&B the overlapped pair."""
    from sim.engine.costs import pair_times
    from sim.plan.copies import repeat_costs
    c, a = 1.0, 0.5
    one = sim.Costs(forward=(c,) * P, backward=(2 * c,) * P, backward_input=(c,) * P, backward_weight=(c,) * P,
                    a2a_forward=(a,) * P, a2a_backward=(a,) * P, grad_reduce=(0.0,) * P)
    schedule = sim.make_schedule("dualpipe", P, M, overlap=True)
    result = sim.simulate(sim.add_grad_reduce(schedule, overlap=False), repeat_costs(one, schedule.placement, 2))
    idle = [result.compute_end - busy for busy in result.busy()]
    assert max(idle) == pytest.approx((P // 2 - 1) * (sum(pair_times(c, a, 2 * c, a)) + 2 * c + a - 3 * c))


def test_on_deepseek_v3s_row_240_dualpipe_is_dualpipevs_step_at_more_memory():
    """docs/planner.md, "DualPipe in the planner": on row 240's layout (512 H100s, pp 8, ep 64)
    DualPipe's overlapped pairs make its step DualPipeV's, far under 1F1B's, and its second
    copy of the parameters costs memory DualPipeV does not spend."""
    from sim.plan import h100_dev
    run = next(r for r in h100_dev.runs() if r.row["row_id"] == "240")
    e = {s: sim.estimate(run.model, "h100-80gb", **{**run.keywords, "schedule": s}, **o)
         for s, o in (("1f1b", {}), ("dualpipev", {"overlap": True}), ("dualpipe", {"overlap": True}))}
    assert e["dualpipe"].step_time == pytest.approx(e["dualpipev"].step_time, rel=0.01)
    assert e["dualpipe"].step_time < 0.7 * e["1f1b"].step_time
    assert max(e["dualpipe"].peak_memory) > max(e["dualpipev"].peak_memory) + 10 * 2**30


def test_bounds_hold_for_dualpipe_on_a_mixture_of_experts():
    """The planner's bounds (`sim.plan.bounds`) at most the estimate, on DeepSeek-V3's DualPipe
    layouts over 512 H100s (pp 4 to 16, ep 8 to 64, full and selective recompute)."""
    m, gpu = sim.MODELS["deepseek-v3-671b"], "h100-80gb"
    configs = plan_space.configurations(m, 512, 1024, schedules=["dualpipe"], tp=2, pp=[4, 8, 16], ep=[8, 32, 64],
                                        recompute=["full", "selective"], max_micro_batch=2)
    bounds = plan_bounds.Bounds(m, gpu)
    assert len(configs) > 50
    for c in configs[::3]:
        e = sim.estimate(m, gpu, **c.keywords())
        assert bounds.memory_average(c) <= bounds.memory(c) <= max(e.peak_memory) * (1 + 1e-9), c
        assert bounds.average(c) <= bounds.time(c) <= bounds.schedule_time(c) <= e.step_time * (1 + 1e-9), c
