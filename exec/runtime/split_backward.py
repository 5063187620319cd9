"""The split backward of one stage on torch's autograd graph: I (the input gradient only, keeping what W needs) and W (the weight gradients only, from what I kept).

Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2)
split a stage's backward in two: I computes the gradient with respect to the stage's input,
which the previous stage waits for; W computes the weight gradients, which nobody waits
for, so a schedule can put it in a bubble. This is the same split as torch's
`stage_backward_input` / `stage_backward_weight` (torch/distributed/pipelining/_backward.py),
written out small:

1. `backward_input` finds, in the graph the forward built, the *weight edges*: for each
   parameter, the first nodes on the path from the stage's input to its output that the
   parameter's gradient flows through (for `y = x @ W.T`, the matmul's backward node).
   Parameters that reach the same such node form one group.
2. It registers a pre-hook on each of those nodes and runs `torch.autograd.grad(output,
   input)`: autograd computes only what the input gradient needs (a matmul's backward
   makes dX, not dW), and the hooks keep the gradient that arrived at each node.
3. It drops the graph above those nodes (the stage's output and its loss); what stays is
   what W needs: the nodes and the tensors they saved (a matmul's input), and the
   gradients kept. `kept_bytes` counts them as `exec.runtime.memory.SavedBytes` does.
4. `backward_weight` runs, per group, `torch.autograd.grad` from those nodes, with the kept
   gradients, to the group's parameters only, adds the results to `.grad`, and frees the rest.

Under activation recomputation (`exec.models.layers.recomputed`, torch.utils.checkpoint) the graph
is the same and its saved tensors are recomputed on first use: I recomputes each block's
forward. W recomputes it once more: torch's checkpoint hands each recomputed tensor out once
per backward call, and a weight-edge node that I runs (for its input gradient) uses the
tensors W needs too (a matmul's input). W's calls, one per group, share one recomputation
(`GraphExecGroup`); between I and W the stage keeps only the blocks' inputs.

Where the input needs no gradient (the first stage) there are no weight edges to cut at: I
keeps the whole graph and does nothing, and W is the whole backward, to the weights only
(torch does the same). So is any stage with a parameter that no path from its input
reaches (its gradient could not be cut from I's walk).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

try:  # a checkpointed region recomputes once for all the backward calls inside it (pytorch/pytorch#166536)
    from torch.utils.checkpoint import GraphExecGroup as _OneRecompute
except ImportError:  # older torch: each of W's calls recomputes (the same numbers, more time)
    _OneRecompute = contextlib.nullcontext

__all__ = ["WeightWork", "backward_input", "backward_weight"]


@dataclass
class _Group:
    """Parameters whose gradients flow through the same nodes of the input's path."""

    nodes: list[Node]                                  # the nodes where W starts
    accs: list[Node]                                   # the parameters' AccumulateGrad nodes
    grads: dict[int, tuple] = field(default_factory=dict)  # index in nodes -> gradients that arrived in I


@dataclass
class WeightWork:
    """What I leaves for W: the groups to finish, or (`whole`) the output and its gradient,
    when W is the whole backward to the weights."""

    groups: list[_Group]
    whole: tuple[torch.Tensor, torch.Tensor | None] | None = None
    params: list[torch.Tensor] = field(default_factory=list)


def _node_of(t: torch.Tensor) -> Node | None:
    """The node that takes `t`'s gradient: its grad_fn, or for a leaf its AccumulateGrad
    (made on demand: a view of the leaf has it as its first next function)."""
    if t.grad_fn is not None or not t.requires_grad:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0]


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """Every node of the graph below `root`, with the nodes that feed it a gradient."""
    users: dict[Node, list[Node]] = {root: []}
    todo = [root]
    while todo:
        node = todo.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if nxt not in users:
                users[nxt] = []
                todo.append(nxt)
            users[nxt].append(node)
    return users


def _above(starts, users: dict[Node, list[Node]], stop=frozenset()) -> tuple[set[Node], set[Node]]:
    """The nodes reached from `starts` towards the output, not going past `stop`; and
    the nodes of `stop` reached."""
    seen, hit, todo = set(starts), set(), list(starts)
    while todo:
        for user in users[todo.pop()]:
            if user in stop:
                hit.add(user)
            elif user not in seen:
                seen.add(user)
                todo.append(user)
    return seen, hit


def _groups(out: torch.Tensor, x: torch.Tensor, params: list[torch.Tensor]) -> list[_Group] | None:
    """The weight edges of the graph from `x` to `out`, grouped (step 1 above); None if a
    parameter in the graph reaches no node of the input's path."""
    users = _consumers(out.grad_fn)
    x_node = _node_of(x)
    if x_node not in users:
        return None
    path, _ = _above([x_node], users)          # the nodes between the input and the output
    by_node: dict[Node, _Group] = {}
    for p in params:
        acc = _node_of(p) if p.requires_grad else None
        if acc not in users:
            continue                             # not used by this forward: no gradient
        _, hit = _above([acc], users, stop=path)
        if not hit:
            return None
        found = list({id(by_node[n]): by_node[n] for n in hit if n in by_node}.values())
        group = found[0] if found else _Group([], [])
        for other in found[1:]:                  # p reaches two groups' nodes: one group
            group.nodes += other.nodes
            group.accs += other.accs
            for m in other.nodes:
                by_node[m] = group
        group.accs.append(acc)
        for n in hit:
            if n not in by_node:
                group.nodes.append(n)
                by_node[n] = group
    return list({id(g): g for g in by_node.values()}.values())


def _keeper(group: _Group, i: int):
    """A pre-hook that keeps the gradient arriving at `group.nodes[i]` during I."""
    def keep(grads):
        group.grads[i] = grads
    return keep


def backward_input(out: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor | None,
                   params: list[torch.Tensor]) -> tuple[torch.Tensor | None, WeightWork]:
    """I: the gradient of the stage's output `out` (or loss, `grad` None) with respect to
    its input `x`, and what W needs to finish. No input gradient (None) if `x` is None or
    needs none; then W does the whole backward."""
    groups = _groups(out, x, params) if x is not None and x.requires_grad else None
    if groups is None:
        return None, WeightWork([], (out, grad), params)
    handles = []
    for g in groups:
        for i, node in enumerate(g.nodes):
            handles.append(node.register_prehook(_keeper(g, i)))
    try:
        (dx,) = torch.autograd.grad(out, x, grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    if out._base is None:  # drop the graph above the weight edges: W starts below them
        out.detach_()      # (a view cannot be detached in place; the caller's dropping it does)
    return dx, WeightWork(groups)


def backward_weight(work: WeightWork) -> None:
    """W: the weight gradients from what I kept, added to each parameter's `.grad`; frees
    what I kept. A recomputed block is recomputed once for all of W's calls."""
    with _OneRecompute():
        _weight_gradients(work)


def _weight_gradients(work: WeightWork) -> None:
    if work.whole is not None:
        out, grad = work.whole
        torch.autograd.backward(out, grad, inputs=[p for p in work.params if p.requires_grad])
        work.whole = None
        return
    for g in work.groups:
        edges, grads = [], []
        for i, node in enumerate(g.nodes):
            for j, gi in enumerate(g.grads.get(i, ())):
                if gi is not None:
                    edges.append(GradientEdge(node, j))
                    grads.append(gi)
        handles = []
        if len(g.nodes) > 1:  # a gradient reaches a node once, with what I saw, not again through another
            handles = [node.register_prehook(lambda _, kept=g.grads.get(i): kept) for i, node in enumerate(g.nodes)]
        try:
            if edges:  # autograd's own AccumulateGrad adds to .grad, as in a full backward
                torch.autograd.backward(edges, grads, inputs=[a.variable for a in g.accs])
        finally:
            for h in handles:
                h.remove()
    work.groups = []
