"""The planner: from a model, a device profile and a cluster to a simulated step, and the search over layouts.

The flow, a module each: `layout` (the records `Cluster`, `Parallel`, `Run`, the `Layout` they
compose, and its checks) -> the cost layer
(`sim.cost`: a layer, the ends, data parallelism on the device) -> `stage_costs` (what each
pipeline stage costs on the device) -> `estimation` (the simulated step on the engine: time,
memory, fit) -> `planner` (the search over layouts, `sim.plan.search`). `python -m sim.plan` is its command line.
"""
from sim.plan.planner import Plan, Row, rank_key, rank_of, search
from sim.plan.space import Config
from sim.plan.layout import Cluster, Parallel, Run

__all__ = ["search", "Plan", "Config", "Row", "rank_of", "rank_key", "Cluster", "Parallel", "Run"]
