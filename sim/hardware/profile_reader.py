"""Reads the fields of a device profile's JSON (docs/profiles.md), each number with its provenance checked, naming the file and the field in every error."""
from __future__ import annotations

import math
from typing import Mapping

from .gpus import GPU, GPUS, PEAK_PRECISIONS

SOURCES = {"datasheet": ("citation",), "published": ("citation",), "measured": ("command", "machine", "date"),
           "calibrated": ("dataset", "rows", "method", "residual"), "derived": ("from", "how")}


class ProfileError(ValueError):
    """A device profile that cannot be read: the message names the file and the field."""


class Reader:
    """Reads the fields of one profile's JSON, naming the file and field in every error."""

    def __init__(self, data: Mapping, where: str):
        self.data, self.where = data, where

    def fail(self, msg: str):
        raise ProfileError(f"{self.where}: {msg}")

    def section(self, path: str, required: bool = True) -> Mapping | None:
        node = self.data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is None and required:
            self.fail(f"missing {path!r}")
        if node is not None and not isinstance(node, Mapping):
            self.fail(f"{path!r} must be an object")
        return node

    def provenance(self, node: Mapping, path: str) -> None:
        src = node.get("source")
        if src not in SOURCES:
            self.fail(f"{path!r} needs a source, one of {', '.join(SOURCES)}; got {src!r}")
        missing = [k for k in SOURCES[src] if node.get(k) in (None, "")]
        if missing:
            self.fail(f"{path!r} is {src} but says no {', '.join(missing)}")

    def number(self, path: str, required: bool = True, positive: bool = True) -> float | None:
        node = self.section(path, required)
        if node is None:
            return None
        v = node.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v == 0):
            self.fail(f"{path!r} value must be a {'positive' if positive else 'non-negative'} number, got {v!r}")
        self.provenance(node, path)
        return float(v)

    def rows(self, path: str, shape: tuple, optional: int = 0) -> tuple:
        """The table at `path`: rows of `shape` ((type, choices) a column), less `optional` at the end."""
        node = self.section(path, required=False)
        if node is None:
            return ()
        self.provenance(node, path)
        rows = node.get("rows")
        if not isinstance(rows, list) or not rows:
            self.fail(f"{path!r} needs a non-empty list 'rows'")
        for i, r in enumerate(rows):
            ok = isinstance(r, list) and len(shape) - optional <= len(r) <= len(shape) and all(
                (t is str and isinstance(x, str) and (not choices or x in choices))
                or (t is not str and not isinstance(x, (bool, str)) and isinstance(x, (int, float)) and x > 0)
                for x, (t, choices) in zip(r, shape))
            if not ok:
                self.fail(f"{path!r} row {i} must be [{', '.join(t.__name__ for t, _ in shape)}] "
                          f"(positive numbers), got {r!r}")
        return tuple(tuple(r) for r in rows)

    def points(self, path: str) -> tuple:
        """The (size, seconds) points beside the number at `path`, sorted by size."""
        pts = self.section(path)["points"]
        if not isinstance(pts, list) or not pts or not all(
                isinstance(p, list) and len(p) == 2 and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                    for x in p) for p in pts):
            self.fail(f"{path!r} points must be a non-empty list of [size, seconds] (positive numbers), got {pts!r}")
        return tuple(sorted((float(a), float(b)) for a, b in pts))

    def datasheet(self) -> GPU:
        ds = self.data.get("datasheet")
        if isinstance(ds, str):
            if ds not in GPUS:
                self.fail(f"datasheet {ds!r} is not a GPU preset ({', '.join(GPUS)}); give an inline datasheet")
            return GPUS[ds]
        if not isinstance(ds, Mapping):
            self.fail("'datasheet' must be a GPU preset name or an object")
        peak = self.section("datasheet.peak_flops")
        flops = {p: self.number(f"datasheet.peak_flops.{p}") for p in peak if p in PEAK_PRECISIONS}
        if not flops or set(peak) - set(PEAK_PRECISIONS):
            self.fail(f"datasheet.peak_flops needs precisions among {', '.join(PEAK_PRECISIONS)}; got {sorted(peak)}")
        opt = {k: self.number(f"datasheet.{k}", required=False)
               for k in ("nvlink_bandwidth", "network_bandwidth", "pcie_bandwidth")}
        if not isinstance(ds.get("name"), str):
            self.fail("datasheet.name must be a string")
        try:
            return GPU(ds["name"], peak_flops=flops, memory=int(self.number("datasheet.memory")),
                       hbm_bandwidth=self.number("datasheet.hbm_bandwidth"),
                       sms=int(self.number("datasheet.sms")), **{k: v for k, v in opt.items() if v is not None})
        except ValueError as e:
            self.fail(str(e))
