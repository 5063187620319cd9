"""A device profile's optional host transport: the executor's CPU-rank costs around its transfers and computes, for the planner.

The section `host_transport` of a profile (docs/profiles.md) names a transport of
`sim.engine.transports.TRANSPORTS` that models the runtime's own calls and gives its six
numbers, each with its provenance: `send_overhead`, `recv_overhead`, `arrive_overhead`
(docs/rules.md rules 2, 3, 9), `io_tick` (rule 10), `before_compute`, `after_compute`
(rule 11). `exec.profile_device` measures them on gloo CPU ranks; GPU profiles have none.
`read` turns the section into the `sim.Costs` fields it sets.
"""
from __future__ import annotations

from typing import Callable, Mapping

from sim.engine.fields import CALL_FIELDS

__all__ = ["NAMES", "FIELDS", "read"]

NAMES = ("gloo-cpu",)  # the transports whose call costs a profile can give
FIELDS = (*CALL_FIELDS, "before_compute", "after_compute")  # the calls (rules 2, 3, 9, 10) and rule 11


def read(section: Mapping | None, number: Callable, fail: Callable) -> dict | None:
    """The `sim.Costs` fields of a profile's `host_transport` section (`transport` and the six
    seconds), or None without one. `number(path, positive=False)` reads and checks one
    sourced number; `fail(message)` refuses the profile (both the profile reader's)."""
    if section is None:
        return None
    if section.get("name") not in NAMES:
        fail(f"host_transport.name must be one of {', '.join(NAMES)}; got {section.get('name')!r}")
    unknown = sorted(set(section) - {"name", *FIELDS})
    if unknown:
        fail(f"host_transport has unknown fields {', '.join(unknown)}; it takes name and {', '.join(FIELDS)}")
    return {"transport": section["name"], **{f: number(f"host_transport.{f}", positive=False) for f in FIELDS}}
