"""The model as the planner sees it: a transformer's parameters, FLOPs, activations and per-layer costs."""
