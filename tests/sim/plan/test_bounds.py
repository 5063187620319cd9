"""sim.plan.bounds: the planner's bounds on a configuration's memory and time, read without
searching zb-auto's order or simulating."""
from __future__ import annotations

import sim
from sim.plan.layout import Layout
from helpers import counting_calls


def test_planner_bounds_do_not_search_zb_auto():
    """The bounds read zb-auto's shape from the split 1F1B: a configuration of 768
    micro-batches on 64 devices is bounded without searching zb-auto's order or simulating
    (it took minutes)."""
    from sim.plan.bounds import Bounds
    from sim.hardware.gpus import gpu
    from sim.model.registry import find_model as model
    b = Bounds(model("gpt3-175b"), gpu("a100-80gb"))
    c = Layout(tp=8, pp=64, dp=2, schedule="zb-auto", virtual=1, recompute="full", zero=1, sequence_parallel=True,
               global_batch=1536)
    search = sim.SCHEDULES["zb-auto"].make
    with counting_calls(search, sim.simulate) as calls:
        assert b.memory(c) > 0 and b.time(c) > 0
    assert calls[search] == 0 and calls[sim.simulate] == 0
    with counting_calls(search) as calls:  # the count sees the search where it runs
        sim.make_schedule("zb-auto", 2, 2)
    assert calls[search] == 1
