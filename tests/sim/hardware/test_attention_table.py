"""The profile's measured attention calls (`sim.hardware.attention_table`) read at any shape, and the kernel model taking them in place of torch's flash kernel's matmuls: exact where the rows follow the table's own laws, never faster when larger, and the core entering a layer's passes once."""
import copy
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.attention import measured_attention_times
from sim.cost.layer import Slice, kernel_layer_times
from sim.hardware.attention_table import read
from sim.hardware.profile import from_dict
from sim.hardware.profile_reader import ProfileError
from tests.sim.hardware.test_layer_table import GPT, _cpu

DIMS, SEQS, COUNTS = (16, 32, 64), (32, 64, 128), (8, 64)


def _law(fixed: float, each: float, p: float, q: float):
    """Seconds of a call of a + c x problems, each term d^p s^q: the table's own laws."""
    return lambda d, s, n: (fixed + each * n) * d ** p * s ** q


def _rows(law_f, law_b, dims=DIMS, seqs=SEQS, counts=COUNTS):
    return [("fp32", d, s, n, law_f(d, s, n), law_b(d, s, n)) for d in dims for s in seqs for n in counts]


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-7, 1e-5), st.floats(1e-8, 1e-6), st.floats(0.3, 2.0), st.floats(0.8, 2.5),
       st.floats(8, 256), st.floats(16, 512), st.floats(8, 64), st.floats(1.01, 4))
def test_rows_that_follow_the_laws_are_read_exactly_anywhere(fixed, each, p, q, d, s, n, k):
    """Linear in the count of problems, a power law in head width and sequence: the table
    returns the law itself, between the rows and beyond them (the edge segment's power); below
    the fewest problems measured it keeps their time (the fixed cost's floor), beyond the most
    it grows in proportion to the count."""
    f, b = _law(fixed, each, p, q), _law(2 * fixed, 3 * each, p, q)
    table = read(_rows(f, b))
    assert table.time("fp32", d, s, n) == pytest.approx((f(d, s, n), b(d, s, n)), rel=1e-9)
    lo, hi = COUNTS[0], COUNTS[-1]
    assert table.time("fp32", d, s, lo / k) == pytest.approx((f(d, s, lo), b(d, s, lo)), rel=1e-9)
    assert table.time("fp32", d, s, hi * k) == pytest.approx((k * f(d, s, hi), k * b(d, s, hi)), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-6, 1e-2), min_size=len(DIMS) * len(SEQS) * len(COUNTS),
                max_size=len(DIMS) * len(SEQS) * len(COUNTS)), st.floats(1, 100))
def test_any_rows_give_a_call_never_faster_beyond_the_largest_measured_shape(times, n):
    """Measured rows may scatter (a slower small shape): beyond the grid's largest sequence
    and head width the time never falls, every row is read back as measured, and every time is
    positive."""
    rows = [("fp32", d, s, c, t, t) for (d, s, c), t in zip(((d, s, c) for d in DIMS for s in SEQS for c in COUNTS), times)]
    table = read(rows)
    edge = table.time("fp32", DIMS[-1], SEQS[-1], n)[0]
    assert table.time("fp32", 2 * DIMS[-1], SEQS[-1], n)[0] >= edge * (1 - 1e-12)
    assert table.time("fp32", DIMS[-1], 2 * SEQS[-1], n)[0] >= edge * (1 - 1e-12)
    assert all(t > 0 for t in table.time("fp32", 20, 40, n))
    assert all(table.time("fp32", *r[1:4]) == pytest.approx(r[4:]) for r in rows)


def test_a_single_measured_value_along_an_axis_scales_as_the_flops():
    """One sequence and one head width measured (a --quick profile): the call at twice the
    sequence takes four times as long, at twice the head width twice, with its count of
    problems between its rows."""
    table = read([("fp32", 32, 64, 8, 1e-4, 3e-4), ("fp32", 32, 64, 64, 7e-4, 2e-3)])
    at = table.time("fp32", 32, 64, 16)
    assert table.time("fp32", 32, 128, 16) == pytest.approx(tuple(4 * t for t in at))
    assert table.time("fp32", 64, 64, 16) == pytest.approx(tuple(2 * t for t in at))
    assert at[0] == pytest.approx(1e-4 + 8 * 6e-4 / 56)
    assert table.time("bf16", 32, 64, 16) is None and not read([])


def _table(scale: float = 1.0) -> dict:
    f, b = _law(2e-6, 3e-7, 1.0, 1.6), _law(5e-6, 8e-7, 1.0, 1.6)
    rows = [[r[0], r[1], r[2], r[3], scale * r[4], scale * r[5]] for r in _rows(f, b)]
    return {"attention": {"table": {"rows": rows, "source": "measured", "command": "a test", "machine": "none",
                                    "date": "2026-11-28"}}}


def test_a_profile_reads_its_attention_table_and_refuses_a_bad_row():
    dev = from_dict(_cpu(**_table()))
    assert dev.attention and dev.attention.time("fp32", 32, 32, 16) is not None
    assert not from_dict(_cpu()).attention
    bad = _cpu(**_table())
    bad["attention"]["table"]["rows"][3][4] = -1.0
    with pytest.raises(ProfileError, match="attention.table"):
        from_dict(bad)


def test_the_measured_call_replaces_the_core_once_in_each_pass():
    """The layer's F takes the measured forward and I the measured backward, its own kernels
    (SDPA_INSIDE) left out: scaling the measured calls moves F and I by exactly the change in
    the calls, and W not at all; megatron's kernels and context parallelism ignore the table."""
    one, two, none = from_dict(_cpu(**_table(1.0))), from_dict(_cpu(**_table(2.0))), from_dict(_cpu())
    for b in (1, 4, 8):
        x = Slice(b, precision="fp32")
        f1, b1 = measured_attention_times(GPT, one, x)
        lt1, lt2 = kernel_layer_times(GPT, one, x), kernel_layer_times(GPT, two, x)
        assert lt2.forward - lt1.forward == pytest.approx(f1, rel=1e-9)
        assert lt2.backward_input - lt1.backward_input == pytest.approx(b1, rel=1e-9)  # the call recomputes its scores
        assert lt2.backward_weight == lt1.backward_weight
        # the call's own kernels (the zeroed gradient buffers, the rows' dO.O) are in its time, not added again
        assert lt1.parts["memory"] < kernel_layer_times(GPT, none, x).parts["memory"]
        assert (f1, b1) == one.attention.time("fp32", GPT.hidden // GPT.heads, GPT.seq, b * GPT.heads)
    assert measured_attention_times(dataclasses.replace(GPT, kernels="megatron"), one, Slice(1, precision="fp32")) is None
    assert measured_attention_times(GPT, one, Slice(1, cp=2, precision="fp32")) is None
