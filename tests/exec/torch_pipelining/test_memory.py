"""torch.distributed.pipelining's held activations beside ours (`exec.torch_pipelining.memory`, docs/schedules.md
"Memory beside torch's"): the table's numbers, where they agree, and where they differ exactly as
the docs explain (torch holds a micro-batch until W, we until I plus W's residue in bytes)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import sim  # noqa: E402
from sim import Costs, Kind  # noqa: E402
from sim.schedule.liveness import held, program_peak  # noqa: E402

from exec.models.spec import ModelSpec  # noqa: E402
from exec.torch_pipelining.memory import count_torch_caches, torch_held  # noqa: E402
from exec.torch_pipelining.orders import from_torch  # noqa: E402

# docs/schedules.md's table, P = 4, M = 8: (torch's name, V) -> (ours, torch's count per rank,
# our held per rank); torch's count is its runtime's, and the rule's on its order (1F1B: on ours,
# as torch's 1F1B order is not a schedule and its runtime runs our order)
P, M = 4, 8
TABLE = {
    ("GPipe", 1): ("gpipe", [8, 8, 8, 8], [8, 8, 8, 8]),
    ("1F1B", 1): ("1f1b", [4, 3, 2, 1], [4, 3, 2, 1]),
    ("Interleaved1F1B", 2): ("interleaved-1f1b", [11, 9, 7, 5], [11, 9, 7, 5]),
    ("LoopedBFS", 2): ("looped-bfs", [16, 16, 16, 16], [16, 16, 16, 16]),
    ("InterleavedZeroBubble", 1): ("zb-h1", [4, 4, 4, 4], [4, 3, 2, 1]),
    ("InterleavedZeroBubble", 2): ("interleaved-zb", [8, 8, 8, 8], [8, 7, 6, 5]),
    ("ZBVZeroBubble", 2): ("zbv", [8, 8, 8, 8], [8, 8, 8, 8]),
    ("DualPipeV", 2): ("dualpipev", [9, 9, 9, 9], [9, 9, 9, 9]),
}
SIZES = [(2, 4), (3, 6), (4, 8), (4, 12)]


def torch_order(name: str, v: int, devices: int, micro_batches: int) -> sim.Schedule:
    """The order torch's runtime runs: its own, but ours for 1F1B (its order is not a schedule)."""
    return sim.make_schedule("1f1b", devices, micro_batches) if name == "1F1B" else \
        from_torch(name, devices, micro_batches, v)


def w_keeps(share: float, stages: int):
    """Costs under which a micro-batch holds 1 byte until I, then `share` until W."""
    return Costs(activation_bytes=1.0, w_activation_bytes=share).for_stages(stages)


@pytest.mark.parametrize("key", TABLE)
def test_the_tables_numbers(key):
    name, v = key
    ours, torch_count, our_held = TABLE[key]
    order = torch_order(name, v, P, M)
    assert order.programs == sim.make_schedule(ours, P, M, v if name not in ("GPipe", "1F1B") else None).programs
    assert torch_held(order) == torch_count
    assert held(order) == our_held


@pytest.mark.parametrize("key", TABLE)
@pytest.mark.parametrize("devices,micro_batches", SIZES)
def test_torchs_count_is_ours_when_w_keeps_the_whole_activation(key, devices, micro_batches):
    """The one difference: with w_activation_bytes = activation_bytes our byte peak is torch's count."""
    name, v = key
    order = torch_order(name, v, devices, micro_batches)
    assert torch_held(order) == [program_peak(p, w_keeps(1.0, order.stages)) for p in order.programs]


@pytest.mark.parametrize("key", TABLE)
@pytest.mark.parametrize("devices,micro_batches", SIZES)
def test_they_agree_without_a_split_backward_and_differ_by_what_waits_for_w(key, devices, micro_batches):
    name, v = key
    order = torch_order(name, v, devices, micro_batches)
    ours, theirs = held(order), torch_held(order)
    if not any(a.kind is Kind.W for p in order.programs for a in p):
        assert ours == theirs
        return
    assert all(o <= t for o, t in zip(ours, theirs))
    # what torch holds more is micro-batches between their I and their W: in bytes, with
    # W keeping w of 1, ours lies between our count and torch's
    for r, prog in enumerate(order.programs):
        assert ours[r] <= program_peak(prog, w_keeps(0.5, order.stages)) <= theirs[r]


def test_zb_h1_holds_p_on_every_rank_in_torch():
    """ZB-H1 holds 1F1B's P - r micro-batches until I on rank r; torch's runtime keeps all P
    until W on every rank, so its peak is P everywhere (and ours is with W's residue)."""
    order = from_torch("InterleavedZeroBubble", P, M, 1)
    assert held(order) == held(sim.make_schedule("1f1b", P, M)) == [P - r for r in range(P)]
    assert torch_held(order) == [P] * P


@pytest.mark.slow
def test_torchs_runtime_holds_what_the_table_says():
    spec = ModelSpec(layers=8, hidden=32, seq=8, batch_size=8)
    counted = count_torch_caches(spec, list(TABLE), P, M)
    assert {key: counted[key] for key in TABLE} == {key: row[1] for key, row in TABLE.items()}
