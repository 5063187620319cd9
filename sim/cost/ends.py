"""What the model's two ends add to their stages on one GPU: the embedding on the first, the final norm, output layer and loss on the last.

The kernel model times each end's kernels (`end_kernels`) as `sim.cost.layer` times a layer's;
where the device profile measured the ends inside a step (`sim.hardware.layer_table`) and
they stand for the model (`sim.cost.layer.measured_apply`), its times are taken instead.
"""
from __future__ import annotations

from sim.hardware.kernels import gemm_time, memory_time, precision_bytes
from sim.hardware.network import collective_time, links_of
from sim.hardware.profile import DeviceProfile
from sim.model.transformer import Transformer

from .layer import Slice, gemm_products, kernel_layer_times, measured_apply
from .block_fit import ends_in_step


def end_kernels(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, list[float]]:
    """The kernels of the embedding (first stage) and of the final norm, output layer and loss
    (last stage), per micro-batch and pass (F, I, W), as a list of their times. The embedding
    lookup writes bsh elements and, split over tp (vocabulary-parallel), all-reduces them
    (Shoeybi et al. 2019, Sec. 3); its backward adds the gradient rows into the table. The
    output layer is a (bs, V/t, h) matmul; the vocabulary-parallel cross entropy reads the
    logits and keeps fp32 softmax (6 bytes a logit each way); the final LayerNorm moves 4 and
    6 bytes a hidden element. Under FP8 all of it is BF16 (Megatron-LM's output layer is not a
    Transformer Engine module: `sim.cost.fp8`)."""
    h, t, e = m.hidden, x.tp, precision_bytes(x.activation_precision)
    tokens = x.tokens(m)  # b s/cp: context parallelism splits the sequence
    sbh = tokens * h * e / (t if x.sequence_parallel else 1)
    ar = [collective_time(links_of(g), "all_reduce", tokens * h * e, x.tensor_group)] if t > 1 else []
    logits = tokens * m.vocab / t
    fwd, dx, dw = (gemm_time(g, x.activation_precision, *p) for p in gemm_products(tokens, m.vocab // t, h))
    head = dict(F=[fwd, memory_time(g, 2 * sbh, "norm"), memory_time(g, 6 * logits)] + ar,
                I=[dx, memory_time(g, 6 * logits), memory_time(g, 3 * sbh, "norm")] + ar, W=[dw])
    embed = dict(F=[memory_time(g, 2 * tokens * h * e, "embedding")] + ar, I=[],
                 W=[memory_time(g, 3 * tokens * h * e, "embedding")])
    return {f"first_{k}": v for k, v in embed.items()} | {f"last_{k}": v for k, v in head.items()}


def end_times(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, float]:
    """The seconds each end adds to its stage's passes, per end and pass (F, B, I, W): the
    ends the profile measured inside a step where it has them (`measured_ends`), else its
    kernels run as a step runs them where the profile measured blocks (`sim.cost.block_fit`),
    else the sums of `end_kernels` (B = I + W)."""
    measured = measured_ends(m, g, x)
    if measured is not None:
        return measured
    kernels = end_kernels(m, g, x)
    fitted = ends_in_step(m, g, x, kernels, kernel_layer_times, end_kernels) if measured_apply(m, x) else None
    return _with_b(fitted if fitted is not None else {k: sum(v) for k, v in kernels.items()})


def end_kernel_counts(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, int]:
    """The kernels each end launches per pass (F, B, I, W), for the host's launch floor: those
    of `end_kernels`, or none where the ends are measured or fitted (their times hold the
    host's cost)."""
    kernels = end_kernels(m, g, x)
    counts = {k: len(v) for k, v in kernels.items()}
    if measured_ends(m, g, x) is not None or (
            measured_apply(m, x) and ends_in_step(m, g, x, kernels, kernel_layer_times, end_kernels) is not None):
        counts = dict.fromkeys(counts, 0)
    return _with_b(counts)


def _with_b(per_pass: dict) -> dict:
    """`per_pass` (keys `{first,last}_{F,I,W}`) with each end's full backward B = I + W."""
    return per_pass | {f"{side}_B": per_pass[f"{side}_I"] + per_pass[f"{side}_W"] for side in ("first", "last")}


def measured_ends(m: Transformer, g: DeviceProfile, x: Slice) -> dict[str, float] | None:
    """The ends as the profile measured them (`sim.hardware.layer_table`: exec's GPT, torch's
    kernels, tp = 1), or None. The first stage's I is empty and its W the whole backward
    (rule 15), as measured; their times hold the host's cost of each kernel."""
    row = g.layers.end(x.precision, m.hidden, m.seq, m.vocab, x.micro_batch)
    if row is None or not measured_apply(m, x):
        return None
    return dict(row, first_I=0.0, first_W=row["first_B"])
