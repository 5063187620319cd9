"""The machine: GPU datasheets, device profiles and their measured tables, kernels, the network and the nodes; it imports nothing of the rest of sim."""
