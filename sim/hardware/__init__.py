"""The hardware as the planner sees it: GPU datasheets, device profiles, kernels, the network and the nodes."""
