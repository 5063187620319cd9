"""Published training measurements the estimate is checked against, and the comparisons.

Each table is the paper's, copied with its source (verified in full-text copies of the papers,
2026-11-22; see docs/planner.md); the settings a table leaves out come from the scripts that
produced it, and are cited where used. Times in seconds (Table 4: milliseconds), throughput
in TFLOP/s per GPU, MFU as a fraction.

    >>> from sim.plan import published
    >>> rows = published.narayanan_table_1()      # one sim.estimate per row (about 2 s in all)
    >>> rows[0]["predicted"], rows[0]["published"], rows[0]["error"]   # doctest: +SKIP

The torch-native development set (sim/plan/data/torch_native_dev.csv: llm-foundry's MPT runs and
torchtitan's December 2024 Llama 3.1 table, on H100s) is read by `torch_native_runs`, each row
as one `sim.estimate` on its stack's profile or the reason it is not expressed yet.

`bench_published.py` (benchmarks/) prints them; tests/sim/plan/test_published.py holds the model to
what it can assert without timing noise. Only public names of `sim` are used, so that the
comparisons follow the estimate as it changes.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .estimation import Estimate, estimate
from sim.hardware.profile import resolve
from sim.hardware.gpus import gpu as gpu_by_name
from sim.cost.layer import Slice, layer_times
from sim.model.sagemaker import GPU as SAGEMAKER_GPU, MODELS as SAGEMAKER, REFERENCES, Reference
from sim.model.registry import find_model
from sim.model.transformer import Transformer

A100 = "a100-80gb"  # both papers: Selene, "8 NVIDIA 80GB A100 GPUs" per node, 312 TFLOP/s 16-bit peak

# Narayanan et al. 2021 (SC'21, arXiv:2104.04473), Table 1: model, t, p, GPUs, batch, TFLOP/s
# per GPU, % of peak. Micro-batch and virtual stages per row (layers / p / layers per virtual
# stage) from NVIDIA/Megatron-LM examples/sc21/run_table_1.sh, whose CONFIG.sh sets --fp16 and
# whose every row uses full (uniform) activation recomputation; None: no interleaving.
NARAYANAN_TABLE_1 = [
    # preset,            t,  p, GPUs, batch, micro, virtual, TFLOP/s, % peak
    ("megatron-1.7b",    1,  1,   32,   512,    16, None, 137, 44),
    ("megatron-3.6b",    2,  1,   64,   512,    16, None, 138, 44),
    ("megatron-7.5b",    4,  1,  128,   512,    16, None, 142, 46),
    ("megatron-18.4b",   8,  1,  256,  1024,     8, None, 135, 43),
    ("megatron-39.1b",   8,  2,  512,  1536,     4, None, 138, 44),
    ("megatron-76.1b",   8,  4, 1024,  1792,     2,    3, 140, 45),
    ("megatron-145.6b",  8,  8, 1536,  2304,     2,    2, 148, 47),
    ("megatron-310.1b",  8, 16, 1920,  2160,     1,    2, 155, 50),
    ("megatron-529.6b",  8, 35, 2520,  2520,     1,    3, 163, 52),
    ("megatron-1t",      8, 64, 3072,  3072,     1, None, 163, 52),
]
NARAYANAN_PRECISION = "fp16"  # examples/sc21/CONFIG.sh: --fp16 --loss-scale 8192
# The SC'21 runs (container nvcr.io/nvidia/pytorch:20.12-py3, examples/sc21/SRUN.sh) predate
# Megatron-LM's asynchronous tensor-parallel all-reduce under the weight-gradient matmul: the
# paper's Sec. 3.3 has the two backward all-reduces with no overlap, and Korthikanti et al. 2022,
# Sec. 6.2, brings the overlap in as their optimization. So Table 1 runs with tp_overlap=False.
NARAYANAN_TP_OVERLAP = False

# Korthikanti et al. 2022 (arXiv:2205.05198), Table 4: one layer of the 22B model (Table 3:
# t=8, micro-batch 4, s=2048), forward and backward in ms, for the five techniques:
# (name, sequence_parallel, recompute, forward, backward).
KORTHIKANTI_TABLE_4 = [
    ("baseline, no recompute", False, "none", 7.7, 11.9),
    ("sequence parallelism", True, "none", 7.2, 11.8),
    ("baseline, full recompute", False, "full", 7.7, 19.5),
    ("selective recompute", False, "selective", 7.7, 13.2),
    ("selective + sequence", True, "selective", 7.2, 13.1),
]
KORTHIKANTI_22B_LAYER = dict(model="korthikanti-22b", micro_batch=4, tp=8)

# Korthikanti et al. 2022, Table 3 (t=8 for all; no data parallelism: "the batch sizes as well
# as total number of GPUs are set to a value much lower") with Sec. 6's interleaving ("three
# interleaving stages (m = 3) for the 175B and 530B models"), and Table 5: iteration time with
# full recompute and with the present work (selective recompute + sequence parallelism), MFU
# and HFU of the present work: (preset, p, GPUs, batch, micro, virtual, full s, present s, MFU, HFU).
KORTHIKANTI_TABLE_5 = [
    ("korthikanti-22b",   1,   8,   4, 4, None,  1.42,  1.10, 0.415, 0.437),
    ("korthikanti-175b",  8,  64,  64, 1,    3, 18.13, 13.75, 0.514, 0.528),
    ("korthikanti-530b", 35, 280, 280, 1,    3, 49.05, 37.83, 0.560, 0.570),
    ("korthikanti-1t",   64, 512, 512, 1, None, 94.42, 71.49, 0.563, 0.570),
]
# Sec. 6: "All of our results are run with mixed precision"; the paper does not say fp16 or
# bf16. The estimate times both alike (same 312 TFLOP/s peak and 2-byte elements); bf16 here.
KORTHIKANTI_PRECISION = "bf16"

# SageMaker model parallel library (v1) best practices, "Reference configurations": GPT-2,
# sequence 512, vocabulary 50,000, ml.p4d.24xlarge (8 x A100 40GB) instances; the page gives no
# hidden size, layers or heads, so the estimate cannot run them as they are: (billions of
# parameters, instances, pipeline, tensor, optimizer state sharding, activation checkpointing,
# batch size, micro-batches).
SAGEMAKER_REFERENCE = [
    (10, 16, 1, 4, True, "each transformer layer", 40, None),
    (30, 16, 1, 8, True, "each transformer layer", 32, None),
    (60, 32, 2, 8, True, "each transformer layer", 56, 4),
]


def error(predicted: float, published: float) -> float:
    """(predicted - published) / published."""
    return (predicted - published) / published


def narayanan_estimate(row) -> Estimate:
    """The estimate of one row of NARAYANAN_TABLE_1: dp = GPUs / (t p), full recompute."""
    name, t, p, gpus, batch, micro, virtual = row[:7]
    return estimate(name, A100, tp=t, pp=p, dp=gpus // (t * p), micro_batch=micro, global_batch=batch,
                    schedule="interleaved-1f1b" if virtual else "1f1b", virtual=virtual, recompute="full",
                    precision=NARAYANAN_PRECISION, tp_overlap=NARAYANAN_TP_OVERLAP)


def narayanan_table_1() -> list[dict]:
    """Narayanan et al. 2021, Table 1: TFLOP/s per GPU (Eq. 3 FLOPs over the step), predicted
    against published."""
    out = []
    for row in NARAYANAN_TABLE_1:
        e = narayanan_estimate(row)
        out.append({"model": row[0], "tp": row[1], "pp": row[2], "dp": e.layout.dp, "micro_batch": row[5],
                    "virtual": row[6] or 1, "micro_batches": e.layout.micro_batches, "predicted": e.tflops_per_gpu,
                    "published": row[7], "error": error(e.tflops_per_gpu, row[7]),
                    "bubble": e.bubble_fraction, "fits": e.fits})
    return out


def korthikanti_layer(sequence_parallel: bool, recompute: str):
    """`sim.cost.layer.layer_times` of one layer of the 22B model as Table 4 ran it."""
    c = KORTHIKANTI_22B_LAYER
    x = Slice(c["micro_batch"], c["tp"], sequence_parallel, KORTHIKANTI_PRECISION)
    return layer_times(find_model(c["model"]), resolve(A100), x, recompute)


def korthikanti_table_4() -> list[dict]:
    """Korthikanti et al. 2022, Table 4: a 22B layer's forward and backward, ms."""
    out = []
    for name, sp, recompute, fwd, bwd in KORTHIKANTI_TABLE_4:
        lt = korthikanti_layer(sp, recompute)
        f, b = lt.forward * 1e3, lt.backward * 1e3
        out.append({"technique": name, "forward": f, "forward_published": fwd, "forward_error": error(f, fwd),
                    "backward": b, "backward_published": bwd, "backward_error": error(b, bwd),
                    "combined": f + b, "combined_published": fwd + bwd, "combined_error": error(f + b, fwd + bwd)})
    return out


def korthikanti_estimate(row, present_work: bool) -> Estimate:
    """The estimate of one row of KORTHIKANTI_TABLE_5: full recompute, or selective recompute
    with sequence parallelism (the "present work"); t = 8, no data parallelism."""
    name, p, gpus, batch, micro, virtual = row[:6]
    return estimate(name, A100, tp=8, pp=p, dp=1, micro_batch=micro, global_batch=batch,
                    schedule="interleaved-1f1b" if virtual else "1f1b", virtual=virtual,
                    recompute="selective" if present_work else "full", sequence_parallel=present_work,
                    precision=KORTHIKANTI_PRECISION)


def published_mfu(row) -> float:
    """MFU from Table 5's present-work time with our model FLOPs (Korthikanti et al. 2022,
    Eq. 7) and the A100's 312 TFLOP/s: a check of the FLOP count, not of the estimate."""
    name, p, gpus, batch = row[:4]
    return find_model(name).flops_per_iteration(batch, "none") / row[7] / gpus / gpu_by_name(A100).flops("bf16")


def korthikanti_table_5() -> list[dict]:
    """Korthikanti et al. 2022, Table 5: iteration times, their ratio and MFU."""
    out = []
    for row in KORTHIKANTI_TABLE_5:
        full, present = korthikanti_estimate(row, False), korthikanti_estimate(row, True)
        out.append({"model": row[0], "pp": row[1], "virtual": row[5] or 1,
                    "full": full.step_time, "full_published": row[6], "full_error": error(full.step_time, row[6]),
                    "present": present.step_time, "present_published": row[7],
                    "present_error": error(present.step_time, row[7]),
                    "ratio": full.step_time / present.step_time, "ratio_published": row[6] / row[7],
                    "mfu": present.mfu, "mfu_published": row[8], "mfu_from_published_time": published_mfu(row),
                    "fits": [full.fits, present.fits]})
    return out


def sagemaker_estimate(row: Reference | str, **overrides) -> Estimate:
    """`sim.estimate` of a reference row (`REFERENCES` key or `Reference`), on its GPUs."""
    r = REFERENCES[row] if isinstance(row, str) else row
    return estimate(SAGEMAKER[r.model], SAGEMAKER_GPU, **r.kwargs(**overrides))


# The torch-native development set (sim/plan/data/README.md): each row's stack's profile, the
# sequence torchtitan's configs set where its tables do not state one (train_configs/llama3_*.toml
# at 9dec370: seq_len 8192, as the rows' notes say: not confirmed as used), and what is not
# expressed yet, by reason.
TORCH_NATIVE = Path(__file__).with_name("data") / "torch_native_dev.csv"
TORCH_NATIVE_PROFILES = {"llm-foundry-mpt-benchmarks": "h100-80gb-llm-foundry",
                         "torchtitan-llama3-h100-202412": "h100-96gb-500w-torchtitan"}
TORCHTITAN_SEQ = 8192
TORCH_NATIVE_REASONS = {"micro_batch": "micro-batch size not stated (the pipeline rows of torchtitan's Tables 5-6)"}


@dataclass(frozen=True)
class TorchNativeRun:
    """One measured run of the torch-native set: its CSV row, its measured step time (the row's
    where it states one, llm-foundry's from its total throughput; else `throughput_step`) and,
    where it is not expressed, why (`TORCH_NATIVE_REASONS`)."""
    row: dict
    step_time: float
    reason: str | None

    @property
    def seq(self) -> int:
        return int(self.row["seq_len"] or TORCHTITAN_SEQ)


def throughput_step(row: dict, seq: int) -> float:
    """Seconds a step: global batch x sequence over tokens/s/GPU x GPUs (the set's README)."""
    return int(row["gbs"]) * seq / (float(row["tokens_per_s_per_gpu"]) * int(row["n_gpus"]))


@cache
def torch_native_runs() -> tuple[TorchNativeRun, ...]:
    """The set's rows, each with its measured step time and the reason it is left out, if any."""
    out = []
    with TORCH_NATIVE.open() as f:
        for r in csv.DictReader(f):
            seq = int(r["seq_len"] or TORCHTITAN_SEQ)
            step = float(r["step_time_s"]) if r["step_time_s"] else throughput_step(r, seq)
            reason = "micro_batch" if not r["mbs"] else None
            out.append(TorchNativeRun(r, step, reason))
    return tuple(out)


def torch_native_model(run: TorchNativeRun) -> Transformer:
    """The row's transformer from its architecture columns: MPT as a GPT without dropout, GeLU,
    learned positions (the set's README: the parameter count grows with the sequence); Llama 3.1
    as the llama family (SwiGLU, rotary, RMSNorm); both with flash attention."""
    r = run.row
    family = dict(arch="gpt", mlp="gelu", positions="learned", dropout=False) if r["model"].startswith("MPT") \
        else dict(arch="llama")
    return Transformer(layers=int(r["n_layers"]), hidden=int(r["hidden"]), heads=int(r["n_heads"]),
                       kv_heads=int(r["n_kv_heads"]), ffn=int(r["ffn_hidden"]), seq=run.seq, vocab=int(r["vocab"]),
                       attention="flash", **family)


def torch_native_keywords(run: TorchNativeRun) -> dict:
    """`sim.estimate`'s keywords for an expressed row: FSDP (zero 3; llm-foundry's
    SHARD_GRAD_OP zero 2) over all data-parallel ranks, 8 GPUs a node (the sources' 8-GPU hosts),
    sequence parallelism with tp, recompute full or selective as stated, else none; torchao's
    float8 (`precision` fp8: its Linear layers only, dynamic tensorwise scaling) as FP8 GEMMs
    under current scaling (an amax, then a cast: the profile's `fp8_efficiency` and its
    `scaling` "current"), attention in BF16 as in both stacks."""
    r = run.row
    tp, pp, cp = int(r["tp"]), int(r["pp"]), int(r["cp"] or 1)
    recompute = next((k for k in ("full", "selective") if k in r["recompute"]), "none")
    return dict(tp=tp, pp=pp, cp=cp, dp=int(r["n_gpus"]) // (tp * pp * cp), micro_batch=int(r["mbs"]),
                global_batch=int(r["gbs"]), recompute=recompute, gpus_per_node=8, sequence_parallel=tp > 1,
                zero=2 if "SHARD_GRAD_OP" in r["dp_sharding"] else 3, precision="fp8" if r["precision"] == "fp8" else "bf16")


def torch_native_estimate(run: TorchNativeRun, profile=None) -> Estimate:
    """`sim.estimate` of an expressed row on `profile` (its stack's, `TORCH_NATIVE_PROFILES`, by default)."""
    if run.reason is not None:
        raise ValueError(f"row {run.row['row_id']} is not expressed: {TORCH_NATIVE_REASONS[run.reason]}")
    return estimate(torch_native_model(run), profile or TORCH_NATIVE_PROFILES[run.row["source_id"]],
                    **torch_native_keywords(run))
