"""The planner: from a model, a device profile and a cluster to a simulated step, and the search over layouts.

The flow, a module each: `layout` (the record `Layout` of a run's sizes and choices, and its
checks) -> the cost layer (`sim.cost`: a layer, the ends, data parallelism on the device) ->
`stage_costs` (what each pipeline stage costs on the device) -> `steps` (those steps cached for
one model and profile) -> `estimation` (the simulated step on the engine: time, memory, fit) ->
`space` and `bounds` (the layouts searched, and lower bounds on each) -> `planner` (the search,
`sim.plan.search`). `python -m sim.plan` is its command line.
"""
from sim.plan.planner import Plan, Row, rank_key, rank_of, search
from sim.plan.layout import Layout

__all__ = ["search", "Plan", "Row", "rank_of", "rank_key", "Layout"]
