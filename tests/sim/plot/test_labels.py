"""sim.plot.labels: a device's micro-batches as the figure and the table count them, and the
costs' note under the figure."""
from __future__ import annotations

import sim


def test_zbv_peak_is_counted_in_a_device_micro_batches_as_on_the_figure():
    from sim.plot.cli import chunk_costs
    from sim.plot.labels import costs_note, device_micro_batches
    result = sim.simulate(sim.make_schedule("zbv", 4, 8), chunk_costs(sim.Costs(), 2))  # as sim.plot runs it
    assert result.peak_activations == [8, 8, 8, 8]  # chunk micro-batches: two chunks a device
    assert device_micro_batches(result) == ["4", "4", "4", "4"]
    assert max(result.peak_memory) == 4  # the figure's and the table's memory: a device's micro-batches
    assert costs_note(sim.Costs()) == "costs: F 1, B 2 a stage; transfers free"
    assert costs_note(sim.Costs(), 2, split=True) == "costs: F 1, B 2 (I 1 + W 1) a device (1/V of it a chunk); transfers free"
