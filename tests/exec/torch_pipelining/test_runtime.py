"""Our schedules on torch's own runtime (exec.torch_pipelining.runtime): the CSV torch reads, and real
runs on 2 gloo ranks whose gradients equal one process's."""
import pytest

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim import Schedule  # noqa: E402
from sim.passes.order import order_transfers, transfer_order  # noqa: E402
from torch.distributed.pipelining.schedules import _Action, _validate_schedule  # noqa: E402

from exec.models.spec import ModelSpec  # noqa: E402
from exec.torch_pipelining.runtime import run_torch_runtime, to_torch_csv  # noqa: E402
from tests.sim.passes.test_order import interleaved_mismatch  # noqa: E402

SMALL = ModelSpec(layers=4, hidden=32, seq=8, batch_size=8)


@pytest.mark.parametrize("name", sorted(sim.SCHEDULES))
@pytest.mark.parametrize("P,M", [(2, 4), (3, 3), (4, 8)])
def test_csv_is_what_torch_reads(name, P, M):
    try:
        s = sim.make_schedule(name, P, M)
    except sim.ScheduleError:
        pytest.skip(f"{name} refuses P={P}, M={M}")
    if s.pipelines > 1:  # DualPipe: torch runs every micro-batch through every stage
        with pytest.raises(sim.ScheduleError, match="2 copies of the model, which torch's runtime cannot read"):
            to_torch_csv(s)
        return
    text = to_torch_csv(s)
    rows = [row.split(",") for row in text.splitlines()]
    actions = {r: [_Action.from_str(c) for c in row] for r, row in enumerate(rows)}
    assert [[str(a) for a in actions[r]] for r in actions] == rows   # torch spells every cell as we do
    # the check torch's _load_csv runs, and the stage -> rank map it infers from the actions
    assert _validate_schedule(actions, P, s.stages, M) == dict(enumerate(s.placement))
    back = Schedule.from_csv(text, s.placement)
    assert back.programs == order_transfers(sim.lower(s)).programs
    transfer_order(back)


@pytest.mark.slow
def test_torch_runtime_runs_our_1f1b_with_the_gradients_of_one_process():
    run = run_torch_runtime(SMALL, "1f1b", 2, 4, steps=2, warmup=1, timeout=180)
    assert run.grad_match, (run.max_grad_diff, run.worst_param)
    assert run.losses[0] == pytest.approx(run.reference_loss, rel=1e-5)
    assert len(run.step_times) == 2 and all(t > 0 for t in run.step_times)
    assert run.losses[1] < run.losses[0]  # the optimizer stepped between them


@pytest.mark.slow
def test_torch_runtime_needs_receives_in_send_order():
    """torch's runtime tags every transfer alike, so gloo pairs them by order, as NCCL does:
    an interleaved schedule as sim.lower posts it crosses two transfers of equal shape
    and gets wrong gradients; posted by sim.passes.order.order_transfers it gets the right ones."""
    s = interleaved_mismatch()
    good = run_torch_runtime(SMALL, s, steps=1, warmup=0, timeout=180)
    assert good.grad_match, (good.max_grad_diff, good.worst_param)
    bad = run_torch_runtime(SMALL, s, steps=1, warmup=0, timeout=180, in_order=False)
    assert not bad.grad_match and bad.max_grad_diff > 1e-3
