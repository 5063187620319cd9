"""The shape handshake: before the first step, every rank learns the shape and dtype of
each tensor it will receive, so that it can post its receives into buffers of the right size.

Stages are visited in order. The rank of stage s runs it once, without gradients, on a
dummy input of the shape the rank of stage s-1 told it (a blocking send of a small int64
header), and tells the rank of stage s+1 its output's shape in turn. A gradient has the
shape of the output it is taken with respect to, so the outputs' shapes are all it takes
(`sim.schedule.kinds.KINDS[kind].tensor_of` says whose output a transfer's tensor is shaped like).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from sim import Schedule

__all__ = ["TensorMeta", "infer_shapes", "comm_device"]


@dataclass(frozen=True)
class TensorMeta:
    """The shape and dtype of a tensor, without its data."""

    shape: tuple[int, ...]
    dtype: torch.dtype


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]
_META_LEN = 10  # dtype index, ndim, up to 8 dims


def infer_shapes(ctx, schedule: Schedule, stage_modules: dict[int, nn.Module],
                 micro_input: torch.Tensor) -> dict[int, TensorMeta]:
    """Shape and dtype of each stage's output for one micro-batch, for the receive buffers.

    Call on every rank at once (`ctx`: its `exec.launch.processes.RankContext`). Returns the metas
    this rank needs: its stages' outputs and their inputs' producers."""
    metas: dict[int, TensorMeta] = {}
    device = ctx.device
    for s in range(schedule.stages):  # stage s mod chain = 0 starts a copy of the model (DualPipe's two)
        here, prev = schedule.rank_of(s), schedule.rank_of(s - 1) if s % schedule.chain else None
        if here != ctx.rank:
            if prev == ctx.rank:  # we own s-1 and must tell rank `here` its input shape
                _send_meta(metas[s - 1], ctx.global_rank(here))
            continue
        if prev is None:
            x = micro_input.to(device)
        else:
            if prev != ctx.rank:
                metas[s - 1] = _recv_meta(ctx.global_rank(prev))
            x = torch.zeros(metas[s - 1].shape, dtype=metas[s - 1].dtype, device=device)
        with torch.no_grad():
            y = stage_modules[s](x)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"stage {s} returned {type(y).__name__}; a stage must return one tensor")
        metas[s] = TensorMeta(tuple(y.shape), y.dtype)
    return metas


def _send_meta(meta: TensorMeta, dst: int) -> None:
    if len(meta.shape) > _META_LEN - 2 or meta.dtype not in _DTYPES:
        raise TypeError(f"cannot send a {meta.dtype} tensor of {len(meta.shape)} dims between stages "
                        f"(at most {_META_LEN - 2} dims, dtypes {', '.join(map(str, _DTYPES))})")
    header = [_DTYPES.index(meta.dtype), len(meta.shape), *meta.shape]
    header += [0] * (_META_LEN - len(header))
    dist.send(torch.tensor(header, dtype=torch.int64, device=comm_device()), dst)


def _recv_meta(src: int) -> TensorMeta:
    header = torch.zeros(_META_LEN, dtype=torch.int64, device=comm_device())
    dist.recv(header, src)
    h = header.tolist()
    return TensorMeta(tuple(h[2:2 + h[1]]), _DTYPES[h[0]])


def comm_device() -> torch.device:
    """Where the process group's messages live: the current GPU for nccl, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
