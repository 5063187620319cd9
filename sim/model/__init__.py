"""What a model is: a transformer's shape, parameters, FLOPs and activation bytes, the state it holds per parameter, and SageMaker's reference models; no device, no time (those are `sim.cost`'s)."""
