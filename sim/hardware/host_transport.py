"""A device profile's optional host transport: the executor's CPU-rank costs around its transfers and computes, for the planner.

The section `host_transport` of a profile (docs/profiles.md) names the runtime whose own
calls it measured and gives its six numbers, each with its provenance: `send_overhead`,
`recv_overhead`, `arrive_overhead` (docs/rules.md rules 2, 3, 9), `io_tick` (rule 10),
`before_compute`, `after_compute` (rule 11), and optionally `first_compute` and
`first_compute_tau` (rule 19: profiles before it have none, and their steps get none; a profile
with `first_compute` but no tau gives every first compute all of it). `exec.profile_device` measures them on gloo CPU
ranks; GPU profiles have none. `read` turns the section into plain numbers under the names of
the `sim.Costs` fields they set, which the planner hands to the engine
(`sim.plan.stage_costs.stage_costs`); hardware imports nothing of the engine, and
tests/test_host_transport.py checks that these names are the engine's.
"""
from __future__ import annotations

from typing import Callable, Mapping

__all__ = ["NAMES", "FIELDS", "OPTIONAL", "read"]

NAMES = ("gloo-cpu",)  # the transports (`sim.engine.transports.TRANSPORTS`) whose call costs a profile can give
# the calls (rules 2, 3, 9, 10: the engine's `CALL_FIELDS`) and the runtime's time around a compute (rule 11)
FIELDS = ("send_overhead", "recv_overhead", "arrive_overhead", "io_tick", "before_compute", "after_compute")
OPTIONAL = ("first_compute", "first_compute_tau")  # rule 19: the first compute of a rank's step, its recovery


def read(section: Mapping | None, number: Callable, fail: Callable) -> dict | None:
    """The `sim.Costs` fields of a profile's `host_transport` section (`transport`, the six
    seconds and `first_compute`, `first_compute_tau` where given), or None without one. `number(path, positive=False)` reads and checks one
    sourced number; `fail(message)` refuses the profile (both the profile reader's)."""
    if section is None:
        return None
    if section.get("name") not in NAMES:
        fail(f"host_transport.name must be one of {', '.join(NAMES)}; got {section.get('name')!r}")
    unknown = sorted(set(section) - {"name", *FIELDS, *OPTIONAL})
    if unknown:
        fail(f"host_transport has unknown fields {', '.join(unknown)}; it takes name and "
             f"{', '.join(FIELDS)} (and optionally {', '.join(OPTIONAL)})")
    given = [f for f in (*FIELDS, *OPTIONAL) if f in FIELDS or f in section]
    return {"transport": section["name"], **{f: number(f"host_transport.{f}", positive=False) for f in given}}
