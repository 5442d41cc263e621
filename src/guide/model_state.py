"""Measure the model state a rank really holds: bytes of parameters, gradients and optimizer state.

:func:`measure` reads the tensors themselves, inside a rank, between two training steps. It counts
**storages**, not tensor sizes, and each storage once:

* a ``DTensor`` (FSDP2) is read through its local shard, whose storage is FSDP2's *padded* shard
  (``ceil(dim0/N)`` rows), not the unpadded view ``to_local()`` shows;
* FSDP2's gradients of one ``fully_shard`` group are views into one reduce-scatter output buffer:
  one storage, counted once;
* a storage already counted as a parameter is not counted again as a gradient or optimizer state
  (e.g. DDP's ``gradient_as_bucket_view=True`` makes grads views of the buckets; tied weights).

The optimizer state is read from ``optimizer.state``; for
:class:`~torch.distributed.optim.ZeroRedundancyOptimizer` from the local optimizer it wraps, which
holds only this rank's partition. The result is a :class:`guide.memory.StateBytes`, comparable
byte for byte with :func:`guide.memory.per_rank_state_bytes`.

:func:`ddp_bucket_bytes` reads the size of DDP's gradient buckets, which live in the C++ reducer and
are invisible to :func:`measure`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from guide.memory import StateBytes

__all__ = ["ddp_bucket_bytes", "local_tensor", "measure", "param_shapes", "storage_bytes",
           "total_bytes"]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores: a DTensor's local shard, anything else as is."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t._local_tensor  # the padded-storage view, same as to_local() without autograd
    return t


def _tensors(obj) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj`` (dicts, lists, tuples), depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def storage_bytes(tensors: Iterable[torch.Tensor], seen: set[tuple[str, int]] | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors``; storages in ``seen`` are skipped and new
    ones added to it, so one ``seen`` set shared across calls counts every storage once."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        storage = local_tensor(t).untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            continue
        key = (str(storage.device), storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def _optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.optim.state  # this rank's partition only
    return optimizer.state


def measure(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Bytes of parameters, gradients and optimizer state this rank holds now (unique storages).

    Call it inside a rank after ``optimizer.step()`` and before the next ``zero_grad()`` so the
    gradients are there. ``optimizer=None`` measures parameters and gradients only.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"measure() needs the nn.Module being trained, got {type(model).__name__}.")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("measure() needs a torch.optim.Optimizer (or None), "
                         f"got {type(optimizer).__name__}.")
    seen: set[tuple[str, int]] = set()
    params = list(model.parameters())
    p = storage_bytes(params, seen)
    g = storage_bytes((q.grad for q in params if q.grad is not None), seen)
    o = 0 if optimizer is None else storage_bytes(_tensors(_optimizer_state(optimizer)), seen)
    return StateBytes(params=p, grads=g, optimizer=o)


def total_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """:func:`measure`'s total plus, for a ``DistributedDataParallel`` model, its gradient buckets
    (:func:`ddp_bucket_bytes`): the measured counterpart of
    :func:`guide.memory.per_rank_total_bytes`. Same timing as :func:`measure`."""
    from torch.nn.parallel import DistributedDataParallel

    buckets = ddp_bucket_bytes(model) if isinstance(model, DistributedDataParallel) else 0
    return measure(model, optimizer).total + buckets


def param_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The global shape of every parameter, in ``model.parameters()`` order (the input
    :func:`guide.memory.per_rank_state_bytes` expects). Works before or after ``fully_shard``."""
    return [tuple(q.shape) for q in model.parameters()]


def ddp_bucket_bytes(ddp_model: nn.Module) -> int:
    """Bytes of the gradient buckets a ``DistributedDataParallel`` model's reducer holds.

    Read from DDP's own logging data (``bucket_sizes``, in bytes), available after the first
    backward. With ``gradient_as_bucket_view=False`` (the default) this is a second copy of all the
    gradients; compare with :func:`guide.memory.ddp_bucket_bytes`.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise ValueError(f"ddp_bucket_bytes() needs a DistributedDataParallel model, "
                         f"got {type(ddp_model).__name__}.")
    data = ddp_model._get_ddp_logging_data()
    sizes = data.get("bucket_sizes", "")
    if isinstance(sizes, str):
        return sum(int(x) for x in sizes.split(",") if x.strip())
    return int(sum(sizes))
