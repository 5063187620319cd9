"""FP8 training as Transformer Engine runs it: which of a layer's kernels run in FP8, what the casts cost, what FP8 keeps in memory.

`precision="fp8"` is NVIDIA Transformer Engine's FP8 recipe under Megatron-LM (TE's `Linear`,
`LayerNormLinear` and `LayerNormMLP` inside `fp8_autocast`; transformer_engine/pytorch/module/
linear.py and base.py, TE 1.x):

- **What runs in FP8.** The four Linear layers' GEMMs of a layer (QKV, projection, MLP in,
  MLP out), forward, input gradient and weight gradient: E4M3 inputs and weights, E5M2
  gradients (the HYBRID format, TE's default). Each at the datasheet's FP8 dense peak times
  the profile's achieved FP8 efficiency (`linear_gemm_time`). Everything else stays BF16:
  the attention core (TE's `DotProductAttention` runs BF16 unless `fp8_dpa`), the norms,
  the activation function, the residuals, the embedding and the output layer (Megatron-LM's
  output layer is not a TE module), and so the activations the pipeline sends.
- **The casts** (`cast_kernels`), memory-bound kernels beside the layer's others: before each
  FP8 GEMM of the forward its input is cast to FP8 and transposed for the weight gradient
  (TE's fused `fp8_cast_transpose`: reads 2 bytes, writes 2 an element); in the backward each
  Linear's output gradient likewise (`grad_output_preprocess`). Delayed scaling (TE's
  `DelayedScaling`: the scale from an amax history) computes the amax inside the cast; current
  scaling (`Float8CurrentScaling`) first reads the tensor once more for its amax, a reduction
  ("two tensor reads per quantization": TE's FP8 delayed-scaling docs), +2 bytes an element
  and one more kernel. Which one a profile measured is its `matmul.fp8_efficiency.scaling`.
  The weights are cast once a step (Megatron-LM passes `is_first_microbatch`, so TE caches
  the FP8 weight and its transpose over the micro-batches): 2 bytes read, 2 written a Linear
  parameter, counted with the optimizer step (`weight_cast_bytes`).
- **Tensor-parallel collectives.** With sequence parallelism TE casts before it gathers: the
  all-gathers of a column-parallel Linear's input (forward, and again for the weight
  gradient) and of a row-parallel Linear's output gradient move FP8, 1 byte an element; the
  reduce-scatters (row-parallel output, column-parallel input gradient) and, without sequence
  parallelism, the all-reduces move the BF16 GEMM outputs (`GATHER_BYTES`, `REDUCE_BYTES`).
- **Memory.** Beside the BF16 weight, the fp32 gradient and the fp32 master and Adam state
  (`sim.model.footprint`, as BF16), TE keeps an FP8 copy of each Linear weight and of its
  transpose, 2 bytes a Linear parameter (`weight_copy_bytes`); each Linear saves its input
  for the backward in FP8, 1 byte an element instead of 2 (`saved_bytes_saving`): the two
  norm outputs (QKV and MLP inputs), the projection's input and the MLP-out input. The split
  backward's W keeps are counted at 16 bits (an upper bound).
"""
from __future__ import annotations

from sim.hardware.kernels import gemm_time
from sim.hardware.profile import DeviceProfile
from sim.model.transformer import Transformer

SCALINGS = ("delayed", "current")
GATHER_BYTES = 1   # an FP8 element, as the sequence-parallel all-gathers move it
REDUCE_BYTES = 2   # a BF16 element: the GEMM outputs that reduce-scatters and all-reduces sum
_CAST = {"delayed": ("fp8_cast", 4), "current": ("fp8_amax_cast", 6)}  # bytes an element; current: +1 read for the amax
KERNELS_PER_CAST = {"fp8_cast": 1, "fp8_amax_cast": 2}                # current scaling: the amax kernel, then the cast


def check_fp8(dev: DeviceProfile) -> None:
    """ValueError, one line naming the fix, where `dev` cannot time FP8 GEMMs: a GPU without an
    FP8 peak (the A100), or a profile with neither `matmul.fp8_efficiency` nor fp8 table rows."""
    if "fp8" not in dev.gpu.peak_flops:
        raise ValueError(f"precision 'fp8': {dev.gpu.name} has no FP8 tensor cores (its datasheet states no FP8 "
                         f"peak); use bf16")
    if dev.fp8_efficiency is None and not any(r[0] == "fp8" for r in dev.matmul_rows):
        raise ValueError(f"precision 'fp8': profile {dev.name!r} has no matmul.fp8_efficiency (the share of the FP8 "
                         f"peak its FP8 GEMMs reach) and no fp8 matmul table; add one (docs/profiles.md)")


def linear_gemm_time(dev: DeviceProfile, m: int, n: int, k: int, batch: int = 1, layout: str = "nn") -> float:
    """Seconds of one Linear GEMM in FP8: the profile's fp8 table where it has one, else the
    BF16 time of the same product scaled by the peaks and the efficiencies,
    bf16_time x (bf16 peak / fp8 peak) x (bf16 efficiency / fp8 efficiency): the same tiles and
    waves, at the FP8 rate the profile measured."""
    measured = dev.matmul_lookup("fp8", m, n, k, batch, layout)
    if measured is not None:
        return measured
    check_fp8(dev)
    bf16 = gemm_time(dev, "bf16", m, n, k, batch, layout)
    return bf16 * dev.flops("bf16") / dev.flops("fp8") * dev.matmul_efficiency / dev.fp8_efficiency


def cast_kernels(m: Transformer, scaling: str = "delayed") -> dict[str, list]:
    """The casts of one layer, per pass, as `sim.cost.layer` lists its memory-bound kernels:
    (name, bytes an element, tensor). F: the inputs of QKV and MLP in (the norms' outputs,
    whole on each rank unless sequence parallel: "sbh"), of the projection ("sbh/t") and of MLP
    out ("sbf"). The backward (I): the output gradients of QKV ("sbqkv"), MLP in ("sbf", one
    per matrix but the last), the projection and MLP out ("sbh")."""
    if scaling not in SCALINGS:
        raise ValueError(f"FP8 scaling must be one of {', '.join(SCALINGS)}; got {scaling!r}")
    name, per = _CAST[scaling]
    forward = [(name, per, "sbh"), (name, per, "sbh/t"), (name, per, "sbh"), (name, per, "sbf")]
    backward = [(name, per, "sbqkv")] + [(name, per, "sbf")] * (m.mlp_matrices - 1) + [(name, per, "sbh")] * 2
    return {"F": forward, "I": backward}


def linear_params_per_layer(m: Transformer, tp: int = 1) -> float:
    """Parameters of one layer's four Linear weights on one GPU (no biases, no norms)."""
    head = m.hidden // m.heads
    qkv = m.hidden * (m.heads + 2 * m.kv_heads) * head
    return (qkv + m.heads * head * m.hidden + m.mlp_matrices * m.hidden * m.ffn) / tp


def weight_copy_bytes(m: Transformer, layers: int, tp: int = 1) -> float:
    """Bytes of TE's FP8 weight copies on one GPU for `layers` layers: each Linear weight and
    its transpose, 1 byte a parameter each."""
    return 2 * layers * linear_params_per_layer(m, tp)


def weight_cast_bytes(m: Transformer, layers: int, tp: int = 1) -> float:
    """Bytes the once-a-step weight casts move on one GPU for `layers` layers: read the BF16
    weight (2), write its FP8 copy and transpose (1 + 1)."""
    return 4 * layers * linear_params_per_layer(m, tp)


def saved_bytes_saving(m: Transformer, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                       recompute: str = "none") -> float:
    """Bytes one layer's saved activations shrink by on one GPU, per micro-batch, where TE saves
    each Linear's input in FP8 (1 byte an element less than BF16): the two norm outputs (whole
    on each rank unless sequence parallel), the projection's input and the MLP-out input (split
    over tp). None under full recompute, which keeps the layer's BF16 input only."""
    if recompute == "full":
        return 0.0
    sb = m.seq * micro_batch
    replicated = 2 * sb * m.hidden
    split = sb * m.hidden + sb * m.ffn
    return replicated / (tp if sequence_parallel else 1) + split / tp
