"""A decoder-only transformer as the planner sees it: parameters, FLOPs and activation bytes.

Every count is a published closed form (cited where it is used) written as a sum of named
parts, so that the tests can check the parts against the closed forms:

    >>> m = Transformer(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)  # GPT-3 175B
    >>> round(m.params().total / 1e9, 1)
    174.6
    >>> m.flops_per_iteration(batch=1, recompute="full") / m.flops_per_iteration(batch=1) > 1.3
    True

Symbols as in Narayanan et al. 2021 (SC'21) and Korthikanti et al. 2022: l layers, h hidden,
a heads, s sequence, V vocabulary, b (or B) micro-batch (or batch), t tensor-parallel size.
Activations are 16-bit (2 bytes an element) and dropout masks 1 byte, as Korthikanti et al.
2022, Sec. 4.1 assume, unless a `precision` says otherwise.

How the layer is implemented changes what its backward keeps and which kernels it runs; the
defaults are Megatron-LM's GPT as the papers count it. `attention`: "unfused" (the scores are
materialised: softmax output and dropout kept, as2b elements each; Korthikanti et al. 2022,
Sec. 4.1) or "flash" (Dao et al. 2022, Alg. 2 and 4: the kernel keeps only its per-row
log-sum-exp in fp32 and recomputes the scores in its backward); with kernels="torch",
"flash" is torch's fused SDPA kernel (CPU flash) and "unfused" its math backend, which
torch falls back to (docs/rules.md, rule 17: what each keeps, measured). `kernels`: "megatron" (its
fused kernels; the paper's count, which leaves out anything smaller than an sbh tensor) or
"torch" (torch's eager modules as `exec.models` builds them: LayerNorm keeps its fp32 mean and
reciprocal deviation per token, the embedding its int64 token ids, the loss its log-softmax
and its int64 targets). `mlp`, `positions`, `dropout` and `tied` default to the arch's.

A mixture of experts (`experts=E`, `top_k`, `expert_ffn`, `shared_experts`, `dense_layers`,
`load_imbalance`, `capacity_factor`: `sim.model.moe`) makes every layer after the first
`dense_layers` a MoE layer; `mla=` (`sim.model.attention.MLA`) makes the attention
DeepSeek's multi-head latent attention; `head_dim` is a head's width where it is not
hidden/heads (Qwen3, GPT-OSS). Dense models leave them out and count exactly as before.
"""
from __future__ import annotations

from dataclasses import dataclass

from .attention import MLA, check_mla
from .moe import Experts, moe_fields
from .params import Params

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("unfused", "flash")
KERNELS = ("megatron", "torch")
# bytes of an element of an activation (the planner's precisions; sim.hardware.kernels has the same)
_ELEMENT = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
_FP32, _INT64 = 4, 8  # norm statistics and flash's log-sum-exp are fp32; token ids and targets int64

# What differs between the two families of presets. "gpt": GPT-2/3 and Megatron-LM's GPT
# (Radford et al. 2019; Brown et al. 2020; Narayanan et al. 2021): biases, LayerNorm (gain and
# bias), learned positions, GeLU MLP of two matrices, dropout, output layer tied to the input
# embedding. "llama": Touvron et al. 2023 (Llama 1, Sec. 2.2; Llama 2, Sec. 2.2): no biases,
# RMSNorm (gain only), rotary positions (no parameters), SwiGLU MLP of three matrices, no
# dropout, untied output layer. norm_stats: the fp32 numbers per token a norm keeps for its
# backward (LayerNorm: mean and 1/std; RMSNorm: 1/rms; torch's native_layer_norm, _fused_rms_norm).
# `arch` sets these as defaults; `mlp`, `positions`, `dropout` and `tied` can each be given apart.
ARCHS = {
    "gpt": dict(bias=True, norm_params=2, positions="learned", mlp="gelu", dropout=True, tied=True, norm_stats=2),
    "llama": dict(bias=False, norm_params=1, positions="rotary", mlp="swiglu", dropout=False, tied=False,
                  norm_stats=1),
}
# The MLP's matrices: "gelu" (Hendrycks and Gimpel 2016; GPT) and "squared-relu" (So et al. 2021,
# Primer; Nemotron-4, Parmar et al. 2024, Sec. 2) an input and an output matrix; "swiglu"
# (Shazeer 2020; Llama) a gate and an up matrix, their product into the output matrix.
MLP_MATRICES = {"gelu": 2, "swiglu": 3, "squared-relu": 2}
POSITIONS = ("learned", "rotary")  # learned: an s x h table (GPT); rotary: none (Su et al. 2021)
MOE_FIELDS = ("top_k", "expert_ffn", "shared_experts", "dense_layers", "load_imbalance", "capacity_factor")

# Forward matmuls that multiply two activations (no weights): their backward is all input
# gradient, and twice their forward (Qi et al. 2024, Table 1: B = sbh(24h + 8s), W = 24sbh^2).
WEIGHTLESS = ("scores", "values")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Transformer: {name} must be a positive int, got {value!r}")


def _element_bytes(precision: str) -> int:
    if precision not in _ELEMENT:
        raise ValueError(f"precision must be one of {', '.join(_ELEMENT)}; got {precision!r}")
    return _ELEMENT[precision]


def check_recompute(recompute: str) -> str:
    """`recompute` if it is a known mode (RECOMPUTE), else ValueError naming them."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {recompute!r}")
    return recompute


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer: `layers` blocks of attention and MLP of width `hidden`."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int | None = None        # MLP width; 4*hidden by default (Vaswani et al. 2017)
    kv_heads: int | None = None   # grouped-query attention (Ainslie et al. 2023); heads by default
    arch: str = "gpt"             # "gpt" or "llama": see ARCHS
    attention: str = "unfused"    # "unfused" or "flash": see the module's docstring
    dropout: bool | None = None   # the arch's by default
    tied: bool | None = None      # output layer tied to the input embedding; the arch's by default
    kernels: str = "megatron"     # "megatron" or "torch": see the module's docstring
    mlp: str | None = None        # "gelu", "swiglu" or "squared-relu" (MLP_MATRICES); the arch's by default
    positions: str | None = None  # "learned" or "rotary" (POSITIONS); the arch's by default
    head_dim: int | None = None   # a head's width; hidden/heads by default
    mla: MLA | None = None        # multi-head latent attention (sim.model.attention); None: MHA/GQA
    experts: int | None = None    # routed experts E of a mixture of experts (sim.model.moe); None: dense
    top_k: int | None = None      # experts a token is routed to; 1 by default
    expert_ffn: int | None = None  # one expert's MLP width; ffn by default
    shared_experts: int | None = None  # experts every token passes through; 0 by default
    dense_layers: int | None = None    # the first layers, with a dense MLP of width ffn; 0 by default
    load_imbalance: float | None = None  # busiest expert's tokens over the mean; 1 (balanced) by default
    capacity_factor: float | None = None  # drop tokens beyond this times the mean; None: drop none

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            _positive_int(name, getattr(self, name))
        if self.ffn is None:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        _positive_int("ffn", self.ffn)
        _positive_int("kv_heads", self.kv_heads)
        if self.hidden % self.heads:
            raise ValueError(f"Transformer: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"Transformer: heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.arch not in ARCHS:
            raise ValueError(f"Transformer: arch must be one of {', '.join(ARCHS)}; got {self.arch!r}")
        for name in ("mlp", "positions"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, ARCHS[self.arch][name])
        for name, allowed in (("attention", ATTENTION), ("kernels", KERNELS), ("mlp", tuple(MLP_MATRICES)),
                              ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Transformer: {name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        for name in ("dropout", "tied"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, ARCHS[self.arch][name])
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Transformer: {name} must be True, False or None; got {getattr(self, name)!r}")
        if self.head_dim is not None:
            _positive_int("head_dim", self.head_dim)
        check_mla(self.mla, self.head_dim, self.kv_heads, self.heads)
        for name, value in moe_fields(self.experts, self.layers, self.ffn,
                                      {n: getattr(self, n) for n in MOE_FIELDS}).items():
            object.__setattr__(self, name, value)
        self.moe  # noqa: B018  its checks
        if (self.mla is not None or self.experts is not None) and self.kernels == "torch":
            raise ValueError("Transformer: kernels='torch' lists exec's GPT; a model with mla or experts "
                             "counts Megatron-Core's kernels (kernels='megatron')")

    @property
    def _a(self) -> dict:
        return ARCHS[self.arch]

    @property
    def moe(self) -> Experts | None:
        """The MoE layers' MLP (`sim.model.moe.Experts`), or None for a dense model."""
        if self.experts is None:
            return None
        return Experts(self.experts, self.top_k, self.expert_ffn, self.shared_experts, self.mlp_matrices,
                       self.load_imbalance, self.capacity_factor, self._a["bias"])

    @property
    def moe_layers(self) -> int:
        """How many layers (the last ones) have a mixture of experts for their MLP: 0 if dense."""
        return 0 if self.experts is None else self.layers - self.dense_layers

    @property
    def mlp_matrices(self) -> int:
        """The MLP's weight matrices: 2 (gelu, squared-relu) or 3 (swiglu)."""
        return MLP_MATRICES[self.mlp]

    @property
    def _head(self) -> int:
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def _q(self) -> float:
        """Q's width as a fraction of h: 1, or heads*head_dim/h where head_dim is given."""
        return self.heads * self._head / self.hidden

    @property
    def _kv(self) -> float:
        """K and V width as a fraction of h: kv_heads/heads (1 without grouped-query attention)."""
        return self.kv_heads * self._head / self.hidden

    def params(self) -> Params:
        """Parameters by part. For arch="gpt", ffn=4h and kv_heads=heads, embedding + layers *
        per_layer is Narayanan et al. 2021, Eq. 2: 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) exactly;
        Eq. 2 leaves out the final LayerNorm (2h) and counts the output layer as tied. A MoE
        layer has the dense layer's attention and norms and the experts' MLP (`sim.model.moe`:
        experts' biases as the arch's, the router's none), MLA its own projections
        (`sim.model.attention`; no bias counted)."""
        h, f, a, q = self.hidden, self.ffn, self._a, self.heads * self._head
        qkv = h * q + 2 * h * self._head * self.kv_heads                # Q: h x q, K and V: h x (kv_heads * head_dim)
        attention = self.mla.params(h, self.heads, a["norm_params"]) if self.mla else qkv + q * h  # and projection
        mlp = (self.mlp_matrices - 1) * h * f + f * h                    # MLP in, MLP out
        attention_biases = (qkv // h + h if a["bias"] else 0) if self.mla is None else 0  # one per output feature
        biases = attention_biases + ((self.mlp_matrices - 1) * f + h if a["bias"] else 0)
        norms = 2 * a["norm_params"] * h                                  # before attention and before the MLP
        embedding = self.vocab * h + (self.seq * h if self.positions == "learned" else 0)
        moe = {}
        if self.moe is not None:
            experts, shared = self.moe.params(h), attention + attention_biases + norms
            moe = dict(moe_layers=self.moe_layers, per_moe_layer=shared + sum(experts.values()),
                       active_per_moe_layer=shared + self.moe.active_params(h))
        return Params(embedding=embedding, per_layer=attention + mlp + biases + norms, layers=self.layers,
                      final_norm=a["norm_params"] * h, output=0 if self.tied else self.vocab * h,
                      tied=self.tied, **moe)

    def layer_flops(self, micro_batch: int, moe: bool = False) -> dict[str, float]:
        """Forward FLOPs of one layer by matmul (2 FLOPs a multiply-add), as Narayanan et al. 2021,
        Appendix, counts them: QKV 6bsh^2, scores 2bs^2h, values 2bs^2h, projection 2bsh^2,
        MLP 16bsh^2; in all 24bsh^2 + 4bs^2h for ffn=4h (Korthikanti et al. 2022 count the same).
        `moe`: a MoE layer, its MLP the experts' (`sim.model.moe.Experts.flops`: router, k routed
        and the shared experts); MLA's attention is `sim.model.attention.MLA.flops`'s."""
        b, s, h, f, q = micro_batch, self.seq, self.hidden, self.ffn, self.heads * self._head
        if self.mla is not None:
            attention = self.mla.flops(b, s, h, self.heads)
        else:
            attention = {"qkv": 2 * b * s * h * h * (self._q + 2 * self._kv), "scores": 2 * b * s * s * q,
                         "values": 2 * b * s * s * q, "projection": 2 * b * s * h * q}
        if moe:
            if self.moe is None:
                raise ValueError("Transformer.layer_flops: moe=True on a dense model (experts=None)")
            return attention | self.moe.flops(b * s, h)
        return attention | {"mlp_in": 2 * b * s * h * f * (self.mlp_matrices - 1), "mlp_out": 2 * b * s * h * f}

    def pass_flops(self, micro_batch: int, moe: bool = False) -> dict[str, float]:
        """FLOPs of one layer's F, I (input gradient: B of Qi et al. 2024) and W (weight gradient).
        Each weight matmul Y = XW costs as much again for dX (in I) and for dW (in W); the score
        and values matmuls multiply two activations, so both their gradients are input gradients
        (in I) and W has none of them. Qi et al. 2024, Table 1: F = sbh(24h + 4s),
        B = sbh(24h + 8s), W = sbh(24h); F + I + W = 3F. `moe`: a MoE layer's."""
        parts = self.layer_flops(micro_batch, moe)
        weighted = sum(v for k, v in parts.items() if k not in WEIGHTLESS)
        weightless = sum(parts[k] for k in WEIGHTLESS)
        return {"F": weighted + weightless, "I": weighted + 2 * weightless, "W": weighted}

    def logit_flops(self, micro_batch: int) -> float:
        """Forward FLOPs of the output layer: 2bshV (Narayanan et al. 2021, Appendix)."""
        return 2 * micro_batch * self.seq * self.hidden * self.vocab

    def recompute_flops(self, micro_batch: int, recompute: str, moe: bool = False) -> float:
        """FLOPs one layer recomputes before its backward: the whole forward with "full"
        (Narayanan et al. 2021, Appendix: the 4x of Eq. 3); with "selective" the attention core
        only (Korthikanti et al. 2022, Sec. 5 and Appendix A, Eq. 8), whose matmuls are the
        scores and values. `moe`: a MoE layer's."""
        parts = self.layer_flops(micro_batch, moe)
        return {"none": 0.0, "selective": parts["scores"] + parts["values"],
                "full": sum(parts.values())}[check_recompute(recompute)]

    def flops_per_iteration(self, batch: int, recompute: str = "none") -> float:
        """FLOPs of one training iteration over `batch` sequences. "full": Narayanan et al. 2021,
        Eq. 3, 96Bslh^2(1 + s/(6h) + V/(16lh)): layers 4x their forward (forward, backward twice
        the forward, recomputed forward), logit layer 3x (not recomputed). "none": the same
        without the recomputed forward, 72Bslh^2(1 + s/(6h) + V/(12lh)) (Korthikanti et al.
        2022's model FLOPs, the numerator of MFU). With experts, the dense layers and the MoE
        layers (`moe_layers`) each count their own."""
        def per_layer(moe: bool) -> float:
            p = self.pass_flops(batch, moe)
            return p["F"] + p["I"] + p["W"] + self.recompute_flops(batch, recompute, moe)
        n = self.moe_layers
        layers = (self.layers - n) * per_layer(False) + (n * per_layer(True) if n else 0)
        return layers + 3 * self.logit_flops(batch)

    def model_flops_per_token(self, causal: bool = True) -> float:
        """Training FLOPs a token as Megatron-LM's `num_floating_point_operations` (training.py)
        counts them for MFU: 3x the forward of each weight matmul a token uses (k routed and the
        shared experts, not the router; MLA's projections, not its latents' norms), of the logit
        layer and of the attention core, its s^2 halved where `causal`. DeepSeek counts the same
        (docs/planner.md); causal=False is `flops_per_iteration(1) / seq` less the router."""
        def forward(moe: bool) -> float:
            parts = self.layer_flops(1, moe)
            core = sum(parts[k] for k in WEIGHTLESS)
            return sum(parts.values()) - parts.get("router", 0) - core + core * (0.5 if causal else 1)
        n = self.moe_layers
        layers = (self.layers - n) * forward(False) + (n * forward(True) if n else 0)
        return 3 * (layers + self.logit_flops(1)) / self.seq

    def _split(self, replicated: float, split: float, tp: int, sequence_parallel: bool) -> float:
        """Bytes per GPU: `split` is divided over the tp ranks; `replicated` too under sequence
        parallelism (Korthikanti et al. 2022, Sec. 4.2.2), else every rank holds it whole."""
        _positive_int("tp", tp)
        return replicated / (tp if sequence_parallel else 1) + split / tp

    def activation_bytes_per_layer(self, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                                   recompute: str = "none", precision: str = "bf16", moe: bool = False,
                                   ep: int = 1) -> float:
        """Bytes one layer keeps from its forward for its backward, per GPU: Korthikanti et al.
        2022, Table 2; for arch="gpt", ffn=4h: sbh(34 + 5as/h) at tp=1, sbh(10 + 24/t + 5as/(ht))
        with tp, sbh(34/t + 5as/(ht)) with sequence parallelism; selective recompute drops the
        5as/h; full keeps the layer input only, 2sbh. Each activation element takes the bytes
        of `precision` (2 above), a dropout mask 1; attention="flash" keeps a 4-byte log-sum-exp
        per head and token instead of the 5as^2b bytes of scores (selective recompute drops it);
        kernels="torch" adds the norms' fp32 statistics per token (see the module's docstring).
        MLA keeps its latents and its heads' Q, K, V (`sim.model.attention.MLA.activation_elements`).
        `moe`: a MoE layer, whose MLP keeps `moe_activation_bytes` (on the busiest of `ep`
        expert-parallel ranks) instead of the dense MLP's; tp=1 only (expert tensor parallelism
        is issue 33 item 2)."""
        _positive_int("micro_batch", micro_batch)
        if moe and tp != 1:
            raise ValueError(f"Transformer.activation_bytes_per_layer: a MoE layer's bytes are counted at tp=1 "
                             f"(tensor and expert tensor parallelism of experts: issue 33 item 2), got tp={tp}")
        e, sb, a = _element_bytes(precision), self.seq * micro_batch, self._a
        sbh = sb * self.hidden
        if check_recompute(recompute) == "full":
            return e * sbh
        drop = 1 if self.dropout else 0
        stats = 2 * a["norm_stats"] * _FP32 * sb if self.kernels == "torch" else 0
        # Sec. 4.1: two norm inputs, the QKV input and the MLP input (sbh each), two dropout masks
        replicated = 4 * e * sbh + 2 * drop * sbh + stats
        # Q and K, V, projection input; MLP: one sbf tensor per matrix (GeLU input and output;
        # SwiGLU's two inputs and product)
        attention = (2 * self._q + 2 * self._kv) * e * sbh
        if self.mla is not None:
            latents, heads = self.mla.activation_elements(sb, self.heads)
            replicated, attention = replicated + e * latents, e * heads
        split = attention + (0 if moe else e * sb * self.ffn * self.mlp_matrices)
        if recompute == "none":
            split += self._attention_core_bytes(micro_batch, tp, e)
        if moe:
            return self._split(replicated, split, tp, sequence_parallel) + sum(
                self.moe_activation_bytes(micro_batch, ep, precision).values())
        return self._split(replicated, split, tp, sequence_parallel)

    def moe_activation_bytes(self, micro_batch: int, ep: int = 1, precision: str = "bf16") -> dict[str, float]:
        """Bytes a MoE layer's MLP keeps for its backward per micro-batch, on the busiest of `ep`
        expert-parallel ranks, by part: the router's scores and routing map, the permuted
        tokens, the experts' intermediate and gates, the shared experts' intermediate
        (`sim.model.moe.Experts.activation_bytes`: Megatron-Core's alltoall dispatcher, tp = etp = 1)."""
        _positive_int("micro_batch", micro_batch)
        if self.moe is None:
            raise ValueError("Transformer.moe_activation_bytes: a dense model (experts=None) has no MoE layer")
        return self.moe.activation_bytes(self.seq * micro_batch, self.hidden, _element_bytes(precision), ep)

    def _attention_core_bytes(self, micro_batch: int, tp: int, e: int) -> float:
        """What the attention core keeps beyond Q, K, V and its output (docs/rules.md, rule 17),
        `e` bytes an element. flash: the log-sum-exp, fp32, one per head and token. unfused
        (Megatron): the softmax output, its dropout mask and dropout output, as^2b each.
        unfused with kernels="torch" (SDPA's math backend): the softmax output, and copies of
        Q and K scaled by d^-1/4 in place of the QKV output, which stays only where V,
        flattened to (b a, s, d), is a view of it (one sample or one head a rank): 2sbh more
        then."""
        heads_sb, sbh = self.heads * self.seq * micro_batch, self.seq * micro_batch * self.hidden
        if self.attention == "flash":
            return heads_sb * _FP32
        if self.kernels == "torch":
            v_is_a_view = micro_batch == 1 or self.heads == tp
            return heads_sb * self.seq * e + (2 * e * sbh if v_is_a_view else 0)
        drop = 1 if self.dropout else 0
        return heads_sb * self.seq * (e + drop * (1 + e))

    def end_activation_bytes(self, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                             precision: str = "bf16") -> dict[str, float]:
        """Bytes the ends of the model keep per micro-batch, per GPU: "first" (the embedding),
        "last" (final norm, output layer and loss) and "last_w" (what the output layer's W still
        needs after I). kernels="megatron": Korthikanti et al. 2022, Sec. 4.3: the embedding's
        dropout mask (sbh, 1 byte); the final norm's and output layer's inputs (sbh each) and
        the fp32 logits (4sbV/t); W needs its input and the logits' gradient. kernels="torch":
        the embedding keeps its int64 token ids (and a dropout mask if any); the last stage
        the norm's and output layer's inputs, the norm's fp32 statistics, the log-softmax of
        the logits (at `precision`), the int64 targets and the loss's fp32 total weight.
        "first_w": what the first stage's W needs of the embedding's bytes (torch: all; the
        first stage's I has no input gradient to compute, W runs its whole backward); torch's
        "last_w": everything below the output layer's weight node (the two inputs, the statistics)."""
        _positive_int("micro_batch", micro_batch)
        e, sb = _element_bytes(precision), self.seq * micro_batch
        split = tp if sequence_parallel else 1
        sbh, logits = sb * self.hidden / split, sb * self.vocab / tp
        if self.kernels == "megatron":
            return {"first": sbh, "last": 2 * e * sbh + 4 * logits, "first_w": 0.0, "last_w": e * sbh + e * logits}
        stats = self._a["norm_stats"] * _FP32 * sb / split
        first = _INT64 * sb + (sbh if self.dropout else 0.0)
        return {"first": first, "last": 2 * e * sbh + stats + e * logits + _INT64 * sb + _FP32,
                "first_w": first, "last_w": 2 * e * sbh + stats}

    def w_activation_bytes_per_layer(self, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                                     precision: str = "bf16", recompute: str = "none") -> float:
        """Bytes W still needs after I, per GPU: each weight matmul's input and output gradient.
        Qi et al. 2024, Table 1: 32sbh (for arch="gpt", ffn=4h): inputs QKV 2, projection 2,
        MLP 2 + 8 (14sbh) and output gradients QKV 6, projection 2, MLP 8 + 2 (18sbh). Under
        tensor parallelism the inputs of the column-parallel matmuls (QKV, MLP in) and the output
        gradients of the row-parallel ones (projection, MLP out) are whole on every rank, 8sbh,
        unless sequence parallel; the rest, 24sbh, is split: sbh(8 + 24/t), or 32sbh/t with
        sequence parallelism. The same with any recompute: recompute restores them before I.
        Elements of `precision` (16-bit above: 2 bytes). kernels="torch": torch's split backward
        (torch.distributed.pipelining's stage_backward_weight, exec.runtime.split_backward) keeps the
        weight-gradient nodes, and through them every node between them and the input: I frees
        none of the layer's saved tensors, all of `activation_bytes_per_layer` (with
        `recompute`) stays until W (which recomputes them from the layer input if asked); the
        output gradients it keeps are not counted, as exec does not count them. (MLA's: not yet.)"""
        _positive_int("micro_batch", micro_batch)
        if self.mla is not None:
            raise ValueError("Transformer.w_activation_bytes_per_layer: MLA's split backward is not counted yet")
        if self.kernels == "torch":
            return self.activation_bytes_per_layer(micro_batch, tp, sequence_parallel, recompute, precision)
        e = _element_bytes(precision)
        sbh, sbf, m = self.seq * micro_batch * self.hidden, self.seq * micro_batch * self.ffn, self.mlp_matrices
        replicated = 4 * e * sbh
        split = e * ((1 + 2 * self._kv) * sbh + sbh + (m - 1) * sbf + sbf)
        return self._split(replicated, split, tp, sequence_parallel)


def llama_ffn(hidden: int, multiple_of: int, multiplier: float = 1.0) -> int:
    """Llama's MLP width from its code (facebookresearch/llama, model.py, FeedForward):
    2/3 of 4h, times ffn_dim_multiplier, rounded up to a multiple of multiple_of."""
    width = int(multiplier * int(2 * 4 * hidden / 3))
    return multiple_of * -(-width // multiple_of)
