"""A device profile's optional layer table: transformer blocks and the model's two ends as measured inside a step, which the planner takes before its kernel model.

The section `layers` of a profile (docs/profiles.md) holds two tables, each for one device
without tensor parallelism, as a pipeline step runs them (`exec.profiler.layer_bench`
measures exec's GPT on gloo CPU ranks):

- `blocks`: rows [precision, hidden, heads, ffn, seq, micro_batch, recompute, F, B, I, W],
  the seconds of one block's forward, full backward, input-gradient and weight-gradient
  passes for one micro-batch of that size;
- `ends`: rows [precision, hidden, seq, vocab, micro_batch, first_F, first_B, last_F,
  last_B, last_I, last_W], what the first stage adds to its passes beyond its blocks (the
  embedding) and the last (the final norm, head and loss), the stage's own fixed cost with it;
- `checked` (optional): rows [layers, hidden, heads, seq, vocab, runs, median, worst], how far
  from its blocks the profile's predictions held: models exec ran, the runs, the median and
  worst |step error| in % (`benchmarks/bench_plan_vs_run.py --record`).

A block's kernels timed one by one in loops of their own run faster than inside a step
(docs/validation.md, "Kernels in a loop and in a step"), so where the table has a block
or ends the planner takes their times (`sim.cost.layer.layer_times`,
`sim.cost.ends.end_times`); elsewhere the kernel model (`sim.hardware.kernels`).
Measured times include the host's cost of each kernel: no launch floor is added to them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .gpus import PRECISIONS

__all__ = ["BLOCKS", "ENDS", "CHECKED", "BLOCK_PASSES", "END_PASSES", "LayerTable", "read"]

_SECONDS = (float, None)
BLOCKS = ((str, PRECISIONS), (int, None), (int, None), (int, None), (int, None), (int, None), (str, None),
          *(_SECONDS,) * 4)
ENDS = ((str, PRECISIONS), (int, None), (int, None), (int, None), (int, None), *(_SECONDS,) * 6)
# how far from its blocks the profile was checked (benchmarks/bench_plan_vs_run.py --record): a model
# shape, the runs, and the median and worst |step error| in % (+ 1e-9: a table holds positive numbers)
CHECKED = ((int, None),) * 6 + ((float, None),) * 2
BLOCK_PASSES = ("F", "B", "I", "W")
END_PASSES = ("first_F", "first_B", "last_F", "last_B", "last_I", "last_W")


@dataclass(frozen=True)
class LayerTable:
    """The measured blocks and ends, keyed by their shape (empty: a profile without them), and
    `checked`: rows (layers, hidden, heads, seq, vocab, runs, median, worst |step error| %) of
    models the planner predicted from them and exec measured."""
    blocks: Mapping[tuple, Mapping[str, float]] = field(default_factory=dict)
    ends: Mapping[tuple, Mapping[str, float]] = field(default_factory=dict)
    checked: tuple = ()

    def shapes(self) -> list[tuple]:
        """The block shapes measured: (precision, hidden, heads, ffn, seq), each once, sorted."""
        return sorted({k[:5] for k in self.blocks})

    def block(self, precision: str, hidden: int, heads: int, ffn: int, seq: int, micro_batch: int,
              recompute: str) -> Mapping[str, float] | None:
        """{"F", "B", "I", "W": seconds} of that block, or None where the table has none."""
        return self.blocks.get((precision, hidden, heads, ffn, seq, micro_batch, recompute))

    def end(self, precision: str, hidden: int, seq: int, vocab: int, micro_batch: int) -> Mapping[str, float] | None:
        """{"first_F", "first_B", "last_F", "last_B", "last_I", "last_W": seconds}, or None."""
        return self.ends.get((precision, hidden, seq, vocab, micro_batch))


def read(blocks: tuple, ends: tuple, checked: tuple = ()) -> LayerTable:
    """The table from its sets of checked rows (`DeviceProfile`'s reader checks them against
    `BLOCKS`, `ENDS` and `CHECKED`)."""
    return LayerTable({tuple(r[:7]): dict(zip(BLOCK_PASSES, r[7:])) for r in blocks},
                      {tuple(r[:5]): dict(zip(END_PASSES, r[5:])) for r in ends}, tuple(checked))
