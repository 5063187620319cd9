"""The numbering (`sim.passes.numbering`): its answers per (stage, kind) against its answers per compute, on every named schedule and on random ones."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sim
from sim import Kind, Schedule
from sim.passes.numbering import inputs_by_compute, inputs_by_group, number_program
from sim.schedule.kinds import COMPUTE, NEEDS
from sim.schedule.textbook import gpipe_on

NAMED = [name for name in sim.SCHEDULES if name != "zb-auto"]
UNIFORM = [name for name in NAMED if not name.startswith("dualpipe")]


def both_ways(schedule: Schedule, per_compute: bool = True):
    """inputs_by_group's and inputs_by_compute's answers (or None) for a schedule's computes."""
    progs = [[a for a in prog if a.kind in COMPUTE] for prog in schedule.programs]  # as number_program numbers
    actions = list(itertools.chain.from_iterable(progs))
    rank = [r for r, prog in enumerate(progs) for _ in prog]
    first = list(itertools.accumulate(map(len, progs), initial=0))
    cid = dict(zip(actions, range(len(actions))))
    grouped = inputs_by_group(progs, first, cid, schedule.chain, schedule.micro_batches)
    return grouped, per_compute and inputs_by_compute(actions, rank, cid, schedule.chain, schedule.ranks) or None


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("devices, micro_batches", [(2, 4), (4, 8), (3, 9)])
def test_per_group_answers_as_per_compute_on_every_named_schedule(name, devices, micro_batches):
    if sim.SCHEDULES[name].refusal(devices, micro_batches, sim.SCHEDULES[name].virtual):
        pytest.skip("these sizes are refused")
    grouped, by_compute = both_ways(sim.make_schedule(name, devices, micro_batches))
    # None where a (stage, kind) lacks some micro-batches: DualPipe's halves, a stage that
    # splits some backwards and not others (dualpipev's tail)
    assert grouped == by_compute or (grouped is None and name not in UNIFORM)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=7), st.integers(1, 5), st.booleans(), st.randoms())
def test_per_group_answers_as_per_compute_on_random_placements_and_orders(placement, micro_batches, split, rnd):
    """Several stages per rank, split backwards, programs shuffled (so some ranks wait on a
    later compute of their own: `stuck`)."""
    grouped, by_compute = both_ways(_shuffled(placement, micro_batches, split, rnd))
    assert grouped == by_compute


@given(st.lists(st.integers(0, 3), min_size=1, max_size=7), st.integers(2, 5), st.booleans(), st.randoms())
def test_a_stage_short_of_a_micro_batch_is_answered_per_compute(placement, micro_batches, split, rnd):
    """One compute's kind changed: its (stage, kind) lacks that micro-batch, and the
    per-group answer declines (None), leaving it to inputs_by_compute."""
    s = _shuffled(placement, micro_batches, split, rnd)
    programs = [list(prog) for prog in s.programs]
    a = programs[0][0]
    programs[0][0] = sim.Action(a.stage, Kind.B if a.kind is not Kind.B else Kind.F, a.micro)
    grouped, _ = both_ways(_unchecked(programs, s), per_compute=False)
    assert grouped is None


def _shuffled(placement: list[int], micro_batches: int, split: bool, rnd) -> Schedule:
    """GPipe over `placement` (its ranks renumbered 0, 1, ...), each program shuffled."""
    ranks = sorted(set(placement))
    s = gpipe_on([ranks.index(r) for r in placement], micro_batches, split=split)
    return Schedule([rnd.sample(prog, len(prog)) for prog in s.programs], s.placement, micro_batches)


def _unchecked(programs, s: Schedule) -> Schedule:
    """A schedule of `programs` that skips the completeness check (numbering's inputs only)."""
    out = Schedule.__new__(Schedule)
    for field, value in (("programs", tuple(map(tuple, programs))), ("placement", s.placement),
                         ("micro_batches", s.micro_batches), ("pipelines", 1)):
        object.__setattr__(out, field, value)
    return out


@given(st.integers(1, 6), st.integers(0, 5), st.integers(1, 6), st.booleans())
def test_a_dependency_names_inputs_of_its_own_micro_batch(stages, stage, micro, split):
    """What inputs_by_group relies on: where every micro-batch has the same computes, the
    inputs of (s, k, m) are those of (s, k, 0) with m for 0."""
    stage %= stages
    kinds = (Kind.F, Kind.I, Kind.W) if split else (Kind.F, Kind.B)
    computes = {(s, k, m) for s in range(stages) for k in kinds for m in range(micro + 1)}
    for k in kinds:
        at0 = NEEDS[k](stage, 0, stages, computes)
        assert NEEDS[k](stage, micro, stages, computes) == [(s, kd, micro) for s, kd, _ in at0]
        assert all(m == 0 for _, _, m in at0)


def test_number_program_takes_the_per_group_answers_on_1f1b():
    s = sim.make_schedule("1f1b", 4, 8)
    p = number_program(s)
    grouped, _ = both_ways(s)
    assert grouped is not None and p.producer == grouped[0]
