"""The action-kind table (sim.schedule.kinds): every kind has one entry, and the entries agree with
each other and with what lowering and the engine do with them."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim import KINDS, Action, Kind, Role
from sim.engine.costs import StageCosts
from sim.schedule.kinds import peer_key, recv_consumer, remote_inputs

from sim.schedule.textbook import gpipe_on

COST_FIELDS = {f.name for f in dataclasses.fields(StageCosts)}


def test_every_kind_has_one_entry_that_names_real_fields():
    assert set(KINDS) == set(Kind)
    for kind, spec in KINDS.items():
        assert spec.handler.isidentifier()
        if spec.role is Role.COMPUTE:
            assert spec.cost in COST_FIELDS and spec.needs is not None and spec.peer is None
            assert spec.comm is None or spec.comm in COST_FIELDS
            assert all(e.field in COST_FIELDS and e.sign in (-1, 1) and e.at in ("start", "end") for e in spec.memory)
        elif spec.role is Role.COLLECTIVE:  # once per stage, no memory, no transfer of its own
            assert spec.cost in COST_FIELDS and spec.needs is not None and spec.peer is None
            assert not spec.memory and spec.send is None and spec.recv is None
        elif spec.role is Role.COPY:  # a copy engine each way; memory at its own start or end
            assert spec.cost in COST_FIELDS and spec.needs is not None and spec.peer is None
            assert spec.stream in ("to host", "from host") and spec.send is None and spec.recv is None
            assert all(e.field in COST_FIELDS and e.sign in (-1, 1) and e.at in ("start", "end") for e in spec.memory)
            assert all(KINDS[k].role is Role.COMPUTE for k in spec.feeds)
        elif spec.role is Role.PAIR:  # a mark: no cost, no memory, waits as the backward it names
            assert spec.cost is None and not spec.memory and spec.needs is KINDS[Kind.B].needs and spec.peer is None
        elif spec.role is Role.GATHER:  # FSDP's all-gather stream: UNSHARD timed, RESHARD free; their memory
            assert spec.cost in COST_FIELDS | {None} and spec.needs is None and spec.peer is None
            assert (spec.cost is None) == (kind is Kind.RESHARD) and [e.field for e in spec.memory] == ["unshard_bytes"]
        else:
            assert spec.cost is None and spec.needs is None and spec.peer is not None


def test_transfer_kinds_pair_up():
    """A compute's result travels as its SEND and RECV kinds, which are each other's peers,
    and the RECV feeds that compute's consumers."""
    for kind, spec in KINDS.items():
        if spec.role is Role.COMPUTE and spec.send is not None:
            step, other = KINDS[spec.send].peer
            assert other is spec.recv and KINDS[spec.recv].peer == (-step, spec.send)
            assert KINDS[spec.send].role is Role.SEND and KINDS[spec.recv].role is Role.RECV
    for kind in (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B):
        assert peer_key(*peer_key(3, kind, 5)) == (3, kind, 5)


def test_memory_effects_balance():
    """What a micro-batch takes on a stage it gives back by the end of its backward, for the
    full backward (F, B) and for the split one (F, I, W), with and without offloading."""
    for kinds in ((Kind.F, Kind.B), (Kind.F, Kind.I, Kind.W), (Kind.F, Kind.OFFLOAD, Kind.RELOAD, Kind.B),
                  (Kind.F, Kind.OFFLOAD, Kind.RELOAD, Kind.I, Kind.W), (Kind.UNSHARD, Kind.RESHARD)):
        total = {}
        for k in kinds:
            for e in KINDS[k].memory:
                total[e.field] = total.get(e.field, 0) + e.sign
        assert all(v == 0 for v in total.values()), (kinds, total)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([[0, 1, 2], [0, 1, 0, 1], [0, 1, 1, 0], [1, 0, 2, 2, 0, 1]]), st.integers(1, 4), st.booleans())
def test_lowering_places_exactly_the_receives_each_compute_waits_for(placement, micro, split):
    """Every RECV that lowering adds feeds a compute that waits for it, and every compute
    waits for exactly the RECVs of its inputs from other ranks, posted before it."""
    s = gpipe_on(placement, micro, split)
    low = sim.lower(s)
    computes = {a for p in low.programs for a in p if a.kind.is_compute}
    recvs = {a for p in low.programs for a in p if KINDS[a.kind].role is Role.RECV}
    waited = set()
    for prog in low.programs:
        seen = set()
        for a in prog:
            if a.kind.is_compute:
                need = {Action(*k) for k in remote_inputs(*a, low.stages, computes, low.placement)}
                assert need <= seen, f"{a} runs before its receives {need - seen}"
                assert set(sim.waits_for(a, low, computes)) == need
                waited |= need
            elif a in recvs:
                assert Action(*recv_consumer(*a, computes)) in computes
                seen.add(a)
    assert waited == recvs


def test_needs_refuses_a_transfer_kind():
    with pytest.raises(ValueError, match="compute actions, not 0SEND_F1"):
        sim.dependencies(Action(0, Kind.SEND_F, 1), 2, set())
