"""sim.plot.grid.plot_grid: the step x rank grid with exactly the bad cells framed, and the missing actions drawn after their rank's row."""
import matplotlib.colors as mcolors

import sim
from sim.plot.grid import BAD, plot_grid


def _patches(fig):
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches if p.get_gid()}


def test_bad_cells_are_framed_and_only_they():
    report = sim.check_schedule("0F0 0F1 0B0\n1B0 1F0 1F1 1B1 1B1")
    fig = plot_grid(report)
    patches = _patches(fig)
    framed = {gid for gid, p in patches.items() if mcolors.to_hex(p.get_edgecolor()) == BAD}
    assert framed == {"cell 1 4", "missing 0 0B1"}  # completeness first: the order is checked once it holds
    assert sum(gid.startswith("cell ") for gid in patches) == 3 + 5
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert all(f"!{n}" in texts for n in range(1, len(report.problems) + 1))


def test_a_clean_schedule_has_no_frame():
    fig = plot_grid(sim.check_schedule(sim.make_schedule("1f1b", 3, 5)))
    assert all(mcolors.to_hex(p.get_edgecolor()) != BAD for p in _patches(fig).values())
    assert fig.axes[0].get_title(loc="left") == "the schedule checks clean"
