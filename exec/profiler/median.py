"""The median of several profiles of one machine: one profile whose every number is the median of theirs, so that a slow or a fast minute of a VM does not become the profile.

    >>> p = median_profile([json.load(open(f)) for f in ("a.json", "b.json", "c.json")])  # doctest: +SKIP

Profiles of one machine taken minutes apart differ by about 10 % overall and their small
blocks by up to 30 % (docs/validation.md, "One profile, many shapes"), and a plan made
from one of them carries its minute's error into every shape. `median_profile` takes
profiles of the same device, backend, torch and threads (`fingerprint`) and keeps, value by
value:

- a number with its provenance (`{"value": ...}`, measured or derived), and the residual of
  the fit that gave it (`rms_residual`): the median of the profiles' values;
- a measured table (`rows`): row by row, the rows whose whole-number and text columns (the
  row's key: a shape, a size, a name) agree, each number column the median over the
  profiles that have that row;
- measured points (`points`, a class's time by size): the median time at each size, where
  every profile measured the same sizes;
- anything else (names, how it was measured): the first profile's.

It says so: the top-level `median_of` lists each profile's name and command, and the `how`
of each number and table ends with the count of profiles it is the median of.
"""
from __future__ import annotations

import statistics
from typing import Any, Sequence

__all__ = ["median_profile", "SAME"]

SAME = ("schema", "fingerprint.device", "fingerprint.backend", "fingerprint.torch", "fingerprint.threads")


def median_profile(profiles: Sequence[dict]) -> dict:
    """The median of `profiles` (profile JSON objects, docs/profiles.md), as the module's
    docstring says. ValueError where there are fewer than two, or where they are not of one
    machine as measured the same way (`SAME` differs)."""
    if len(profiles) < 2:
        raise ValueError(f"a median needs at least two profiles, got {len(profiles)}")
    for key in SAME:
        values = {repr(_get(p, key)) for p in profiles}
        if len(values) > 1:
            raise ValueError(f"the profiles are not of one machine measured the same way: {key} differs "
                             f"({', '.join(sorted(values))})")
    out = _merge(list(profiles), len(profiles))
    out["median_of"] = [{"name": p.get("name"), "command": _command(p)} for p in profiles]
    out["description"] = f"{profiles[0].get('description', '')} (the median of {len(profiles)} profiles)".strip()
    return out


def _get(p: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        p = p.get(part) if isinstance(p, dict) else None
    return p


def _command(p: dict) -> str | None:
    """The command of one of `p`'s measured numbers (every one has the profile's own)."""
    stack = [p]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            if d.get("source") == "measured" and "command" in d:
                return d["command"]
            stack.extend(v for v in d.values() if isinstance(v, dict))
    return None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _merge(ds: list, n: int) -> Any:
    """The median of `ds`, the same node of each profile (dicts merged key by key)."""
    first = ds[0]
    if not isinstance(first, dict):
        return first
    out = {}
    for key, value in first.items():
        values = [d.get(key) for d in ds if isinstance(d, dict)]
        if key in ("value", "rms_residual") and all(_number(v) for v in values):
            out[key] = statistics.median(values)
        elif key == "rows" and all(isinstance(v, list) for v in values):
            out[key] = median_rows(values)
        elif key == "points" and all(isinstance(v, list) for v in values):
            out[key] = _median_points(values)
        elif isinstance(value, dict):
            out[key] = _merge([v for v in values if isinstance(v, dict)], n)
        else:
            out[key] = value
    if ("value" in first or "rows" in first) and first.get("source") in ("measured", "derived"):
        out["how"] = f"{first.get('how', '')}; the median of {len(ds)} profiles".lstrip("; ")
    return out


def median_rows(tables: Sequence[list]) -> list:
    """Rows of several tables, merged by key (a row's whole-number and text columns) in the
    order first seen, each float column the median over the tables that have the row.

    >>> median_rows([[["a", 1, 2.0]], [["a", 1, 4.0], ["b", 2, 1.0]], [["a", 1, 9.0]]])
    [['a', 1, 4.0], ['b', 2, 1.0]]
    """
    groups: dict = {}
    for table in tables:
        for r in table:
            key = tuple(None if isinstance(x, float) else (tuple(x) if isinstance(x, list) else x) for x in r)
            groups.setdefault(key, []).append(r)
    return [[statistics.median(r[i] for r in rs) if k is None else rs[0][i] for i, k in enumerate(key)]
            for key, rs in groups.items()]


def _median_points(tables: Sequence[list]) -> list:
    """[size, seconds] points: the median seconds at each size where every table has the same
    sizes, else the first table's."""
    sizes = [[p[0] for p in t] for t in tables]
    if any(s != sizes[0] for s in sizes):
        return tables[0]
    return [[size, statistics.median(t[i][1] for t in tables)] for i, size in enumerate(sizes[0])]
