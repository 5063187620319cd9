"""What one transformer layer's passes cost one GPU: the times of F, I, W and the recompute.

A layer's passes are its matmuls (`sim.hardware.kernels.gemm_time`, per GPU: the tensor-parallel
slice), its memory-bound kernels (`sim.hardware.kernels.memory_time`) and its tensor-parallel
collectives (`sim.hardware.network.collective_time` over `Slice.tp_group`), each listed here from
Megatron-LM's layer (Shoeybi et al. 2019, Sec. 3; Narayanan et al. 2021, Sec. 3.3;
Korthikanti et al. 2022, Sec. 4) and timed alone; a pass is their sum, except where Megatron-LM overlaps them:

- Tensor parallelism splits the QKV and MLP-in matmuls by columns and the projection and
  MLP-out by rows, and joins them with an all-reduce after each row-parallel matmul in F and
  after each column-parallel one in the backward: two of 2bsh bytes each way (Shoeybi et
  al. 2019, Fig. 3). Sequence parallelism turns each into an all-gather and a
  reduce-scatter of the same bytes (Korthikanti et al. 2022, Sec. 4.2.2), the same ring time.
- In a full backward B Megatron-LM overlaps each backward all-reduce with the weight-gradient
  matmul of the same linear layer (Korthikanti et al. 2022, Sec. 6.2: why full recompute costs
  39 %, not 33 %); a split backward runs that matmul later, in W, so I waits for the
  all-reduces. `tp_overlap=False` is an executor without that overlap (Megatron-LM before
  its asynchronous tensor-parallel all-reduce, `--no-async-tensor-model-parallel-allreduce`;
  the SC'21 paper, Narayanan et al. 2021, Sec. 3.3, describes the backward all-reduces with
  no overlap): B then waits for every collective, as I does.
- The attention core: `attention="unfused"` is Megatron-LM's (the scores and values as batched
  GEMMs, softmax and dropout over the as^2b scores); `attention="flash"` one fused kernel
  (FlashAttention-2/3, cuDNN's), FlashAttention-2's causal FLOP count at the profile's attention
  efficiency, its backward 2.5 times its forward, no kernel over the scores
  (`sim.cost.attention`).
- precision="fp8": the four Linear GEMMs in FP8, Transformer Engine's casts among the
  memory-bound kernels, FP8 all-gathers and BF16 reductions (`sim.cost.fp8`); the rest BF16.
- Context parallelism (`Slice.cp`, Megatron-Core's `--context-parallel-size`): each of cp
  ranks holds s/cp of the sequence, so every matmul, kernel and collective of the layer works
  on b s/cp tokens, except the attention core, whose s/cp queries meet all s keys
  (`sim.cost.context.context_attention`: ring attention's K/V exchange or Ulysses' all-to-alls).
- Recompute runs before the backward: "full" the whole forward, collectives included;
  "selective" the attention core (scores, softmax, dropout, values), which needs none.
- Head widths other than hidden/heads and MLA's projections: `sim.cost.shapes`. A MoE layer
  (`moe=True`): the dense layer with its shared experts as the MLP, plus the routed experts,
  their all-to-alls apart (`sim.cost.moe`).

Memory-bound kernels, in bytes moved (read + written), per layer, for 16-bit elements and
1-byte dropout masks (the tensors of Korthikanti et al. 2022, Sec. 4.1; Megatron-LM's fused
kernels: bias-GeLU, bias-dropout-add, scale-mask-softmax). "split" kernels work on a tensor
that tensor parallelism divides by t; "replicated" ones on a whole sbh tensor on every rank
unless sequence parallel. Each backward kernel reads its output gradient and what it saved
and writes its input gradient; each bias's gradient reads its output gradient once more; the
attention's output is permuted back to [s, b, h] (a copy each way, Megatron-LM's
`permute(...).contiguous()`).

`Transformer(kernels="torch")` is torch's eager path instead, the GPT `exec.models.layers.Block` runs
(arch "gpt", flash attention, no dropout; others are refused), its kernels read off torch's
profiler for one block (docs/validation.md, "One profile, many shapes"): no fused kernels and no dropout; each linear
layer's `addmm` first copies its bias into the output; GeLU is erf's, whose forward and
backward are compute-bound on a CPU (`sim.hardware.kernels.elementwise_time`, the profile's
compute-bound classes); `scaled_dot_product_attention` is one flash kernel (Dao et al. 2022,
Alg. 1 and 2) that never writes the scores: its forward runs the scores and values matmuls and
exponentiates the scores, its backward computes them again (the scores matmul and its
exponentials: five matmuls, not four) after zeroing its three gradient buffers and reading
the output and its gradient once (the rows' dO.O), and the split's backward concatenates the
three gradients. The weight-gradient pass W holds the bias gradients (a sum over the tokens),
the norms' gain and bias gradients and autograd's adds into each parameter's `.grad` (counted
on every micro-batch; the first of a step stores instead); and under full recompute torch's
split backward recomputes the forward once more in W (`exec.runtime.split_backward`). The kernel
counts are torch's operators, a fused one (addmm, the flash kernel) once. Where the profile
measured torch's flash call (`sim.hardware.attention_table`), the core takes the measured
call's time, its own kernels in it (`sim.cost.attention`): on this project's CPU 0.7 to 7
times what the kernels above give it.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.hardware.profile import DeviceProfile, resolve
from sim.hardware.kernels import elementwise_time, gemm_time, precision_bytes
from sim.hardware.network import collective_time, links_of
from sim.model.transformer import Transformer, check_recompute

from . import fp8
from .attention import SDPA_INSIDE, fused_attention_times, kernel_attention_times, measured_attention_times
from .block_fit import block_in_step, in_step_fits
from .context import context_attention
from .moe import dense_width, routed_kernels, routed_times
from .shapes import attention_shapes, gemm_products, width_ratios
from .slice import Slice

__all__ = ["LayerTimes", "Slice", "gemm_shapes", "gemm_products", "check_timed", "layer_times", "measured_apply",
           "pass_kernels"]

# (name, bytes per element of the tensor it works on, which tensor) per layer, forward and
# backward. Tensors: "sbh" (a hidden state), "sbf" (an MLP activation), "as2b" (the attention
# scores of all heads). The dropout ones are left out for arch="llama", which has none. The
# MLP's activation (_MLP), the rotary embedding (_ROTARY) and the unfused attention core
# (_CORE: softmax and its dropout) are added by `_lists` as the model has them.
_FORWARD = {
    "gpt": [("context_transpose", 4, "sbh/t"), ("layernorm", 4, "sbh"), ("bias_dropout_add", 7, "sbh"),
            ("layernorm", 4, "sbh"), ("bias_dropout_add", 7, "sbh")],
    "llama": [("rmsnorm", 4, "sbh"), ("residual_add", 6, "sbh"), ("rmsnorm", 4, "sbh"),
              ("residual_add", 6, "sbh"), ("context_transpose", 4, "sbh/t")],
}
_BACKWARD = {
    "gpt": [("context_transpose", 4, "sbh/t"), ("bias_grad", 2, "sbqkv"), ("bias_grad", 2, "sbh"),
            ("bias_grad", 2, "sbf"), ("bias_grad", 2, "sbh"), ("layernorm", 6, "sbh"), ("layernorm", 6, "sbh"), ("dropout_add", 5, "sbh"),
            ("dropout_add", 5, "sbh"), ("residual_grad", 6, "sbh"), ("residual_grad", 6, "sbh")],
    "llama": [("rmsnorm", 6, "sbh"), ("rmsnorm", 6, "sbh"), ("residual_grad", 6, "sbh"),
              ("residual_grad", 6, "sbh"), ("context_transpose", 4, "sbh/t")],
}
# The MLP's activation, forward and backward: GeLU (Megatron-LM's bias-GeLU with biases) and
# squared ReLU read their sbf input and write their output (and the backward reads the input
# and output gradient, writes the input gradient); SwiGLU reads its two sbf inputs.
_MLP = {"gelu": ((4, "sbf"), (6, "sbf")), "squared-relu": ((4, "sbf"), (6, "sbf")), "swiglu": ((6, "sbf"), (10, "sbf"))}
_ROTARY = ("rotary", 4, "sbqk")  # on Q and K, each way
_CORE = {"gpt": ([("softmax", 4, "as2b"), ("attention_dropout", 5, "as2b")],
                 [("softmax", 6, "as2b"), ("attention_dropout", 5, "as2b")]),
         "llama": ([("softmax", 4, "as2b")], [("softmax", 6, "as2b")])}
_ATTENTION_CORE = ("softmax", "attention_dropout")  # recomputed by "selective", with the scores and values
# kernels="torch" (arch "gpt"): forward, input-gradient pass I and weight-gradient pass W.
# Tensors as above, and "params" (the layer's parameters: each gradient added into `.grad`).
_TORCH = {
    "F": [("layernorm", 4, "sbh"), ("bias", 2, "sbqkv"), ("attention_exp", 0, "as2b"), ("bias", 2, "sbh"),
          ("residual_add", 6, "sbh"), ("layernorm", 4, "sbh"), ("bias", 2, "sbf"), ("gelu_erf", 4, "sbf"),
          ("bias", 2, "sbh"), ("residual_add", 6, "sbh")],
    "I": [("gelu_erf_backward", 6, "sbf"), ("layernorm", 6, "sbh"), ("residual_grad", 6, "sbh"),
          ("attention_grad_fill", 2, "sbqkv"), ("attention_delta", 4, "sbh/t"), ("attention_exp", 0, "as2b"),
          ("qkv_grad_cat", 4, "sbqkv"), ("layernorm", 6, "sbh"), ("residual_grad", 6, "sbh")],
    "W": [("bias_grad", 2, "sbh"), ("bias_grad", 2, "sbf"), ("layernorm_weight_grad", 4, "sbh"),
          ("bias_grad", 2, "sbh"), ("bias_grad", 2, "sbqkv"), ("layernorm_weight_grad", 4, "sbh"),
          ("grad_accumulate", 6, "params")],
}
_TORCH_CORE = ("attention_exp",)  # the flash forward's own kernel, recomputed by "selective" with its matmuls
_INSIDE = {"bias", "attention_exp", "attention_grad_fill", "attention_delta", "layernorm_weight_grad"}  # no op of their own
# grad_accumulate: one add_ per parameter tensor (2 LayerNorms' gain and bias, 4 linear layers' weight
# and bias); FP8's casts: one kernel, two under current scaling (the amax, then the cast)
_OPS = {"grad_accumulate": 12, **fp8.KERNELS_PER_CAST}
# The memory-bound class of each kernel (`sim.profile.MEMORY_CLASSES`); the rest are "elementwise".
_CLASS = {"layernorm": "norm", "rmsnorm": "norm", "softmax": "softmax", "context_transpose": "copy",
          "bias": "copy", "attention_grad_fill": "copy", "qkv_grad_cat": "copy", "layernorm_weight_grad": "norm"}
# The compute-bound class (`sim.profile.COMPUTE_CLASSES`) of the kernels that evaluate a
# transcendental function per element of their tensor.
_COMPUTE = {"gelu_erf": "gelu", "gelu_erf_backward": "gelu_backward", "attention_exp": "exp"}


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one GPU spends on one layer for one micro-batch, by pass, and the time of F + B
    by part (matmuls, memory-bound kernels, collectives as they add to the time)."""
    forward: float          # F
    backward: float         # B: I and W at once, the backward all-reduces under the weight-gradient matmuls
    backward_input: float   # I of a split backward, recompute included
    backward_weight: float  # W of a split backward: the weight-gradient matmuls
    recompute: float        # the part of B and I that recomputes the forward
    parts: dict             # of F + B: {"gemm": s, "memory": s, "collectives": s}
    kernels: dict           # kernels launched per pass, {"F", "B", "I", "W"}: the host's launch floor
    a2a_forward: float = 0.0   # a MoE layer's expert all-to-alls in F (dispatch, combine), outside `forward`
    a2a_backward: float = 0.0  # and in B or I (their gradients; with full recompute F's again), outside both


def gemm_shapes(m: Transformer, x: Slice, ffn: int | None = None) -> dict[str, tuple[int, int, int, int]]:
    """Forward matmuls of one layer on one GPU as (m, n, k, batch), M = bs/cp tokens: the
    attention's (`sim.cost.shapes.attention_shapes`: QKV or MLA's projections, the scores, the
    values, the output projection) and the MLP's, of width `ffn` (the model's by default; a MoE
    layer's shared experts, `sim.cost.moe.dense_width`; none where 0)."""
    f, t, tokens, h = m.ffn if ffn is None else ffn, x.tp, x.tokens(m), m.hidden
    out = attention_shapes(m, x)
    if f:
        out.update(mlp_in=(tokens, (m.mlp_matrices - 1) * f // t, h, 1), mlp_out=(tokens, h, f // t, 1))
    return out


def _kernels_time(m: Transformer, dev: DeviceProfile, x: Slice, kernels, only=None, ffn: int | None = None) -> float:
    """Seconds of the memory- and compute-bound `kernels` (the `only` ones if given) on one GPU,
    the MLP `ffn` wide (the model's by default)."""
    sb, h, t, w = x.tokens(m), m.hidden, x.tp, width_ratios(m)  # s b: this GPU's tokens, s/cp of the sequence
    scale = precision_bytes(x.activation_precision) / 2  # the table is for 16-bit elements
    size = {"sbh": sb * h / (t if x.sequence_parallel else 1), "sbf": sb * (m.ffn if ffn is None else ffn) / t,
            "sbh/t": sb * h * w["out"] / t, "sbqkv": sb * h * w["qkv"] / t,
            "as2b": m.heads * sb * m.seq / t, "sbqk": sb * h * w["rope"] / t,
            "latent": sb * h * w["latent"] / (t if x.sequence_parallel else 1),
            "params": m.params().per_layer / t}
    return sum(elementwise_time(dev, per * size[tensor] * scale, _CLASS.get(name, "elementwise"), size[tensor],
                                _COMPUTE.get(name))
               for name, per, tensor in kernels if only is None or name in only)


def _count(kernels, only=None) -> int:
    return sum(_OPS.get(name, 1) for name, _, _ in kernels if (only is None or name in only) and name not in _INSIDE)


def _lists(m: Transformer, x: Slice, scaling: str = "delayed", measured: bool = False) -> dict:
    """The layer's memory- and compute-bound kernels by pass (F, I, W), the attention core's,
    whether its attention is one fused kernel, and the matmuls its backward adds: Megatron-LM's
    or torch's (see the module's docstring); under FP8 with Transformer Engine's casts
    (`sim.cost.fp8.cast_kernels`, of the profile's `scaling`); `measured`: torch's flash call is
    timed as the profile measured it (`sim.cost.attention`), without its own kernels."""
    if x.precision == "fp8":
        if m.kernels != "megatron":
            raise ValueError("precision 'fp8' is Transformer Engine's under Megatron-LM: kernels='megatron' only")
        k, casts = _lists(m, Slice(x.micro_batch, x.tp, x.sequence_parallel)), fp8.cast_kernels(m, scaling)
        return {**k, "F": k["F"] + casts["F"], "I": k["I"] + casts["I"]}
    if m.kernels == "megatron":
        (f_mlp, f_t), (b_mlp, b_t) = _MLP[m.mlp]
        act = "bias_gelu" if (m.mlp, m.arch) == ("gelu", "gpt") else m.mlp.replace("-", "_")
        f = _FORWARD[m.arch] + [(act, f_mlp, f_t)] + [_ROTARY] * (m.positions == "rotary")
        b = _BACKWARD[m.arch] + [(act.removeprefix("bias_"), b_mlp, b_t)] + [_ROTARY] * (m.positions == "rotary")
        fused = m.attention == "flash"
        if m.mla is not None:  # the two latents' RMSNorms (Megatron-Core's q_layernorm, kv_layernorm)
            f, b = f + [("rmsnorm", 4, "latent")], b + [("rmsnorm", 6, "latent")]
        if not fused:
            f, b = f + _CORE[m.arch][0], b + _CORE[m.arch][1]
        return {"F": f, "I": b, "W": [], "core": _ATTENTION_CORE, "rescore": 0, "fused": fused}
    if (m.arch, m.attention, m.dropout, m.mlp, m.positions) != ("gpt", "flash", False, "gelu", "learned"):
        raise ValueError(f"kernels='torch' lists the kernels of exec's GPT (arch 'gpt', flash attention, no dropout); "
                         f"got arch {m.arch!r}, attention {m.attention!r}, dropout {m.dropout}, mlp {m.mlp!r}, "
                         f"positions {m.positions!r}")
    lists = {**_TORCH, "core": _TORCH_CORE, "rescore": 1, "fused": True}
    if measured:  # the profile measured torch's flash call: its own kernels are in its time
        lists |= {p: [k for k in _TORCH[p] if k[0] not in SDPA_INSIDE] for p in _TORCH} | {"core": ()}
    return lists


def check_timed(m: Transformer, moe_layers: bool = False) -> None:
    """ValueError, one line, for a model whose layers a caller would time wrongly: with
    `moe_layers` False (a caller that times every layer as a dense one: the planner, until it
    sums a stage's MoE layers) a model with experts; with it, a MoE layer under torch's kernels
    (`sim.cost.moe` times Megatron-Core's). MLA and any head width are timed (`sim.cost.shapes`)."""
    if m.experts is not None and not moe_layers:
        raise ValueError(f"expert parallelism is not modelled yet: issue 33 item 2 (the model has {m.experts} "
                         f"experts; sim.cost.layer.layer_times(..., moe=True) times its MoE layers, the planner "
                         f"does not sum them yet)")


def layer_times(m: Transformer, dev: DeviceProfile | str, x: Slice, recompute: str = "none",
                tp_overlap: bool = True, moe: bool = False) -> LayerTimes:
    """The times of one layer's passes on one device (see the module's docstring), under the
    device profile `dev`; `tp_overlap`: B hides its tensor-parallel collectives under the
    weight-gradient matmuls; `moe`: one of the model's MoE layers (`Transformer.moe_layers`, the
    last ones), its MLP the experts' (`sim.cost.moe`: the shared experts as the MLP here, the
    routed part there, its all-to-alls in `a2a_forward` and `a2a_backward`), else a dense one
    (the first `dense_layers`, or every layer of a dense model). Times are device times; the
    host's launch floor over a whole stage's pass is `sim.estimate`'s (from `kernels`). Where the
    profile measured blocks (`sim.hardware.layer_table`) and they stand for this model
    (`measured_apply`): this block's own row, else the kernel model run as a step runs it
    (`sim.cost.block_fit`)."""
    if moe and m.experts is None:
        raise ValueError("layer_times: moe=True on a dense model (experts=None)")
    check_recompute(recompute)
    dev = resolve(dev)
    lt = kernel_layer_times(m, dev, x, recompute, tp_overlap, moe)
    if moe or not measured_apply(m, x):
        return lt
    row = dev.layers.block(x.precision, m.hidden, m.heads, m.ffn, m.seq, x.micro_batch, recompute) \
        or block_in_step(m, dev, x, recompute, lt, kernel_layer_times)
    return lt if row is None else _as_measured(row, lt)


def block_fits(m: Transformer, dev: DeviceProfile | str, precision: str = "fp32") -> dict:
    """{pass: `sim.cost.block_fit.InStep`}: how the profile's measured blocks say this model's
    kernels run inside a step, where the profile measured none of its shape; {} where it has
    no measured block of `precision`."""
    return in_step_fits(m, resolve(dev), Slice(1, precision=precision), kernel_layer_times)


def kernel_layer_times(m: Transformer, dev: DeviceProfile, x: Slice, recompute: str = "none",
                       tp_overlap: bool = True, moe: bool = False) -> LayerTimes:
    """`layer_times` from the kernel model alone: each kernel as the profile timed it, the
    measured blocks left aside."""
    ffn = dense_width(m) if moe else m.ffn
    routed = routed_times(m, dev, x) if moe else None
    measured = measured_attention_times(m, dev, x)
    shapes, k = gemm_shapes(m, x, ffn), _lists(m, x, dev.fp8_scaling, measured is not None)
    products = {n: gemm_products(*s) for n, s in shapes.items()}  # forward, input and weight gradient
    fwd, dx, dw = ({n: _gemm_time(dev, x, n, q[i]) for n, q in products.items()} for i in range(3))
    weightless = _WEIGHTLESS
    comm_f, comm_i, hidden = _collectives(m, dev, x, dx, dw)
    hidden = hidden if tp_overlap else 0.0
    # the attention core's matmuls (scores, values) in F and in I, as batched GEMMs: Megatron-LM's
    # unfused core, torch's flash kernel where the profile did not measure it, and a fused kernel
    # on a profile without an attention efficiency (the whole s^2, no causal saving); else the
    # measured call, or one fused kernel at that efficiency (sim.cost.attention)
    core_f = fwd["scores"] + fwd["values"]
    core_i = sum(dx[n] + dw[n] for n in weightless) + k["rescore"] * fwd["scores"]
    if measured is not None:  # torch's flash call as the profile measured it
        core_f, core_i = measured
    elif k["fused"] and m.kernels == "megatron" and dev.attention_efficiency is not None:
        core_f, core_i = fused_attention_times(m, dev, x)
    elif k["fused"] and m.kernels == "megatron" and (published := kernel_attention_times(m, dev, x)) is not None:
        core_f, core_i = published  # the stack's kernel at its published rates
    cp_f, cp_i = context_attention(m, dev, x, core_f, core_i)
    weighted = [n for n in fwd if n not in weightless]
    f = {"gemm": sum(fwd[n] for n in weighted) + core_f, "memory": _kernels_time(m, dev, x, k["F"], ffn=ffn),
         "collectives": comm_f + cp_f}
    core = {"gemm": core_f, "collectives": cp_f, "memory": _kernels_time(m, dev, x, k["F"], k["core"])}
    i = {"gemm": sum(dx[n] for n in weighted) + core_i, "memory": _kernels_time(m, dev, x, k["I"], ffn=ffn),
         "collectives": comm_i + cp_i}
    w_gemm, w_memory = sum(v for n, v in dw.items() if n not in weightless), _kernels_time(m, dev, x, k["W"], ffn=ffn)
    if routed is not None:
        f, i = _plus(f, routed.forward), _plus(i, routed.backward_input)
        w_gemm += routed.backward_weight
    redo = {"none": dict.fromkeys(f, 0.0), "selective": core, "full": f}[recompute]
    w = w_gemm + w_memory
    w_redo = sum(f.values()) if recompute == "full" and m.kernels == "torch" else 0.0  # W's own recompute
    parts = {n: f[n] + redo[n] + i[n] for n in f}
    parts["gemm"] += w_gemm
    parts["memory"] += w_memory
    parts["collectives"] -= hidden
    backward_input = sum(redo.values()) + sum(i.values())
    n = pass_kernels(m, x, recompute, dev.fp8_scaling, moe)
    a2a = 0.0 if routed is None else routed.all_to_all
    lt = LayerTimes(forward=sum(f.values()), backward=backward_input + w - hidden,
                    backward_input=backward_input, backward_weight=w + w_redo, recompute=sum(redo.values()),
                    parts=parts, kernels=n, a2a_forward=a2a, a2a_backward=a2a * (1 + (recompute == "full")))
    return lt


def _plus(a: dict, b: dict) -> dict:
    return {n: a[n] + b[n] for n in a}


_WEIGHTLESS = ("scores", "values")  # both their gradients are input gradients (Qi et al. 2024, Table 1)


def _gemm_time(dev: DeviceProfile, x: Slice, name: str, product: tuple) -> float:
    """Seconds of one of the layer's products: a Linear's in FP8 under "fp8" (`sim.cost.fp8`), else
    at the activations' precision."""
    if x.precision == "fp8" and name not in _WEIGHTLESS:
        return fp8.linear_gemm_time(dev, *product)
    return gemm_time(dev, x.activation_precision, *product)


def _as_measured(row, lt: LayerTimes) -> LayerTimes:
    """The block as the profile measured it inside a step (`sim.hardware.layer_table`: exec's
    GPT block, torch's kernels, no tensor parallelism), or as `sim.cost.shapes` fits it there:
    `row`'s F, B, I, W. They include the host's cost of each kernel (no launch floor on top:
    no kernels counted); the recompute and the parts keep the kernel model `lt`'s shares."""
    total = sum(lt.parts.values())
    return LayerTimes(forward=row["F"], backward=row["B"], backward_input=row["I"], backward_weight=row["W"],
                      recompute=lt.recompute * row["F"] / lt.forward,
                      parts={k: v * (row["F"] + row["B"]) / total for k, v in lt.parts.items()},
                      kernels=dict.fromkeys(lt.kernels, 0))


def measured_apply(m: Transformer, x: Slice) -> bool:
    """Whether a profile's measured blocks and ends (`sim.hardware.layer_table`) can stand for
    this model's: exec's GPT (torch's kernels) without tensor parallelism."""
    return x.tp == 1 and x.cp == 1 and m.kernels == "torch"


def pass_kernels(m: Transformer, x: Slice, recompute: str = "none", scaling: str = "delayed",
                 moe: bool = False) -> dict[str, int]:
    """Kernels one layer launches per pass (F, B, I, W): the matmuls, the listed kernels (FP8's
    casts of `scaling` among them) and the tensor-parallel collectives; fused (flash) attention
    is one kernel each way; `moe`: a MoE layer's, with its routed part's (`sim.cost.moe`)."""
    shapes = gemm_shapes(m, x, dense_width(m) if moe else None)
    k, gemms, weightless = _lists(m, x, scaling), len(shapes), 2
    sublayers = 1 + ("mlp_in" in shapes)  # a MoE layer without shared experts has no MLP collectives
    collectives = sublayers if not x.sequence_parallel else 2 * sublayers  # per pass: all-reduces, or gathers and scatters
    flash = gemms - weightless + 1 if k["fused"] else gemms  # fused: the linear layers and one attention kernel
    routed = routed_kernels(m, x, scaling) if moe else {"F": 0, "I": 0, "W": 0}
    n = {"F": flash + _count(k["F"]) + collectives * (x.tp > 1) + routed["F"],
         "W": gemms - weightless + _count(k["W"]) + routed["W"]}
    core = 1 if k["fused"] else weightless + _count(k["F"], k["core"])
    n_redo = {"none": 0, "selective": core, "full": n["F"]}[recompute]
    n_i = flash if k["fused"] else gemms + weightless
    n["I"] = n_redo + n_i + _count(k["I"]) + (collectives + sublayers * x.sequence_parallel) * (x.tp > 1) + routed["I"]
    context = (x.cp - 1 if x.cp_comm == "p2p" else 2) * (x.cp > 1)  # more attention steps, or the all-to-alls
    n["F"], n["I"] = n["F"] + context, n["I"] + context
    n["B"] = n["I"] + n["W"]
    if recompute == "full" and k["rescore"]:
        n["W"] += n["F"]
    return n


def _collectives(m: Transformer, dev: DeviceProfile, x: Slice, dx: dict, dw: dict) -> tuple[float, float, float]:
    """Tensor-parallel collectives of one layer: their time in F, in I, and how much of I's a
    full backward hides under the weight-gradient matmuls. Each moves a 2bsh-byte buffer.

    Without sequence parallelism: an all-reduce after each row-parallel matmul in F, and one
    of each column-parallel matmul's input gradient in the backward (Shoeybi et al. 2019,
    Fig. 3), which B runs under that matmul's weight gradient. With it (Megatron-LM's
    sequence-parallel linear layers): F all-gathers each column-parallel input and
    reduce-scatters each row-parallel output; the backward all-gathers the row-parallel
    output gradients, all-gathers each column-parallel input again for its weight gradient
    (under its input-gradient matmul) and reduce-scatters its input gradient (under its
    weight-gradient matmul in B). Under FP8 the all-gathers move FP8 and the rest BF16
    (`sim.cost.fp8`)."""
    buf = x.tokens(m) * m.hidden * precision_bytes(x.activation_precision)
    gathered = buf * fp8.GATHER_BYTES / fp8.REDUCE_BYTES if x.precision == "fp8" else buf
    column = [k for k in ("qkv", "kv_up", "mlp_in") if k in dw]  # one a sublayer (MLA: its up-projection)
    n = len(column)  # 1 where a MoE layer has no shared experts: its routed part has none of these
    links, group = links_of(dev), x.tensor_group
    if not x.sequence_parallel:
        ar = collective_time(links, "all_reduce", buf, group)
        return n * ar, n * ar, sum(min(ar, dw[k]) for k in column)
    ag = collective_time(links, "all_gather", gathered, group)
    rs = collective_time(links, "reduce_scatter", buf, group)
    comm_i = n * ag + sum(max(0.0, ag - dx[k]) + rs for k in column)
    return n * (ag + rs), comm_i, sum(min(rs, dw[k]) for k in column)
