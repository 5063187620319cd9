"""exec.measure.compare: a measured step replayed under the costs that produced it is exact."""
from __future__ import annotations

import pytest

import sim


def test_replay_of_a_simulated_step_under_its_own_costs_is_exact():
    from exec.measure.compare import replay_median
    costs = sim.Costs(forward=[1.0, 1.5], backward=[2.0, 2.5], latency=0.1)
    r = sim.simulate(sim.make_schedule("1f1b", 2, 8), costs)
    assert replay_median([r, r, r], costs) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="no measured steps"):
        replay_median([], costs)
