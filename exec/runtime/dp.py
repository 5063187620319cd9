"""Data parallelism: pp x dp ranks laid out by `sim.hardware.topology.Topology`, a replica's view of its pipeline, its shard of the batch, and the gradient reduction on a collective stream.

    >>> topo = Topology(tp=1, pp=2, dp=2)
    >>> [topo.rank(0, d, p) for p in range(2) for d in range(2)]   # (replica, pipeline rank) -> world rank
    [0, 1, 2, 3]
    >>> topo.group_of("dp", 2), topo.group_of("pp", 3)             # a data-parallel group, a pipeline
    ((2, 3), (1, 3))

A run of `dp` pipeline replicas of `pp` ranks each has `pp * dp` processes. They are
numbered as the simulator numbers a run's GPUs (`sim.hardware.topology.Topology`,
Megatron-LM's default order, with tp = 1): the data-parallel index fastest, then the
pipeline rank, so world rank = pipeline rank * dp + replica. The ranks that hold the same
pipeline position in every replica form one data-parallel process group
(`torch.distributed.new_group`); all the stages a rank hosts reduce over it (docs/rules.md,
rule 13).

`ReplicaContext` is what a rank of a replica passes where `exec` takes a rank context
(`exec.launch.processes.RankContext`): its `rank` and `world_size` are its pipeline's (the schedule's
rank and rank count), `global_rank(r)` maps pipeline rank r of this replica to the world
rank that point-to-point calls name, and `dp_group` is its data-parallel group.

`CollectiveStream` is a rank's one collective stream: REDUCE_GRAD's all-reduce, issued
asynchronously (`async_op=True`), runs on gloo's own threads while the rank goes on with
its program; the next one is handed to gloo when the one before it has ended (gloo runs
up to two collectives of a group at once on its two threads; the rule is one at a time,
first issued first served). Its marks are the rule's: a reduction starts at the later of
its issue and the end of the one before it, and ends when gloo completes its future.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from sim.hardware.topology import Topology

from exec.runtime.ep import expert_groups

__all__ = ["ReplicaContext", "replica_context", "shard", "CollectiveStream", "Reduction",
           "check_dp"]


def check_dp(dp: int, batch_size: int, micro_batches: int) -> None:
    """Raise ValueError unless `dp` is a positive integer and the batch splits into dp
    shards of `micro_batches` equal micro-batches each."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be an integer >= 1 (the number of pipeline replicas), got {dp!r}")
    if batch_size % (dp * micro_batches):
        raise ValueError(f"the batch of {batch_size} samples does not split into dp x micro_batches = {dp} x {micro_batches} "
                         f"equal micro-batches; choose dp x micro_batches among the divisors of {batch_size}")


@dataclass(frozen=True)
class ReplicaContext:
    """A rank as its pipeline replica sees it (see the module docstring)."""

    rank: int              # pipeline rank: the schedule's
    world_size: int        # pp: the schedule's ranks
    replica: int
    dp: int
    world_rank: int
    local_rank: int
    backend: str
    cores: tuple[int, ...] | None
    dp_group: Any          # the torch.distributed group of this pipeline position
    ep: int = 1            # expert parallelism among the replicas (`exec.runtime.ep`)
    ep_group: Any = None   # with ep > 1: the replicas this rank's MoE layers dispatch tokens to
    edp_group: Any = None  # with ep > 1: the replicas holding the same experts

    @property
    def device(self) -> torch.device:
        return torch.device(f"cuda:{self.local_rank}") if self.backend == "nccl" else torch.device("cpu")

    def global_rank(self, pipe_rank: int) -> int:
        """The world rank of pipeline rank `pipe_rank` of this replica."""
        return Topology(tp=1, pp=self.world_size, dp=self.dp).rank(0, self.replica, pipe_rank)


def replica_context(ctx, pp: int, dp: int, ep: int = 1) -> ReplicaContext:
    """This rank's `ReplicaContext` in a run of `dp` replicas of `pp` ranks, their MoE layers'
    experts spread over `ep` of the replicas (`exec.runtime.ep.expert_groups`). Every rank
    of the world calls it at once: it makes every data-parallel group (`new_group` is a
    collective of the whole world, called for every group in the same order)."""
    topo = Topology(tp=1, pp=pp, dp=dp)
    if ctx.world_size != topo.gpus:
        raise ValueError(f"pp={pp} x dp={dp} needs {topo.gpus} ranks, but the process group has "
                         f"{ctx.world_size}; launch pp * dp processes")
    _, replica, pipe_rank = topo.coords(ctx.rank)
    groups = {g: dist.new_group(list(g)) for g in topo.groups("dp")}
    experts = {}  # (ep or edp, replica indices) -> this rank's group, if it is in it
    if ep > 1:
        for what, sets in zip(("ep", "edp"), expert_groups(dp, ep)):
            for p in range(pp):
                for replicas in sets:
                    group = dist.new_group([topo.rank(0, d, p) for d in replicas])
                    if p == pipe_rank and replica in replicas:
                        experts[what] = group
    return ReplicaContext(pipe_rank, pp, replica, dp, ctx.rank, ctx.local_rank, ctx.backend, ctx.cores,
                          groups[topo.group_of("dp", ctx.rank)], ep, experts.get("ep"), experts.get("edp"))


def shard(inputs: torch.Tensor, targets: torch.Tensor, dp: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica`'s contiguous 1/dp of the batch (samples [replica * n/dp, (replica+1) * n/dp))."""
    n = inputs.shape[0]
    if n % dp:
        raise ValueError(f"the batch of {n} samples does not split into dp={dp} equal shards")
    size = n // dp
    return inputs[replica * size:(replica + 1) * size], targets[replica * size:(replica + 1) * size]


class Reduction:
    """One REDUCE_GRAD in flight: the stage's gradients flattened into one buffer (a
    bucket), averaged over the data-parallel group, and its clock marks. With expert
    parallelism the routed experts' gradients are a second bucket, summed over the
    expert data-parallel group and divided by dp (`exec.runtime.ep`)."""

    def __init__(self, action, params: Sequence[torch.nn.Parameter], issued,
                 experts: Sequence[torch.nn.Parameter] = ()):
        self.action, self.params, self.experts, self.issued = action, list(params), list(experts), issued
        self.buffer, self.expert_buffer = _flat(self.params), _flat(self.experts)
        self.start = self.end = None
        self.done = torch.futures.Future()

    def finish(self) -> None:
        """Wait for the all-reduce, then point each gradient at its slice of the averaged
        buffer (no copy back, as DDP's `gradient_as_bucket_view`)."""
        self.done.wait()
        for params, buffer in ((self.params, self.buffer), (self.experts, self.expert_buffer)):
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = buffer[offset:offset + n].view_as(p)
                offset += n


def _flat(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    return torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)


class CollectiveStream:
    """A rank's one collective stream over its data-parallel `group` (of `size` ranks):
    reductions run one at a time, in the order issued, beside the rank's compute.
    `clock` gives the marks (a CPU clock: gloo's threads take them). `expert_group`: the
    expert data-parallel group where a reduction has routed experts' gradients (ep > 1);
    their all-reduce runs beside the dense one, and the reduction ends with both."""

    def __init__(self, group, size: int, clock, expert_group=None):
        self.group, self.size, self.clock, self.expert_group = group, size, clock, expert_group
        self.tail: torch.futures.Future | None = None
        self.inflight: list[Reduction] = []

    def issue(self, action, params: Sequence[torch.nn.Parameter],
              experts: Sequence[torch.nn.Parameter] = ()) -> Reduction:
        """Flatten the gradients of `params` (and of the routed `experts`) and queue their
        average over the group (the experts' sum over the expert group, over dp); the
        caller goes on at once."""
        r = Reduction(action, params, self.clock.mark(), experts)
        r.buffer.div_(self.size)  # sum of the 1/dp shares = the mean (gloo has no ReduceOp.AVG), as DDP's hook
        r.expert_buffer.div_(self.size)

        def start(_=None) -> None:
            try:
                r.start = self.clock.mark()
                futures = [dist.all_reduce(r.buffer, group=self.group, async_op=True).get_future()]
                if r.experts and self.expert_group is not None and dist.get_world_size(self.expert_group) > 1:
                    futures.append(dist.all_reduce(r.expert_buffer, group=self.expert_group,
                                                   async_op=True).get_future())
                torch.futures.collect_all(futures).then(end)
            except Exception as e:  # noqa: BLE001 - the rank's wait raises it
                r.done.set_exception(e)

        def end(fut) -> None:
            r.end = self.clock.mark()
            try:
                for done in fut.wait():
                    done.wait()
            except Exception as e:  # noqa: BLE001
                r.done.set_exception(e)
                return
            r.done.set_result(None)

        before, self.tail = self.tail, r.done
        if before is None or before.done():
            start()
        else:  # the one before it is still on the stream: hand this one to gloo when it ends
            before.then(start)
        self.inflight.append(r)
        return r

    def finish_all(self) -> list[Reduction]:
        """Wait for every reduction issued (in issue order) and return them."""
        done, self.inflight, self.tail = self.inflight, [], None
        for r in done:
            r.finish()
        return done
