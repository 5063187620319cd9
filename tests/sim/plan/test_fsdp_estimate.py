"""zero=3 with pp > 1 in sim.estimate: FSDP's gathers and reduce-scatters as actions the engine
schedules (`sim.add_fsdp`, then `sim.add_grad_reduce(overlap=True)`), each timed by its
closed form; pp = 1 keeps the gathers' exposed time inside the passes (tests/sim/plan/test_fsdp_unit.py)."""
import pytest

import sim
from sim.cost.data_parallel import stage_params
from sim.cost.ends import end_times
from sim.cost.layer import Slice, layer_times
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import profile
from sim.model.registry import find_model as model
from sim.plan.layout import Layout
from sim.plan.stage_costs import stage_costs
from sim.schedule.kinds import Kind

H100 = profile("h100-80gb-best-case")
KW = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=32, sequence_parallel=True, recompute="selective")


def _kinds(e, kind):
    return [ev for ev in e.result.events if ev.action.kind is kind]


def test_each_gather_and_reduce_scatter_is_an_action_of_its_closed_form_time():
    e = sim.estimate("llama3-70b", H100, zero=3, **KW)
    m, lay = model("llama3-70b"), e.layout
    params = stage_params(m, e.layers_per_stage, 8, list(range(4)))
    links, dp = links_of(H100), lay.topology().group("dp")
    unshards, reduces = _kinds(e, Kind.UNSHARD), _kinds(e, Kind.REDUCE_GRAD)
    assert sorted(ev.action.stage for ev in unshards) == [0, 1, 2, 3]  # one stage a rank: gathered once
    for ev in unshards:
        gather = collective_time(links, "all_gather", params[ev.action.stage] * 2, dp)
        assert ev.end - ev.start == pytest.approx(gather, rel=1e-12)
    for ev in reduces:
        scatter = collective_time(links, "reduce_scatter", params[ev.action.stage] * 4, dp)
        assert ev.end - ev.start == pytest.approx(scatter, rel=1e-12)
    assert e.time_parts["zero_collectives"] == 0.0  # none inside the passes


def test_the_costs_hold_the_shard_the_gathered_parameters_and_whole_gradients():
    m = model("llama3-70b")
    lay = Layout(zero=3, **KW)
    x = Slice(1, 8, True)
    lt, ends = layer_times(m, H100, x, "selective"), end_times(m, H100, x)
    layers = [20] * 4
    c, _ = stage_costs(m, H100, lay, x, lt, ends, layers, list(range(4)))
    params = stage_params(m, layers, 8, list(range(4)))
    for s, p in enumerate(params):
        assert c.weight_bytes[s] == pytest.approx(p * 2 / 4)     # the shard
        assert c.unshard_bytes[s] == pytest.approx(p * 2)        # gathered, beside it
        assert c.grad_bytes[s] == pytest.approx(p * 4)           # accumulated whole until the reduce-scatter
        assert c.optimizer_bytes[s] == pytest.approx(p * 12 / 4)
    one = stage_costs(m, H100, Layout(zero=1, **KW), x, lt, ends, layers, list(range(4)))[0]
    assert c.forward == one.forward and c.backward == one.backward  # the gathers are not in the passes


def test_reshard_after_forward_gathers_again_only_where_a_rank_switches_stages():
    kw = dict(KW, schedule="interleaved-1f1b", virtual=2)
    on, off = (sim.estimate("llama3-70b", H100, zero=3, reshard_after_forward=r, **kw) for r in (True, False))
    assert len(_kinds(off, Kind.UNSHARD)) == 8 < len(_kinds(on, Kind.UNSHARD))
    assert max(on.peak_memory) <= max(off.peak_memory)
    one_on, one_off = (sim.estimate("llama3-70b", H100, zero=3, reshard_after_forward=r, **KW) for r in (True, False))
    assert one_on.result.schedule.to_csv() == one_off.result.schedule.to_csv()  # one stage a rank: held throughout


def test_pp1_keeps_the_gathers_in_the_passes_and_zero2_with_pp_is_still_refused():
    e = sim.estimate("llama3-8b", H100, tp=8, pp=1, dp=4, global_batch=8, zero=3)
    assert [ev.end - ev.start for ev in _kinds(e, Kind.UNSHARD)] == [0.0]  # it holds the bytes, takes no time
    assert e.time_parts["zero_collectives"] > 0 and not _kinds(e, Kind.REDUCE_GRAD)
    with pytest.raises(ValueError, match="zero=2 with pp > 1"):
        sim.estimate("llama3-70b", H100, zero=2, **KW)
    with pytest.raises(ValueError, match="reshard_after_forward must be True or False"):
        sim.estimate("llama3-70b", H100, zero=3, reshard_after_forward=1, **KW)


def test_hsdp_gathers_within_its_shard_group_and_all_reduces_its_shard_across_replicas():
    """tp=1, dp=16 on nodes of 8: fsdp_shard=8 shards within a node (NVLink) and replicates
    across the two nodes; the states are 1/8, not 1/16."""
    kw = dict(tp=1, pp=2, dp=16, micro_batch=1, global_batch=32, zero=3)
    e = sim.estimate("llama3-8b", H100, fsdp_shard=8, **kw)
    m, topo = model("llama3-8b"), e.layout.topology()
    shard, replicas = topo.placed(range(0, 8)), topo.placed((0, 8))
    assert not shard.network and replicas.network
    links = links_of(H100)
    params = stage_params(m, e.layers_per_stage, 1, [0, 1])
    for ev in _kinds(e, Kind.UNSHARD):
        p = params[ev.action.stage]
        assert ev.end - ev.start == pytest.approx(collective_time(links, "all_gather", p * 2, shard), rel=1e-12)
    for ev in _kinds(e, Kind.REDUCE_GRAD):
        p = params[ev.action.stage]
        expected = (collective_time(links, "reduce_scatter", p * 4, shard)
                    + collective_time(links, "all_reduce", p * 4 / 8, replicas))
        assert ev.end - ev.start == pytest.approx(expected, rel=1e-12)
    plain = sim.estimate("llama3-8b", H100, **kw)
    for hsdp, fsdp in zip(e.memory_parts, plain.memory_parts):
        assert hsdp["weights"] == pytest.approx(2 * fsdp["weights"])
        assert hsdp["optimizer"] == pytest.approx(2 * fsdp["optimizer"])


@pytest.mark.parametrize("kwargs", [dict(fsdp_shard=3), dict(fsdp_shard=2, zero=1), dict(fsdp_shard=0, pp=1)])
def test_hsdp_refuses_what_it_cannot_shard(kwargs):
    kw = {**KW, "zero": 3, **kwargs}
    with pytest.raises(ValueError, match="fsdp_shard=.*HSDP"):
        sim.estimate("llama3-70b", H100, **kw)


def test_the_summary_shows_each_choice_that_acts_on_the_layout():
    """FSDP's options where zero=3 runs as FSDP (every pp: at pp = 1 reshard_after_forward decides
    whether the backward gathers each layer again), cp_comm where cp > 1, and the
    precision, nodes, overlaps and layer layout always; none where they do not act."""
    hsdp = sim.estimate("llama3-8b", H100, tp=1, pp=2, dp=16, micro_batch=1, global_batch=32, zero=3, fsdp_shard=8,
                        reshard_after_forward=False, precision="fp8").summary()
    assert (hsdp["zero"], hsdp["fsdp_shard"], hsdp["reshard_after_forward"], hsdp["precision"]) == (3, 8, False, "fp8")
    assert "cp_comm" not in hsdp and hsdp["layer_layout"] == "Et*16|t*16L" and hsdp["nics_per_node"] == 8
    ring = sim.estimate("llama3-8b", H100, tp=2, cp=2, dp=2, global_batch=4, zero=1, cp_comm="a2a",
                        overlap_grad_reduce=True).summary()
    assert (ring["cp"], ring["cp_comm"], ring["overlap_grad_reduce"], ring["precision"]) == (2, "a2a", True, "bf16")
    assert "fsdp_shard" not in ring and "reshard_after_forward" not in ring
    fsdp = sim.estimate("llama3-8b", H100, tp=8, pp=1, dp=4, global_batch=8, zero=3).summary()
    assert (fsdp["zero"], fsdp["reshard_after_forward"], fsdp["fsdp_unit"]) == (3, True, "layer")
