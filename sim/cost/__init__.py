"""The cost layer: how long a piece of the model takes on a device, from the machine (`sim.hardware`) and the model (`sim.model`).

`slice` (how one GPU holds a layer: `Slice`), `layer` (one transformer layer's F, B, I, W and
recompute on one GPU: its kernels, or the blocks a profile measured inside a step), `context`
(context parallelism's exchanges in the attention core), `ends` (the embedding and the output layer the first
and last stage add), `data_parallel` (the parameters each stage holds, the reduction of their
gradients, ZeRO-3's gathers and FSDP's, the optimizer's step), `fp8` (FP8 training as Transformer Engine
runs it: which GEMMs run in FP8, its casts, what it keeps in memory). It imports nothing of the engine or the planner;
`sim.plan.stage_costs` sums its times into each stage's `sim.Costs`.
"""
