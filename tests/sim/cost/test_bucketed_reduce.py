"""The data-parallel reduction overlapped bucket by bucket with the last backward (one stage a
device, overlap_grad_reduce=True): `sim.cost.data_parallel.bucketed_tail`'s closed form, and
the REDUCE_GRAD the estimate simulates."""
import math

import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cost.data_parallel import BUCKET_PARAMS, bucketed_tail, buckets, stage_params
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import profile
from sim.model.registry import find_model as model
from sim.schedule.kinds import Kind

H100 = profile("h100-80gb-best-case")


def _queue_end(reduce, backward, k):
    """The reference: bucket i ready at i/k of the backward, reduced one at a time; the end
    of the last, less the backward."""
    t = 0.0
    for i in range(1, k + 1):
        t = max(t, backward * i / k) + reduce / k
    return t - backward


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 10), st.floats(0, 10), st.integers(1, 200))
def test_the_tail_is_the_bucket_queues_end(reduce, backward, k):
    tail = bucketed_tail(reduce, backward, k)
    assert tail == pytest.approx(_queue_end(reduce, backward, k), rel=1e-9, abs=1e-12)
    assert reduce / k - 1e-12 <= tail <= reduce + 1e-12
    assert bucketed_tail(reduce, backward, 1) == reduce and bucketed_tail(reduce, 0.0, k) == pytest.approx(reduce)


def test_buckets_are_megatron_cores():
    assert buckets(BUCKET_PARAMS, 8) == 1 and buckets(BUCKET_PARAMS + 1, 8) == 2
    assert buckets(100e6, 64) == math.ceil(100e6 / 64e6)  # 1M x dp above 40M


@pytest.mark.parametrize("zero", [0, 1])
def test_one_stage_a_device_reduces_only_the_tail_after_its_last_backward(zero):
    kw = dict(tp=8, pp=1, dp=8, micro_batch=1, global_batch=16, zero=zero)
    off, on = (sim.estimate("llama3-8b", H100, overlap_grad_reduce=o, **kw) for o in (False, True))
    (r_off,), (r_on,) = ([ev for ev in e.result.events if ev.action.kind is Kind.REDUCE_GRAD] for e in (off, on))
    m, lay = model("llama3-8b"), on.layout
    p = stage_params(m, on.layers_per_stage, 8, [0])[0]
    links, dp = links_of(H100), lay.topology().group("dp")
    op = "all_reduce" if zero == 0 else "reduce_scatter"
    reduce = collective_time(links, op, p * 4, dp)
    gather = 0.0 if zero == 0 else collective_time(links, "all_gather", p * 4, dp)
    assert r_off.end - r_off.start == pytest.approx(reduce + gather, rel=1e-12)
    backward = next(ev for ev in on.result.events if ev.action.kind is Kind.B)
    tail = bucketed_tail(reduce, backward.end - backward.start, buckets(p, 8))
    assert r_on.end - r_on.start == pytest.approx(tail + gather, rel=1e-9)
    assert on.step_time < off.step_time
