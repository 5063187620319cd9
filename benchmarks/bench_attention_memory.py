"""What exec's GPT block saves for its backward under each of torch's CPU attention kernels, against the planner's count, over a grid of shapes (bytes, no timing).

    PYTHONPATH=. python benchmarks/bench_attention_memory.py            # about a minute

For every shape of the grid (head dim, heads, sequence, micro-batch, recompute none, selective
and full; fp32 and bf16) it counts, with saved-tensor hooks (`exec.runtime.memory.SavedBytes`),
the bytes one block saves with the kernel torch picks, with its flash kernel and with its math
backend pinned (`torch.nn.attention.sdpa_kernel`), and sets them against
`Transformer.activation_bytes_per_layer` (flash: `attention="flash"`; math: `"unfused"`, both
`kernels="torch"`): docs/rules.md, rule 17. It prints, per kernel and dtype, the shapes counted
and those that differ, with the first few differences.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's sim and exec

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from exec.models.spec import ModelSpec  # noqa: E402
from exec.runtime.memory import SavedBytes, param_storages  # noqa: E402

KERNELS = {"picked": None, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
GRID = dict(head_dim=(1, 3, 8, 32), heads=(1, 2, 4, 8), seq=(1, 7, 16, 128), micro_batch=(1, 2, 4),
            recompute=("none", "selective", "full"))
MAX_ELEMENTS = 300_000  # head_dim x heads x seq x micro_batch: a few seconds in all


def saved(spec: ModelSpec, kernel, dtype: torch.dtype) -> int:
    """Bytes one block of `spec` saves in a forward on `kernel` (None: the one torch picks)."""
    block = spec.build_layers()[1].to(dtype)
    x = torch.randn(spec.batch_size, spec.seq, spec.hidden, dtype=dtype, requires_grad=True)
    counter = SavedBytes(param_storages(block))
    with counter.hooks(), (sdpa_kernel([kernel]) if kernel is not None else torch.enable_grad()):
        block(x)
    return counter.nbytes


def main() -> None:
    for (name, kernel), (dtype, precision) in itertools.product(
            KERNELS.items(), ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))):
        counted, differ = 0, []
        for d, a, s, b, rec in itertools.product(*GRID.values()):
            if d * a * s * b > MAX_ELEMENTS:
                continue
            spec = ModelSpec("gpt", layers=1, hidden=d * a, heads=a, seq=s, vocab=8, batch_size=b, recompute=rec)
            t = spec.transformer()
            t = dataclasses.replace(t, attention="unfused") if name == "math" else t
            gap = saved(spec, kernel, dtype) - t.activation_bytes_per_layer(b, recompute=rec, precision=precision)
            counted += 1
            if gap:
                differ.append((f"h={d * a} a={a} s={s} b={b} {rec}", gap))
        print(f"{name:6} {precision}: {counted} shapes, {len(differ)} differ {differ[:3]}")


if __name__ == "__main__":
    main()
