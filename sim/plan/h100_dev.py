"""The H100 development set (sim/plan/data/h100_dev.csv): each measured run as a `sim.estimate` call, or why not.

    >>> from sim.plan import h100_dev
    >>> runs = h100_dev.runs()                  # 169 rows, each expressed or refused
    >>> ok = [r for r in runs if r.reason is None]
    >>> e = h100_dev.estimate_run(ok[0])        # sim.estimate on h100-80gb's default profile  # doctest: +SKIP
    >>> e.step_time, ok[0].step_time            # predicted, measured (seconds)               # doctest: +SKIP

The rows are NVIDIA's DGX Cloud benchmarking recipes (NeMo/Megatron-Core on DGX H100, and JAX
runs), each with its source (sim/plan/data/README.md). A row becomes one `sim.estimate`: the
model from its architecture columns, the layout from its parallel sizes, batch and recompute.
What the rows do not state is NeMo's default for these recipes, the same for every row:
- 8 GPUs a node (the source's DGX H100) and one NIC a GPU;
- attention `"flash"` (Transformer Engine's fused attention, which NeMo runs);
- sequence parallelism wherever tp > 1 (the recipes' `sequence_parallel: true`; stated in six rows);
- Megatron's distributed optimizer with its gradient reduction overlapped (`zero=1`,
  `overlap_grad_reduce=True`: NeMo's `distributed_fused_adam` / `use_distributed_optimizer`);
- recompute "none" where the row leaves it empty;
- the vocabulary padded to a multiple of 128 tp (Megatron's `make_vocab_size_divisible_by`);
- where pp x vp virtual stages outnumber the layers (Llama 3.1 405B's 30-layer proxy at pp 4 x
  vp 8, rows 149 and 154), the embedding and the loss each counted as a layer of the split
  (`split_layout`).
The MLP and positions follow the model's family: GPT-3 as Megatron's GPT (GeLU, learned,
tied), Nemotron-4 squared-ReLU, Llama SwiGLU (both rotary, untied).

The MoE rows (their expert columns in sim/plan/data/h100_dev_moe.csv, `moe_columns`) are
Megatron-Core MoE under NeMo: experts folded onto the ranks with the row's `ep` and expert
tensor parallelism 1 (the sources' configuration tables say "ETP 1"), the alltoall token
dispatcher (`sim.cost.moe`) with balanced routing and no token dropping (`sim.model.moe`'s
defaults: the rows state neither the routing's balance nor a capacity factor).
- Grok-1 (NeMo's grok-1-proxy, `n_layers` of the real 64): hidden, heads, 8 KV heads from the
  row; `n_experts` experts of width `moe_ffn_hidden`, `moe_topk` of them a token, every layer
  MoE, no shared expert; the rest as `grok-1-314b` (three-matrix gated MLP, rotary, RMSNorm,
  tied embeddings: xai-org/grok-1's run.py and model.py). The vocabulary is not stated by the
  source: Grok-1's own 131,072 (run.py), a multiple of 128 tp already.
- DeepSeek-V3: `deepseek-v3-671b` (its MLA ranks, 1 shared expert, the first 3 layers dense:
  the row's `arch_source`, Megatron-Bridge's DeepSeekV3ModelProvider) at the row's sequence,
  without the multi-token-prediction module; the vocabulary padded as the dense rows'.

A row the planner cannot express yet carries its reason (`REASONS`): a stack it does not model
(JAX), FSDP, context parallelism, FP8. cp and FP8 are probed on the planner itself, so a
row becomes expressible once `sim.estimate` takes `cp=`, or `precision="fp8"` on the
H100's default profile.
"""
from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from sim.cost.fp8 import check_fp8
from sim.hardware.kernels import precision_bytes
from sim.hardware.profile import resolve
from sim.model.registry import find_model
from sim.model.layer_layout import parse_layer_layout
from sim.model.transformer import Transformer

from .estimation import LAYOUT_FIELDS, Estimate, estimate

DATA = Path(__file__).with_name("data") / "h100_dev.csv"
MOE_DATA = DATA.with_name("h100_dev_moe.csv")  # the MoE rows' expert columns (sim/plan/data/README.md)
GPU = "h100-80gb"
GPUS_PER_NODE = 8  # DGX H100 (the source: NVIDIA DGX Cloud)
REASONS = {
    "stack": "a stack the planner does not model (JAX: MaxText, PaxML)",
    "fsdp": "FSDP sharding (PyTorch-native stacks): not expressed by this loader yet",
    "layout": "more virtual stages than layers + 2 (pp x vp > layers + E + L): not a split Megatron-Core runs",
    "cp": "context parallelism (cp > 1): sim.estimate has no cp yet (issue 32 item 2)",
    "fp8": "FP8: the default H100 profile has no fp8_efficiency (issue 32 item 3; sim.cost.fp8.check_fp8)",
    "precision": "precision not stated by the source",
}
GROUPS = ("model", "precision", "cp", "release")  # what the benchmark's MAPE is split by
LAYOUT = ("n_layers", "seq_len", "n_gpus", "tp", "pp", "vp", "cp", "dp", "mbs", "gbs", "recompute")  # a pair shares these


@dataclass(frozen=True)
class DevRun:
    """One measured run: its CSV row (strings), and either the model and `sim.estimate`'s
    keywords that express it (`reason` None) or why it cannot be expressed."""
    row: dict
    model: Transformer | None
    keywords: dict
    reason: str | None

    @property
    def row_id(self) -> int:
        return int(self.row["row_id"])

    @property
    def step_time(self) -> float:
        """The measured seconds a step."""
        return float(self.row["step_time_s"])

    def group(self, key: str) -> str:
        """The row's value of a `GROUPS` key (release: the software's name and version)."""
        return release(self.row) if key == "release" else self.row[key]


def read_rows(path: Path = DATA) -> list[dict]:
    """The CSV's rows as dictionaries of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def release(row: dict) -> str:
    """The software release, e.g. 'NeMo 24.12' of 'NeMo 24.12 container (NeMo Framework Launcher)'."""
    return row["software"].split(" container")[0].split(" (")[0]


def planner_takes_cp() -> bool:
    """Whether `sim.estimate` takes context parallelism (`cp=`: a field of its `Layout`)."""
    return "cp" in LAYOUT_FIELDS


def planner_takes_fp8() -> bool:
    """Whether the planner times FP8 (`sim.hardware.kernels.precision_bytes` answers for it) on
    the H100's default profile (`sim.cost.fp8.check_fp8`: it states the share of the FP8 peak
    its FP8 GEMMs reach)."""
    try:
        precision_bytes("fp8")
        check_fp8(resolve(GPU))
    except ValueError:
        return False
    return True


@cache
def moe_columns() -> dict[str, dict]:
    """The MoE rows' expert columns (n_experts, moe_topk, moe_ffn_hidden, arch_source) by row id."""
    return {r["row_id"]: r for r in read_rows(MOE_DATA)}


def refusal(row: dict) -> str | None:
    """The key of `REASONS` that keeps a row from being a `sim.estimate` today, or None."""
    if "JAX" in row["software"]:
        return "stack"
    if "FSDP" in row["dp_sharding"]:
        return "fsdp"
    if int(row["cp"] or 1) > 1 and not planner_takes_cp():
        return "cp"
    if not row["precision"]:
        return "precision"
    if int(row["pp"]) * int(row["vp"] or 1) > int(row["n_layers"]) and split_layout(row) is None:
        return "layout"
    if row["precision"].startswith("fp8") and not planner_takes_fp8():
        return "fp8"
    return None


def model_of(row: dict) -> Transformer:
    """The row's transformer from its architecture columns and its model family (module docstring)."""
    name, tp = row["model"], int(row["tp"])
    if row["moe"] == "1":
        return moe_model_of(row)
    family = (dict(arch="gpt") if name.startswith("GPT") else
              dict(arch="llama", mlp="squared-relu") if name.startswith("Nemotron") else dict(arch="llama"))
    vocab = int(row["vocab"])
    return Transformer(layers=int(row["n_layers"]), hidden=int(row["hidden"]), heads=int(row["n_heads"]),
                       kv_heads=int(row["n_kv_heads"]), ffn=int(row["ffn_hidden"]), seq=int(row["seq_len"]),
                       vocab=vocab + (-vocab) % (128 * tp), attention="flash", **family)


def moe_model_of(row: dict) -> Transformer:
    """A MoE row's transformer (module docstring): Grok-1's proxy from its columns, DeepSeek-V3 its preset's."""
    moe, seq, tp = moe_columns()[row["row_id"]], int(row["seq_len"]), int(row["tp"])
    if row["model"].startswith("DeepSeek-V3"):
        vocab = int(row["vocab"])
        return replace(find_model("deepseek-v3-671b"), seq=seq, vocab=vocab + (-vocab) % (128 * tp))
    if not row["model"].startswith("Grok-1"):
        raise ValueError(f"row {row['row_id']}: no MoE family for {row['model']!r}")
    return replace(find_model("grok-1-314b"), layers=int(row["n_layers"]), hidden=int(row["hidden"]),
                   heads=int(row["n_heads"]), kv_heads=int(row["n_kv_heads"]), seq=seq,
                   experts=int(moe["n_experts"]), top_k=int(moe["moe_topk"]), expert_ffn=int(moe["moe_ffn_hidden"]),
                   ffn=int(row["ffn_hidden"]))


def recompute_of(text: str) -> str:
    """'selective' or 'full' where the row's recompute says so, else 'none'."""
    return next((mode for mode in ("selective", "full") if text.startswith(mode)), "none")


def split_layout(row: dict) -> str | None:
    """Where the row's pp x vp virtual stages outnumber its layers, the split it ran: the
    embedding and the loss counted as a layer each, as Megatron-Core's
    `account_for_embedding_in_pipeline_split` and `account_for_loss_in_pipeline_split` split
    (each adds one to the layers cut evenly over the stages: its `get_transformer_layer_offset`),
    which NeMo's Llama 3.1 405B recipe sets (nemo/collections/llm/recipes/llama31_405b.py,
    `trainer()`; read in erhoo82/NeMo@d5faad47 and ishine/NeMo@c88a0d36). With layers + 2
    stages the first holds the embedding alone and the last the loss alone: 30 layers over
    pp 4 x vp 8 = 32 stages are 'E|(t|)*30L' (`sim.model.layer_layout`). None unless the stages
    are layers + 2 (more stages than layers split evenly only so)."""
    layers, stages = int(row["n_layers"]), int(row["pp"]) * int(row["vp"] or 1)
    if stages != layers + 2:
        return None
    return str(parse_layer_layout("E|" + "t|" * layers + "L").check(int(row["pp"]), layers))


def keywords_of(row: dict) -> dict:
    """`sim.estimate`'s keywords for the row (module docstring: what is NeMo's default)."""
    tp, vp, cp = int(row["tp"]), int(row["vp"] or 1), int(row["cp"] or 1)
    out = dict(tp=tp, pp=int(row["pp"]), dp=int(row["dp"]), micro_batch=int(row["mbs"]),
               global_batch=int(row["gbs"]), gpus_per_node=int(row["gpus_per_node"] or GPUS_PER_NODE),
               schedule="interleaved-1f1b" if vp > 1 else "1f1b", virtual=vp if vp > 1 else None,
               recompute=recompute_of(row["recompute"]), sequence_parallel=tp > 1, zero=1,
               overlap_grad_reduce=True, precision="fp8" if row["precision"].startswith("fp8") else "bf16")
    if cp > 1:
        out["cp"] = cp
    if row["moe"] == "1":
        out["ep"] = int(row["ep"])  # expert_tp 1: sim.estimate's default, the sources' "ETP 1"
    if split_layout(row) is not None:
        out["partition"] = split_layout(row)
    return out


def express(row: dict) -> DevRun:
    """The row as a `DevRun`: expressed, or with the `REASONS` key that refuses it."""
    reason = refusal(row)
    if reason is not None:
        return DevRun(row, None, {}, reason)
    return DevRun(row, model_of(row), keywords_of(row), None)


@cache
def runs() -> tuple[DevRun, ...]:
    """Every row of the development set, expressed or refused."""
    return tuple(express(r) for r in read_rows())


def estimate_run(run: DevRun, gpu=GPU) -> Estimate:
    """`sim.estimate` of an expressed run on `gpu` (a profile, or a name: its default profile)."""
    if run.reason is not None:
        raise ValueError(f"row {run.row_id} is not expressible: {REASONS[run.reason]}")
    return estimate(run.model, gpu, **run.keywords)


def errors(expressed: list[DevRun], gpu=GPU) -> list[float]:
    """Relative step-time errors, (predicted - measured) / measured, of expressed runs."""
    return [estimate_run(r, gpu).step_time / r.step_time - 1 for r in expressed]


def mape(relative_errors: list[float]) -> float:
    """Mean absolute percentage error (as a fraction) of relative errors."""
    return statistics.fmean(abs(e) for e in relative_errors)


def mape_by(some: list[DevRun], relative_errors: list[float], key: str) -> dict[str, tuple[float, int]]:
    """MAPE and row count per value of a `GROUPS` key over `some` runs and their errors, in sorted order."""
    out: dict[str, list[float]] = {}
    for r, e in zip(some, relative_errors):
        out.setdefault(r.group(key), []).append(e)
    return {k: (mape(v), len(v)) for k, v in sorted(out.items())}


def refused_counts(some) -> dict[str, int]:
    """How many of `some` runs each reason leaves out, by `REASONS` key."""
    out: dict[str, int] = {}
    for r in some:
        if r.reason is not None:
            out[r.reason] = out.get(r.reason, 0) + 1
    return out


def pairs(some) -> list[tuple[DevRun, DevRun]]:
    """(BF16 run, FP8 run) pairs among `some`: the same model, release and layout (`LAYOUT`) in
    both precisions, whose step times give FP8's speedup."""
    def key(r: DevRun) -> tuple:
        return (r.row["model"], release(r.row), *(r.row[c] for c in LAYOUT))
    bf16 = {key(r): r for r in some if r.row["precision"] == "bf16"}
    return [(bf16[key(r)], r) for r in some if r.row["precision"].startswith("fp8") and key(r) in bf16]
