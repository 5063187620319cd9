"""What the simulator needs, measured: calibration inside the ranks, its link measurements, the load on the machine, the fit into `sim.Costs`, and the comparison of measured with simulated steps."""
