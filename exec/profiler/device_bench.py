"""What one rank's device achieves: matmuls by shape, torch's attention kernel by shape, memory-bound kernels by class, the host's cost per op, a step's fixed cost.

Each function runs inside a rank that `exec.launch.processes` set up as exec's runs are (its cores,
its threads, gloo's host tuning), so that it measures the device as a pipeline rank uses
it; every rank of the launch runs it at once (a barrier before each measurement), as the
ranks of a run compute at once, and the caller keeps rank 0's numbers. Times are the
median of repeated loops (`median_seconds`); on CUDA each loop is bracketed by synchronisations.
A matmul is timed with its operands laid out as the step's linear layers read them.

The sizes are the planner's: `planner_gemms` lists the matmuls `sim.estimate` times for a
model (`sim.cost.layer.gemm_shapes`: forward, input gradient, weight gradient; the output
layer's three), and the memory and compute classes are those of docs/profiles.md.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from sim.model.footprint import optimizer_step_bytes
from sim.cost.layer import Slice, gemm_products, gemm_shapes, pass_kernels
from sim.cost.shapes import head_widths

__all__ = ["CLASSES", "COMPUTE_CLASSES", "ATTENTION_GRID", "median_seconds", "planner_gemms", "matmul_rows",
           "attention_shapes", "attention_call", "attention_rows", "memory_rows",
           "compute_rows", "launch_seconds", "layer_launch_seconds", "step_overhead_seconds",
           "optimizer_tensor_seconds", "in_step_per_tensor"]

CLASSES = ("elementwise", "norm", "softmax", "copy", "optimizer", "embedding")
COMPUTE_CLASSES = ("gelu", "gelu_backward", "exp")  # elementwise kernels of a transcendental function
WIDTH = 128  # the last dimension of the norm, softmax and embedding tensors


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, loops: int = 5, least: float = 2e-3,
                   best: bool = False) -> float:
    """Seconds per call of `fn`: the median of `loops` loops (`best`: the fastest), each of as
    many calls as take at least `least` seconds (found on a warmed-up call). The median, as
    the planner predicts a run's median step: the fastest loop of a block ran 6-8 % under the
    median on a quiet machine (docs/validation.md, "Kernels in a loop and in a step")."""
    fn()
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    once = max(time.perf_counter() - t, 1e-7)
    calls = max(1, min(10_000, int(least / once)))
    samples = []
    for _ in range(loops):
        _sync(device)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t) / calls)
    return min(samples) if best else statistics.median(samples)


def planner_gemms(model, micro_batches: Iterable[int]) -> list[tuple[int, int, int, int, str]]:
    """The (m, n, k, batch, layout) matmuls `sim.estimate` times for `model` (a
    `sim.Transformer`, tp = 1) at each micro-batch size: every layer matmul's and the output
    layer's (bs, V, h) forward, input gradient and weight gradient, each with the operands
    read as torch's linear layer reads them (`sim.cost.layer.gemm_products`)."""
    out = set()
    for b in micro_batches:
        shapes = list(gemm_shapes(model, Slice(b, precision="fp32")).values()) + [(b * model.seq, model.vocab,
                                                                                    model.hidden, 1)]
        for shape in shapes:
            out |= set(gemm_products(*shape))
    return sorted(out)


def _product(m: int, n: int, k: int, batch: int, layout: str, device: torch.device, dtype: torch.dtype):
    """A call that computes `batch` (m x k) @ (k x n) products with the operands laid out as
    `layout` says: "nt" X @ W^T (W stored n x k), "nn" A @ B, "tn" A^T @ B (A stored k x m)."""
    a = torch.randn(batch, *((k, m) if layout == "tn" else (m, k)), device=device, dtype=dtype)
    b = torch.randn(batch, *((n, k) if layout == "nt" else (k, n)), device=device, dtype=dtype)
    a, b = (a.transpose(1, 2) if layout == "tn" else a), (b.transpose(1, 2) if layout == "nt" else b)
    return (lambda: torch.mm(a[0], b[0])) if batch == 1 else (lambda: torch.bmm(a, b))


def matmul_rows(shapes, device: torch.device, dtype: torch.dtype, precision: str, barrier: Callable[[], None],
                say: Callable[[str], None], loops: int = 5) -> list[list]:
    """[precision, m, n, k, batch, seconds, layout] of `torch.mm` (batch 1) or `torch.bmm` per
    (m, n, k, batch, layout) of `shapes`."""
    rows = []
    for i, (m, n, k, batch, layout) in enumerate(shapes):
        fn = _product(m, n, k, batch, layout, device, dtype)
        barrier()
        rows.append([precision, m, n, k, batch, median_seconds(fn, device, loops), layout])
        if i % 10 == 0 or i == len(shapes) - 1:
            say(f"matmul {i + 1}/{len(shapes)}: {m}x{n}x{k} (batch {batch}, {layout}) "
                f"{2 * m * n * k * batch / rows[-1][5] / 1e9:.1f} GFLOP/s")
    return rows


# torch's attention kernel at a grid of powers of two (`attention_shapes` adds each model's own):
# head widths, sequences and counts of problems (micro-batch x heads), read between them by
# sim.hardware.attention_table
ATTENTION_GRID = ((16, 32, 64, 128), (32, 64, 128, 256), (8, 64))


def attention_shapes(models, quick: bool = False) -> list[tuple[int, int, int]]:
    """(head_dim, seq, batch_heads) at which to time torch's attention: `ATTENTION_GRID` with
    each of `models`' (`sim.Transformer`s) head width and sequence added; `quick`: the models'
    alone."""
    dims, seqs, counts = ((), (), ATTENTION_GRID[2]) if quick else ATTENTION_GRID
    dims = sorted(set(dims) | {head_widths(m)[0] for m in models})
    seqs = sorted(set(seqs) | {m.seq for m in models})
    return [(d, s, n) for d in dims for s in seqs for n in counts]


def attention_call(head_dim: int, seq: int, batch_heads: int, device: torch.device, dtype: torch.dtype):
    """The forward and the backward of one causal `scaled_dot_product_attention` over
    `batch_heads` problems, q, k and v laid out as exec's GPT gives them (views of one
    projection's output, `exec.models.layers.Block`); the backward's gradients are q's, k's and
    v's alone (the split's concatenation is a kernel of its own); and q, k, v."""
    qkv = torch.randn(batch_heads, seq, 3 * head_dim, device=device, dtype=dtype, requires_grad=True)
    q, k, v = (z.view(batch_heads, seq, 1, head_dim).transpose(1, 2) for z in qkv.split(head_dim, dim=2))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), (q, k, v))


def attention_rows(shapes, device: torch.device, dtype: torch.dtype, precision: str, barrier: Callable[[], None],
                   say: Callable[[str], None], loops: int = 5) -> list[list]:
    """[precision, head_dim, seq, batch_heads, forward, backward] seconds of torch's causal
    attention (`attention_call`) per (head_dim, seq, batch_heads) of `shapes`
    (`attention_shapes`): the profile's `attention.table` (sim.hardware.attention_table)."""
    rows = []
    for i, (d, s, n) in enumerate(shapes):
        forward, backward, _ = attention_call(d, s, n, device, dtype)
        barrier()
        rows.append([precision, d, s, n, median_seconds(forward, device, loops), median_seconds(backward, device, loops)])
        if i % 8 == 0 or i == len(shapes) - 1:
            say(f"attention {i + 1}/{len(shapes)}: head {d}, sequence {s}, {n} problems: "
                f"{rows[-1][4] * 1e6:.0f} us forward, {rows[-1][5] * 1e6:.0f} us backward")
    return rows


def _class_kernel(name: str, elements: int, device: torch.device, dtype: torch.dtype):
    """A kernel of class `name` over about `elements` elements, and the bytes it moves (read + written)."""
    e = torch.empty((), dtype=dtype).element_size()
    rows = max(1, elements // WIDTH)
    x = torch.randn(rows, WIDTH, device=device, dtype=dtype)
    if name == "elementwise":
        y, out = torch.randn_like(x), torch.empty_like(x)
        return (lambda: torch.add(x, y, out=out)), 3 * x.numel() * e
    if name == "norm":
        w, b = torch.ones(WIDTH, device=device, dtype=dtype), torch.zeros(WIDTH, device=device, dtype=dtype)
        return (lambda: F.layer_norm(x, (WIDTH,), w, b)), 2 * x.numel() * e
    if name == "softmax":
        return (lambda: torch.softmax(x, -1)), 2 * x.numel() * e
    if name == "copy":
        out = torch.empty_like(x)
        return (lambda: out.copy_(x)), 2 * x.numel() * e
    if name == "optimizer":
        p = torch.nn.Parameter(x.float())
        p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW([p], lr=1e-6)
        return opt.step, p.numel() * optimizer_step_bytes("fp32")
    table = torch.randn(max(rows, 1024), WIDTH, device=device, dtype=dtype)
    ids = torch.randint(0, table.shape[0], (rows,), device=device)
    return (lambda: F.embedding(ids, table)), 2 * x.numel() * e + ids.numel() * 8


def _class_rows(names, sizes, kernel, device: torch.device, barrier: Callable[[], None], loops: int,
                report: Callable[[str, list], None]) -> dict[str, list[tuple[float, float]]]:
    """Per class of `names`, (size, seconds) at each of `sizes` elements, where
    `kernel(name, elements)` gives the class's call and the size its point is measured in;
    `report(name, points)` after each class (the progress line)."""
    out = {}
    for name in names:
        out[name] = []
        for n in sizes:
            fn, size = kernel(name, n)
            barrier()
            out[name].append((float(size), median_seconds(fn, device, loops)))
        report(name, out[name])
    return out


def memory_rows(sizes, device: torch.device, dtype: torch.dtype, barrier: Callable[[], None],
                say: Callable[[str], None], loops: int = 5) -> dict[str, list[tuple[float, float]]]:
    """Per class of `CLASSES`, (bytes moved, seconds) at each of `sizes` elements."""
    return _class_rows(CLASSES, sizes, lambda name, n: _class_kernel(name, n, device, dtype), device, barrier, loops,
                       lambda name, pts: say(f"memory-bound {name}: up to {max(b / t for b, t in pts) / 1e9:.1f} GB/s"))


def _compute_kernel(name: str, elements: int, device: torch.device, dtype: torch.dtype):
    """The torch op of compute class `name` over `elements` elements: erf GeLU's forward
    (`F.gelu`, as exec's GPT runs it), its backward (the op autograd runs), the exponential."""
    x = torch.randn(elements, device=device, dtype=dtype)
    if name == "gelu":
        return lambda: F.gelu(x)
    if name == "gelu_backward":
        g = torch.randn_like(x)
        return lambda: torch.ops.aten.gelu_backward(g, x)
    return lambda: torch.exp(x)


def compute_rows(sizes, device: torch.device, dtype: torch.dtype, barrier: Callable[[], None],
                 say: Callable[[str], None], loops: int = 5) -> dict[str, list[tuple[float, float]]]:
    """Per class of `COMPUTE_CLASSES`, (elements, seconds) at each of `sizes` elements."""
    return _class_rows(COMPUTE_CLASSES, sizes, lambda name, n: (_compute_kernel(name, n, device, dtype), n), device,
                       barrier, loops, lambda name, pts: say(f"compute-bound {name}: up to "
                                                             f"{max(e / t for e, t in pts) / 1e9:.2f} G elements/s"))


def layer_launch_seconds(model, barrier: Callable[[], None], loops: int = 7) -> float:
    """On CPU, the host's cost per kernel of a training pass: one block of exec's GPT with the
    heads of `model` (a `sim.Transformer`) at a size where its kernels do almost nothing
    (hidden 2 a head, sequence 2, micro-batch 1), its forward and backward time over the
    kernels `sim.cost.layer.pass_kernels` lists for them (F + B). Python, the modules, the
    dispatcher, autograd's graph and engine: what a pass costs beyond its kernels' work."""
    from exec.models.layers import Block
    tiny = dataclasses.replace(model, hidden=2 * model.heads, ffn=8 * model.heads, seq=2, kv_heads=None)
    block = Block(tiny.hidden, tiny.heads)
    x = torch.randn(1, tiny.seq, tiny.hidden, requires_grad=True)
    grad = torch.randn(1, tiny.seq, tiny.hidden)
    counts = pass_kernels(tiny, Slice(1, precision="fp32"))
    barrier()
    return median_seconds(lambda: block(x).backward(grad), torch.device("cpu"), loops) / (counts["F"] + counts["B"])


def launch_seconds(device: torch.device, barrier: Callable[[], None], loops: int = 7) -> float:
    """The host's cost of one op that does (almost) nothing: the median over a one-element
    add, multiply and matmul (on CPU the dispatch of an op; on CUDA, where the host runs
    ahead, the launch of a kernel)."""
    a = torch.ones(1, 1, device=device)
    b = torch.ones(1, 1, device=device)
    barrier()
    if device.type == "cuda":  # the host's time alone: no synchronisation inside the loop
        times = []
        for fn in (lambda: a + b, lambda: a * b, lambda: a @ b):
            t = time.perf_counter()
            for _ in range(1000):
                fn()
            times.append((time.perf_counter() - t) / 1000)
            _sync(device)
        return statistics.median(times)
    return statistics.median(median_seconds(fn, device, loops) for fn in (lambda: a + b, lambda: a * b, lambda: a @ b))


def step_overhead_seconds(device: torch.device, barrier: Callable[[], None], loops: int = 7) -> float:
    """A training step's fixed cost beyond its kernels: torch.optim.AdamW's step over one
    one-element parameter (its Python, its state bookkeeping), the optimizer exec runs."""
    p = torch.nn.Parameter(torch.ones(1, device=device))
    p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW([p], lr=1e-6)
    barrier()
    return median_seconds(opt.step, device, loops)


def optimizer_tensor_seconds(device: torch.device, barrier: Callable[[], None], optimizer: str = "adamw",
                             loops: int = 7, tensors: int = 32) -> float:
    """The host cost per parameter tensor of `optimizer`'s step (a name of
    `exec.runtime.optim.OPTIMIZERS`): its step over `tensors` + 1 one-element parameters less
    its step over one, per tensor, at least 0. On a CPU torch steps the tensors one by one
    (its for-loop implementation: AdamW about 25 us each on this project's VM, docs/validation.md, "Rules 19 and 20");
    on CUDA its default (foreach) groups them."""
    from exec.runtime.optim import make_optimizer

    def step_of(n: int) -> float:
        params = [torch.nn.Parameter(torch.ones(1, device=device)) for _ in range(n)]
        for p in params:
            p.grad = torch.ones_like(p)
        opt = make_optimizer(optimizer, params, lr=1e-6)
        barrier()
        return median_seconds(opt.step, device, loops)
    return max(0.0, (step_of(tensors + 1) - step_of(1)) / tensors)


def in_step_per_tensor(points: Iterable[tuple[int, int, float]], memory_seconds: Callable[[float], float],
                       optimizer: str = "adamw") -> tuple[float, float]:
    """(seconds per parameter tensor, rms residual in seconds) of `optimizer`'s step inside
    training steps: over (parameter tensors, parameters, seconds) points
    (`exec.profiler.layer_bench`'s steps), what each step took beyond its memory-bound part
    (`memory_seconds` of the bytes it moves, `sim.model.footprint.optimizer_step_bytes`, as the
    planner times it: `sim.cost.data_parallel.optimizer_time`), per tensor: least squares of
    the relative error, through 0 (a step's scatter grows with its time, and the large steps'
    would drown the small ones, where the host's cost shows). Inside a step torch's for-loop
    AdamW costs each tensor about twice what it costs in a loop of its own
    (`optimizer_tensor_seconds`; docs/validation.md, "Rules 19 and 20"). ValueError without points."""
    rest = [(n, t, t - memory_seconds(p * optimizer_step_bytes("fp32", optimizer))) for n, p, t in points]
    if not rest:
        raise ValueError("the optimizer's cost per tensor in a step needs points")
    per = max(0.0, sum(n * r / t ** 2 for n, t, r in rest) / sum((n / t) ** 2 for n, t, _ in rest))
    return per, (sum((r - per * n) ** 2 for n, _, r in rest) / len(rest)) ** 0.5