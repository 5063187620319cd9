"""A device profile (docs/profiles.md, format 1) from what `exec.profile_device`'s ranks measured: every number with its provenance.

Measured numbers carry the command, the machine and the date; the fitted models (memory
bandwidth per class as the slope of time over bytes, compute-bound rates per class as the
slope of time over elements, the ring and send models) say what they were fitted on; the
measured points stay beside each class's number (the planner looks them up by size). A CPU has no preset datasheet: an inline one gives its name, memory
(/proc/meminfo), the best measured matmul FLOP/s as its fp32 peak, the best measured copy
bandwidth as its memory bandwidth, and its cores.
"""
from __future__ import annotations

import platform

from exec.profiler.comm_bench import nonnegative_lstsq, p2p_fit, ring_fit
from exec.profiler.device_bench import in_step_per_tensor
from exec.profiler.host_bench import HOW, LAW_HOW, first_compute_law, host_transport
from exec.profiler.layer_bench import HOW as LAYERS_HOW
from sim.hardware.kernels import memory_time
from sim.hardware.profile import from_dict

__all__ = ["assemble", "class_bandwidth"]

_LAUNCH = {"nccl": "median host time of a one-element add, mul and matmul",
           "gloo": "host time of one block of the GPT (exec.models.layers.Block) at hidden 2 a head, sequence 2, "
                   "micro-batch 1, forward and backward, over the kernels sim.cost.layer.pass_kernels lists "
                   "for them (F + B): the host's cost of a training pass per listed kernel"}


OPTIMIZER_HOW = ("the optimizer's step over 33 one-element parameters less its step over one, per parameter "
                 "(exec.profiler.device_bench.optimizer_tensor_seconds)")


ATTENTION_HOW = ("rows [precision, head_dim, seq, batch_heads, forward, backward]: the median seconds of torch's "
                 "causal scaled_dot_product_attention over batch_heads problems, and of its backward (the gradients "
                 "of q, k and v), each in a loop (exec.profiler.device_bench.attention_rows)")


IN_STEP_HOW = ("inside training steps (rule 20): least squares through 0, over the layer bench's steps (per "
               "configuration and rank: its median AdamW step; exec.profiler.layer_bench), relative, of the step "
               "beyond its memory-bound part (memory_bound.classes.optimizer) per parameter tensor "
               "(exec.profiler.device_bench.in_step_per_tensor)")


def class_bandwidth(points) -> float:
    """Bytes/s of a memory-bound class: 1 / the slope of seconds over bytes (least squares
    with a non-negative intercept, the op's fixed cost); the best bytes/s of a point where
    the times do not grow with the bytes (noise on a loaded machine)."""
    _, per_byte = nonnegative_lstsq([[1.0] * len(points), [b for b, _ in points]], [t for _, t in points])
    return 1 / per_byte if per_byte > 0 else max(b / t for b, t in points)


def assemble(measured: dict, collectives: list, fp: dict, cores: int | None, command: str, backend: str) -> dict:
    """The profile's JSON object (see the module docstring)."""
    machine = f"{fp['host']}: {fp['device']}"
    stamp = {"source": "measured", "command": command, "machine": machine, "date": fp["date"]}

    def m(value, **extra):
        return {"value": value, **stamp, **extra}

    def derived(value, sources, how):
        return {"value": value, "source": "derived", "from": sources, "how": how}

    rows = measured["matmul"]
    peak = max(2 * mm * n * k * b / t for _, mm, n, k, b, t, *_ in rows)
    classes = {name: m(class_bandwidth(points), points=[list(p) for p in points],
                       how="1 / slope of seconds over bytes moved (read + written), least squares")
               for name, points in measured["memory"].items()}
    compute = {name: m(class_bandwidth(points), points=[list(p) for p in points],
                       how="elements/s: 1 / slope of seconds over elements, least squares")
               for name, points in measured.get("compute", {}).items()}
    stream = max(b / t for b, t in measured["memory"]["copy"])
    out = {
        "schema": "pipeline-workbench/device-profile/1",
        "name": f"{fp['device']}/{backend}-{fp['threads']}-threads-{fp['date']}",
        "description": f"{fp['device']} as exec's {backend} ranks use it ({fp['threads']} threads a rank), "
                       f"measured by exec.profile_device",
        "datasheet": {"name": fp["device"], "memory": m(_memory_bytes(backend), how="MemTotal of /proc/meminfo"
                                                        if backend == "gloo" else "torch.cuda total_memory"),
                      "peak_flops": {"fp32": m(peak, how="the best FLOP/s of matmul.table")},
                      "hbm_bandwidth": m(stream, how="the best copy bandwidth measured (memory_bound copy)"),
                      "sms": m(cores if cores is not None else _sms(), how="cores the ranks share"
                               if cores is not None else "multiprocessor count")},
        "stack": {"name": "exec-torch", "description": f"exec's GPT on torch.distributed ({backend}), eager",
                  "attention_kernel": "measured", "elementwise": "eager"},
        "fingerprint": fp,
        "matmul": {"table": {"rows": rows, **stamp}},
        **({"attention": {"table": {"rows": measured["attention"], **stamp, "how": ATTENTION_HOW}}}
           if measured.get("attention") else {}),
        "memory_bound": {"bandwidth": derived(classes["copy"]["value"], ["memory_bound.classes.copy"],
                                              "the copy class's"),
                         "classes": classes},
        **({"compute_bound": {"classes": compute}} if compute else {}),
        "launch": {"per_kernel": m(measured["launch"], how=_LAUNCH[backend]),
                   "host_runs_ahead": backend == "nccl"},
        "step_overhead": m(measured["step_overhead"], how="torch.optim.AdamW.step over one one-element parameter"),
    }
    if "optimizer_per_tensor" in measured:
        out["optimizer_per_tensor"] = {k: m(v, how=OPTIMIZER_HOW) for k, v in measured["optimizer_per_tensor"].items()}
    if collectives:
        ring = ring_fit(collectives)
        how = "least squares of sim.hardware.kernels' ring model (base + steps x hop + steps/n x bytes / bandwidth)"
        out["collectives"] = {"node": {k: derived(v, ["collectives.table"], how) for k, v in ring.items()},
                              "table": {"rows": collectives, **stamp}}
    if measured.get("p2p"):
        fit = p2p_fit(measured["p2p"])
        how = "least squares of latency + bytes / bandwidth over p2p.table (half a ping-pong)"
        out["p2p"] = {"node": {k: derived(v, ["p2p.table"], how) for k, v in fit.items()},
                      "table": {"rows": measured["p2p"], **stamp}}
    return _steps_sections(out, measured, m, stamp)


def _steps_sections(out: dict, measured: dict, m, stamp: dict) -> dict:
    """`out` with what the ranks measured inside training steps: the blocks and ends
    (`layers`), exec's own costs around transfers and computes (`host_transport`, rules 2, 3,
    9, 10, 11 and 19 of docs/rules.md: what sim's gloo-cpu transport reads, with rule 19's law
    fitted to the layer bench's first computes) and AdamW's cost per tensor inside a step
    (rule 20). `m(value, **extra)` stamps a measured number."""
    layers = dict(measured.get("layers") or {})
    firsts = layers.pop("first", [])  # (d, excess) of each configuration's first computes (rule 19)
    steps = layers.pop("optimizer", [])  # (tensors, parameters, seconds) of their AdamW steps (rule 20)
    if layers:  # whole blocks: what the planner takes before its kernel model
        out["layers"] = {k: {"rows": rows, **stamp, "how": LAYERS_HOW} for k, rows in layers.items()}
    if measured.get("host"):
        out["host_transport"] = {"name": "gloo-cpu", **{k: m(v, how=HOW[k]) for k, v in
                                                        host_transport(measured["host"]).items()}}
        if len(firsts) >= 3:  # the layer bench's first computes give the excess at many durations
            most, tau, rms = first_compute_law(firsts)
            out["host_transport"] |= {"first_compute": m(most, how=LAW_HOW["first_compute"], points=len(firsts),
                                                         rms_residual=rms),
                                      "first_compute_tau": m(tau, how=LAW_HOW["first_compute_tau"])}
    if steps and "optimizer_per_tensor" in out:
        dev = from_dict(out)
        per, rms = in_step_per_tensor(steps, lambda nbytes: memory_time(dev, nbytes, "optimizer"))
        out["optimizer_per_tensor"]["adamw"] = m(per, how=IN_STEP_HOW, points=len(steps), rms_residual=rms)
    return out


def _memory_bytes(backend: str) -> int:
    if backend == "nccl":
        import torch
        return torch.cuda.get_device_properties(0).total_memory
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no MemTotal in /proc/meminfo on {platform.node()}")


def _sms() -> int:
    import torch
    return torch.cuda.get_device_properties(0).multi_processor_count
