"""Figures of a training step (`python -m sim.plot` draws them from the command line).

Importing this package imports matplotlib; `import sim` does not.
"""
from sim.plot.gantt import draw_memory, draw_timeline, plot_compare, plot_overlay, plot_result, save_figure

__all__ = ["plot_result", "plot_compare", "plot_overlay", "save_figure", "draw_timeline", "draw_memory"]
