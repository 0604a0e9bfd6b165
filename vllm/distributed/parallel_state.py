"""The tensor-parallel group: who this process is among the ranks that shard one model.

With no group initialized everything runs as TP=1 and collectives return their input untouched,
so single-process use needs no process group at all.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

_TP_GROUP: dist.ProcessGroup | None = None
_TP_SIZE = 1
_TP_RANK = 0


def initialize_model_parallel(tensor_parallel_size: int = 1) -> None:
    """Use the default process group (already initialized, of `tensor_parallel_size` ranks) for TP.

    Only pure tensor parallelism exists here, so the TP group is the whole world.
    """
    global _TP_GROUP, _TP_SIZE, _TP_RANK
    if tensor_parallel_size == 1:
        _TP_GROUP, _TP_SIZE, _TP_RANK = None, 1, 0
        return
    if not dist.is_initialized():
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} needs torch.distributed initialized first"
        )
    if dist.get_world_size() != tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} but the world has "
            f"{dist.get_world_size()} ranks"
        )
    _TP_GROUP, _TP_SIZE, _TP_RANK = dist.group.WORLD, tensor_parallel_size, dist.get_rank()


def destroy_model_parallel() -> None:
    global _TP_GROUP, _TP_SIZE, _TP_RANK
    _TP_GROUP, _TP_SIZE, _TP_RANK = None, 1, 0


# A layout that `tensor_parallel_layout` sets for its own thread: the getters answer from it there.
_layout = threading.local()


@contextmanager
def tensor_parallel_layout(tensor_parallel_size: int) -> Iterator[None]:
    """Within, in this thread only: layers take the shapes of rank 0 of `tensor_parallel_size`
    ranks. For building a model on the meta device before any worker starts, so that a size that
    does not split (each layer checks its own) is refused up front. The process's own TP state
    stays as it is: an engine stepping on another thread (a server's loop) and the collectives
    never see the layout, and nothing in it may run a collective.
    """
    saved = getattr(_layout, "size", None)
    _layout.size = tensor_parallel_size
    try:
        yield
    finally:
        _layout.size = saved


def get_tensor_model_parallel_world_size() -> int:
    size = getattr(_layout, "size", None)
    return _TP_SIZE if size is None else size


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK if getattr(_layout, "size", None) is None else 0


def tensor_model_parallel_all_reduce(
    x: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> torch.Tensor:
    """All-reduce `x` in place over the TP group (identity at TP=1); returns `x`."""
    if _TP_SIZE > 1:
        dist.all_reduce(x, op=op, group=_TP_GROUP)
    return x


def tensor_model_parallel_broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite `x` on every rank of the TP group with rank `src`'s `x`, in place (identity at
    TP=1); returns `x`. On NCCL the current stream waits for it, the host does not."""
    if _TP_SIZE > 1:
        dist.broadcast(x, src=src, group=_TP_GROUP)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim` (identity at TP=1)."""
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    dist.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=dim)
