"""Device profiles: what one software stack achieves on a device, every number with its source.

The format is docs/profiles.md's (version 1). A `DeviceProfile` holds a datasheet (`sim.GPU`)
and the achieved figures: matmul efficiency or a measured matmul table, memory-bound
bandwidth by kernel class (measured ones also by size), the rates of compute-bound elementwise
kernels, collective and point-to-point links (NCCL's ring model, or a measured table), the
host's launch cost per kernel, a step's fixed overhead, measured blocks and ends (`layer_table`),
the fused attention kernel by shape (`attention_table`), and the software stack the figures are
of (`Stack`: its name, the attention kernel it runs, its elementwise kernels fused or eager).
`sim.hardware.kernels` turns them into times; nothing here models, it reads, checks, looks up.

    >>> p = profile("a100-80gb-best-case")
    >>> p.gpu.name, p.source("launch.per_kernel")["source"]
    ('a100-80gb', 'published')
    >>> profile("h100-80gb").header
    'h100-80gb, megatron-te: NeMo 24.05-25.04 (Megatron-Core, Transformer Engine) on DGX H100, calibrated'
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path, PurePath
from typing import Any, Mapping

from .gpus import GPU, GPUS, PEAK_PRECISIONS
from . import attention_kernels, attention_table, layer_table
from .points import interpolate
from .host_transport import read as read_host_transport
from .profile_reader import SOURCES, ProfileError, Reader  # noqa: F401  SOURCES: part of this module's API

SCHEMA = "pipeline-workbench/device-profile/1"
MEMORY_CLASSES = ("elementwise", "norm", "softmax", "copy", "optimizer", "embedding")
# How a product reads its operands, as torch's linear layer runs them: the forward X W^T ("nt"),
# input gradient dY W ("nn"), weight gradient dY^T X ("tn"); the tile model of a GPU ignores it.
LAYOUTS = ("nn", "nt", "tn")
# Elementwise kernels bound by their arithmetic where the device is a CPU (docs/profiles.md):
# torch's erf GeLU forward and backward, and the exponential (flash attention's softmax).
COMPUTE_CLASSES = ("gelu", "gelu_backward", "exp")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
LINKS = ("node", "network")
PRESETS = Path(__file__).with_name("profiles")
# The default profile of each GPU preset: the best sourced one we have (docs/planner.md says why).
# h100-80gb-dgxc: step-time MAPE 6.0 % on the H100 development set's fitted rows, the best case 11.9 %.
DEFAULT_PROFILES = {"a100-40gb": "a100-40gb-best-case", "a100-80gb": "a100-80gb-vtrain",
                    "h100-80gb": "h100-80gb-dgxc", "h200": "h200-dgxc",
                    "h100-96gb-500w": "h100-96gb-500w-torchtitan"}  # its only profile: torchtitan's


# How a stack runs its elementwise and norm kernels: fused (Transformer Engine's and Megatron's
# fused kernels, or torch.compile's generated ones: `sim.cost.layer`'s lists) or eager (torch's
# one kernel an operator: `sim.cost.layer`'s eager lists).
ELEMENTWISE = ("fused", "compiled", "eager")


@dataclass(frozen=True)
class Stack:
    """The software stack a profile's figures are of (docs/profiles.md, "stack"): its name and
    what it is, the fused attention kernel it runs (`sim.hardware.attention_kernels.KERNELS`) and
    how it runs elementwise and norm kernels (`ELEMENTWISE`)."""
    name: str
    description: str
    attention_kernel: str
    elementwise: str


@dataclass(frozen=True)
class Link:
    """NCCL's ring model of one link (src/graph/tuning.cc): bytes/s per rank one way, and the
    latencies of one ring step and of one collective; and one send's bandwidth and latency."""
    bus_bandwidth: float
    hop_latency: float
    base_latency: float
    p2p_bandwidth: float
    p2p_latency: float


@dataclass(frozen=True, eq=False)
class DeviceProfile:
    """A datasheet and what a software stack achieves on it (docs/profiles.md). Build with
    `load_profile`, `profile` or `from_dict`; times come from `sim.hardware.kernels`."""
    name: str
    description: str
    gpu: GPU
    stack: Stack
    fingerprint: Mapping[str, Any]
    matmul_efficiency: float | None
    matmul_rows: tuple          # (precision, m, n, k, batch, seconds, layout)
    memory_bandwidth: float     # bytes/s, read + written, of a memory-bound kernel
    memory_classes: Mapping[str, float]
    links: Mapping[str, Link]
    collective_rows: tuple      # (op, link, ranks, bytes, seconds)
    p2p_rows: tuple             # (link, bytes, seconds)
    launch_per_kernel: float
    host_runs_ahead: bool
    step_overhead: float
    data: Mapping[str, Any] = field(repr=False)
    # per optimizer name (sim.model.footprint.OPTIMIZERS): its step's host seconds per parameter tensor; absent: 0
    optimizer_per_tensor: Mapping[str, float] = field(default_factory=dict)
    memory_points: Mapping[str, tuple] = field(default_factory=dict)   # class: ((bytes, seconds), ...)
    compute_classes: Mapping[str, float] = field(default_factory=dict)  # class: elements/s
    compute_points: Mapping[str, tuple] = field(default_factory=dict)   # class: ((elements, seconds), ...)
    host_transport: Mapping[str, Any] | None = None  # the Costs fields of its runtime's transport (host_transport.py)
    layers: layer_table.LayerTable = field(default_factory=layer_table.LayerTable)  # measured blocks and ends
    attention_efficiency: float | None = None  # fused attention's share of the peak; None: at its matmuls' rate
    attention: attention_table.AttentionTable = field(default_factory=attention_table.AttentionTable)  # measured calls
    fp8_efficiency: float | None = None  # FP8 GEMMs' share of the FP8 peak (`sim.cost.fp8`); None: FP8 not timed
    fp8_scaling: str = "delayed"         # its FP8 recipe: "delayed" or "current" scaling (`sim.cost.fp8.SCALINGS`)
    # a grouped GEMM's rate (the experts' matmuls, `sim.cost.moe`) over a plain GEMM's of the same
    # total shape; None: at the plain GEMM's rate
    grouped_gemm_efficiency: float | None = None

    def __repr__(self) -> str:
        return f"DeviceProfile({self.name!r} on {self.gpu.name}, {self.fingerprint.get('date')})"

    @property
    def kind(self) -> str:
        """What its numbers are (their `source`s): "calibrated" if any was fitted, else
        "measured" if any was measured, else "best case" (published figures)."""
        sources = set(_sources(self.data))
        return next((kind for kind in ("calibrated", "measured") if kind in sources), "best case")

    @property
    def header(self) -> str:
        """The GPU, the stack and what its numbers are, as every report's header names them."""
        return f"{self.gpu.name}, {self.stack.name}: {self.stack.description}, {self.kind}"

    memory = property(lambda self: self.gpu.memory)  # the datasheet's, for code that sizes memory and MFU

    def flops(self, precision: str) -> float:  # the datasheet's peak dense FLOP/s at `precision`
        return self.gpu.flops(precision)

    def memory_class_bandwidth(self, kind: str) -> float:
        """Bytes/s of a memory-bound kernel of class `kind` (one of MEMORY_CLASSES)."""
        if kind not in MEMORY_CLASSES:
            raise ValueError(f"memory-bound kernel class must be one of {', '.join(MEMORY_CLASSES)}; got {kind!r}")
        return self.memory_classes.get(kind, self.memory_bandwidth)

    def memory_class_time(self, kind: str, nbytes: float) -> float:
        """Seconds of a memory-bound kernel of class `kind` moving `nbytes`: interpolated in the
        class's measured (bytes, seconds) points where the profile has them (a CPU's bandwidth
        depends on whether the bytes fit its caches), else at the class's bandwidth."""
        rate = self.memory_class_bandwidth(kind)
        pts = self.memory_points.get(kind)
        return interpolate(pts, nbytes) if pts and nbytes > 0 else nbytes / rate

    def compute_class_time(self, kind: str, elements: float) -> float | None:
        """Seconds of an elementwise kernel of compute class `kind` (one of COMPUTE_CLASSES) over
        `elements`: its measured points or rate; None where the profile has no such class (a
        GPU's: there these kernels are memory-bound)."""
        if kind not in COMPUTE_CLASSES:
            raise ValueError(f"compute-bound kernel class must be one of {', '.join(COMPUTE_CLASSES)}; got {kind!r}")
        if kind not in self.compute_classes:
            return None
        pts = self.compute_points.get(kind)
        return interpolate(pts, elements) if pts and elements > 0 else elements / self.compute_classes[kind]

    def link(self, name: str) -> Link:
        if name not in LINKS:
            raise ValueError(f"link must be one of {', '.join(LINKS)}; got {name!r}")
        if name not in self.links:
            raise ValueError(f"profile {self.name!r} has no {name!r} link")
        return self.links[name]

    def pass_time(self, device_seconds: float, kernels: float) -> float:
        """A pass of `kernels` kernels that keep the device busy `device_seconds`: the host's
        launch floor taken as a max where it runs ahead of the device, added where it is the device."""
        host = kernels * self.launch_per_kernel
        return max(device_seconds, host) if self.host_runs_ahead else device_seconds + host

    def matmul_lookup(self, precision: str, m: int, n: int, k: int, batch: int, layout: str = "nn") -> float | None:
        """Seconds of a matmul from the measured table: exact, or the nearest row's achieved
        FLOP/s (log-distance over m, n, k, batch) times this one's FLOPs, among the rows of
        `layout` where the table has any (`LAYOUTS`), else among all; None
        if the table has no row of `precision`."""
        rows = [r for r in self.matmul_rows if r[0] == precision]
        rows = [r for r in rows if r[6] == layout] or rows
        if not rows:
            return None
        q = (m, n, k, batch)
        best = min(rows, key=lambda r: sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(r[1:5], q)))
        if tuple(best[1:5]) == q:
            return best[5]
        return best[5] * (m * n * k * batch) / (best[1] * best[2] * best[3] * best[4])

    def collective_lookup(self, op: str, link: str, ranks: int, nbytes: float) -> float | None:
        """Seconds of a collective from the measured table, interpolated in bytes; None if the
        table has no row of (op, link, ranks)."""
        pts = self._collective_points.get((op, link, ranks))
        return interpolate(pts, nbytes) if pts else None

    def p2p_lookup(self, link: str, nbytes: float) -> float | None:
        pts = self._p2p_points.get(link)
        return interpolate(pts, nbytes) if pts else None

    @cached_property
    def _collective_points(self) -> dict:
        """The collective table's (bytes, seconds), sorted, by (op, link, ranks): built once."""
        return _by_key(((r[:3], (r[3], r[4])) for r in self.collective_rows))

    @cached_property
    def _p2p_points(self) -> dict:
        return _by_key(((r[0], (r[1], r[2])) for r in self.p2p_rows))

    def source(self, path: str) -> dict:
        """Where the number at dotted `path` (e.g. "collectives.node.bus_bandwidth") comes from."""
        node = self.data
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"profile {self.name!r} has no {path!r}")
            node = node[part]
        return {k: v for k, v in node.items() if k not in ("value", "rows")}

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.data))


def _sources(node):
    """Every `source` in the profile's JSON `node`."""
    if isinstance(node, Mapping):
        if isinstance(node.get("source"), str):
            yield node["source"]
        for value in node.values():
            yield from _sources(value)
    elif isinstance(node, list):
        for value in node:
            yield from _sources(value)


def _stack(r: Reader) -> Stack:
    """The profile's `stack` section, each field checked."""
    st = r.section("stack", required=False)
    if st is None:
        r.fail("missing 'stack': the software stack its figures are of (docs/profiles.md, \"stack\")")
    for key in ("name", "description"):
        if not isinstance(st.get(key), str) or not st[key]:
            r.fail(f"stack.{key} must be a non-empty string")
    if st.get("attention_kernel") not in attention_kernels.KERNELS:
        r.fail(f"stack.attention_kernel must be one of {', '.join(attention_kernels.KERNELS)}; "
               f"got {st.get('attention_kernel')!r}")
    if st.get("elementwise") not in ELEMENTWISE:
        r.fail(f"stack.elementwise must be one of {', '.join(ELEMENTWISE)}; got {st.get('elementwise')!r}")
    return Stack(st["name"], st["description"], st["attention_kernel"], st["elementwise"])


def _by_key(pairs) -> dict:
    out: dict = {}
    for key, pt in pairs:
        out.setdefault(key, []).append(pt)
    return {k: sorted(v) for k, v in out.items()}


def _link(r: Reader, name: str) -> Link | None:
    """The link `name` of the profile `r` reads: its collectives' ring model and its sends."""
    c, p = f"collectives.{name}", f"p2p.{name}"
    if r.section(c, required=False) is None:
        return None
    return Link(r.number(f"{c}.bus_bandwidth"), r.number(f"{c}.hop_latency", positive=False),
                r.number(f"{c}.base_latency", positive=False), r.number(f"{p}.bandwidth"),
                r.number(f"{p}.latency", positive=False))


def from_dict(data: Mapping, where: str = "profile") -> DeviceProfile:
    """A `DeviceProfile` from the parsed JSON `data`; ProfileError names `where` and the field."""
    r = Reader(data, where)
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        r.fail(f"not a device profile: 'schema' must be {SCHEMA!r}")
    if not isinstance(data.get("name"), str) or not data["name"]:
        r.fail("'name' must be a non-empty string")
    gpu, stack = r.datasheet(), _stack(r)
    fp = r.section("fingerprint")
    if not isinstance(fp.get("date"), str):
        r.fail("fingerprint.date must be an ISO date string")
    eff, attention = r.number("matmul.efficiency", required=False), r.number("attention.efficiency", required=False)
    mm = r.rows("matmul.table", ((str, PEAK_PRECISIONS), (int, None), (int, None), (int, None), (int, None),
                                 (float, None), (str, LAYOUTS)), optional=1)
    mm = tuple(row + ("nn",) * (7 - len(row)) for row in mm)  # a row without a layout: "nn"
    if eff is None and not mm:
        r.fail("'matmul' needs an 'efficiency' or a 'table'")
    classes = r.section("memory_bound.classes", required=False) or {}
    if set(classes) - set(MEMORY_CLASSES):
        r.fail(f"memory_bound.classes must be among {', '.join(MEMORY_CLASSES)}; got {sorted(classes)}")
    compute = r.section("compute_bound.classes", required=False) or {}
    if set(compute) - set(COMPUTE_CLASSES):
        r.fail(f"compute_bound.classes must be among {', '.join(COMPUTE_CLASSES)}; got {sorted(compute)}")
    launch = r.section("launch")
    if not isinstance(launch.get("host_runs_ahead"), bool):
        r.fail("launch.host_runs_ahead must be true or false")
    links = {name: link for name in LINKS if (link := _link(r, name)) is not None}
    if "node" not in links:
        r.fail("'collectives.node' and 'p2p.node' are needed (the link inside a node)")
    return DeviceProfile(
        name=data["name"], description=str(data.get("description", "")), gpu=gpu, stack=stack, fingerprint=dict(fp),
        matmul_efficiency=eff, matmul_rows=mm, memory_bandwidth=r.number("memory_bound.bandwidth"),
        memory_classes={k: r.number(f"memory_bound.classes.{k}") for k in classes}, links=links,
        collective_rows=r.rows("collectives.table", ((str, COLLECTIVES), (str, LINKS), (int, None), (float, None),
                                                     (float, None))),
        p2p_rows=r.rows("p2p.table", ((str, LINKS), (float, None), (float, None))),
        launch_per_kernel=r.number("launch.per_kernel", positive=False), host_runs_ahead=launch["host_runs_ahead"],
        step_overhead=r.number("step_overhead", positive=False), data=data,
        optimizer_per_tensor={k: r.number(f"optimizer_per_tensor.{k}", positive=False)
                              for k in r.section("optimizer_per_tensor", required=False) or {}},
        memory_points={k: r.points(f"memory_bound.classes.{k}") for k in classes if "points" in classes[k]},
        compute_classes={k: r.number(f"compute_bound.classes.{k}") for k in compute},
        compute_points={k: r.points(f"compute_bound.classes.{k}") for k in compute if "points" in compute[k]},
        host_transport=read_host_transport(r.section("host_transport", required=False), r.number, r.fail),
        layers=layer_table.read(r.rows("layers.blocks", layer_table.BLOCKS), r.rows("layers.ends", layer_table.ENDS),
                                r.rows("layers.checked", layer_table.CHECKED)),
        attention_efficiency=attention, attention=attention_table.read(r.rows("attention.table", attention_table.ROWS)),
        fp8_efficiency=r.number("matmul.fp8_efficiency", required=False),
        fp8_scaling=(r.section("matmul.fp8_efficiency", required=False) or {}).get("scaling", "delayed"),
        grouped_gemm_efficiency=r.number("matmul.grouped_gemm_efficiency", required=False))


def load_profile(path) -> DeviceProfile:
    """Read and check the device profile at `path` (docs/profiles.md)."""
    p = Path(path).expanduser()  # "~/.cache/exec/my-device.json", as the docs suggest
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ProfileError(f"{p}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{p}: not JSON: {e}") from None
    return from_dict(data, str(p))


def save_profile(profile: DeviceProfile | Mapping, path) -> None:
    """Write `profile` (or its dict, checked first) to `path` as JSON."""
    data = profile.to_dict() if isinstance(profile, DeviceProfile) else dict(profile)
    from_dict(data, str(path))
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def presets() -> list[str]:
    """The names of the shipped profiles (sim/hardware/profiles/*.json)."""
    return sorted(p.stem for p in PRESETS.glob("*.json"))


def profile(name: str) -> DeviceProfile:
    """A shipped profile by name, or a GPU preset's default profile by the GPU's name."""
    key = name.strip().lower().replace("_", "-")
    key = DEFAULT_PROFILES.get(key, key)
    if key in GPUS:
        raise ValueError(f"GPU {name!r} has a datasheet but no device profile yet: give sim.load_profile(path) "
                         f"(docs/profiles.md); profiles: {', '.join(presets())}")
    if key not in presets():
        raise ValueError(f"unknown GPU or profile {name!r}; known GPUs: {', '.join(GPUS)}; "
                         f"profiles: {', '.join(presets())}; or a profile FILE.json (exec.profile_device's)")
    return _cached(key)


@cache
def _cached(key: str) -> DeviceProfile:
    return load_profile(PRESETS / f"{key}.json")


def resolve(gpu) -> DeviceProfile:
    """A `DeviceProfile` from what `sim.estimate(gpu=...)` takes: a profile, a GPU or profile
    name, the path of a profile FILE.json (`load_profile`: what `python -m exec.profile_device`
    writes; ProfileError, one line naming the file, for one it cannot read), or a datasheet
    `GPU` (its preset's default profile, for a preset)."""
    if isinstance(gpu, DeviceProfile):
        return gpu
    if isinstance(gpu, PurePath) or isinstance(gpu, str) and gpu.endswith(".json"):
        return load_profile(gpu)  # a profile file: exec.profile_device's, or one of your own
    if isinstance(gpu, str):
        return profile(gpu)
    if isinstance(gpu, GPU):
        if gpu.name in DEFAULT_PROFILES and GPUS.get(gpu.name) == gpu:
            return profile(gpu.name)
        raise ValueError(f"GPU {gpu.name!r} is a datasheet without a profile: give sim.load_profile(path) "
                         f"or a GPU with one ({', '.join(DEFAULT_PROFILES)})")
    raise TypeError(f"gpu must be a GPU or profile name, a profile FILE.json, a sim.GPU or a sim.DeviceProfile; "
                    f"got {type(gpu).__name__}")
