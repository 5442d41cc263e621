"""Measured bytes per rank: what a live rank holds between two training steps.

*Measured*, not predicted: :func:`~guide.memory.measure` reads the tensors themselves, inside a
rank, after ``optimizer.step()`` and before the next ``zero_grad()``. It counts **storages**, not
tensor sizes, each storage once:

* a ``DTensor`` (FSDP2) is read through its local shard (:func:`guide.layout.local_tensor`), whose
  storage is FSDP2's *padded* shard (``ceil(dim0/N)`` rows), not the unpadded ``to_local()`` view;
* FSDP2's gradients of one ``fully_shard`` unit are views into one reduce-scatter output buffer:
  one storage, counted once;
* a storage already counted is not counted again (tied weights; DDP's
  ``gradient_as_bucket_view=True``, which makes the gradients views of the buckets).

The optimizer state is read from ``optimizer.state``; for
:class:`~torch.distributed.optim.ZeroRedundancyOptimizer` from the local optimizer it wraps, which
holds this rank's partition only. DDP's gradient buckets live in the C++ reducer, invisible to the
tensors: :func:`~guide.memory.reducer_bucket_bytes` reads their size from DDP's logging data.

What this is *not*: the process's memory. On CPU these are tensor storage bytes; on CUDA the caching
allocator rounds every block up, and the CUDA context and fragmentation come on top, none of which
is counted here (:mod:`guide.memory.peak` measures the process).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from guide.layout import local_tensor
from guide.memory.state import StateBytes

__all__ = ["measure", "param_shapes", "reducer_bucket_bytes", "storage_bytes"]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
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


def reducer_bucket_bytes(ddp_model: nn.Module) -> int:
    """Measured bytes of the gradient buckets a live ``DistributedDataParallel`` model's reducer
    holds, read from DDP's own logging data (``bucket_sizes``: the bytes of each bucket, joined by
    ``", "``), set when the model is built (its initial buckets; whatever the buckets, every
    gradient is in exactly one of them).

    With ``gradient_as_bucket_view=False`` (the default) they are a second copy of every gradient;
    with ``True`` the gradients are views of them (and :func:`~guide.memory.measure` counts them
    once, as gradients). Compare with the predicted ``StateBytes.buckets`` of
    :mod:`guide.memory.predicted`.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise ValueError(f"reducer_bucket_bytes() needs a DistributedDataParallel model, "
                         f"got {type(ddp_model).__name__}.")
    return sum(int(x) for x in ddp_model._get_ddp_logging_data()["bucket_sizes"].split(","))


def _optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.optim.state  # this rank's partition only
    return optimizer.state


def measure(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Measured bytes this rank holds now: parameters, gradients, optimizer state (unique
    storages) and, for a DDP model with separate buckets, its reducer's gradient buckets.

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
    separate = isinstance(model, DistributedDataParallel) and not model.gradient_as_bucket_view
    return StateBytes(params=p, grads=g, optimizer=o,
                      buckets=reducer_bucket_bytes(model) if separate else 0)


def param_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The global shape of every parameter, in ``model.parameters()`` order (the input
    :mod:`guide.memory.predicted` expects). Works before or after ``fully_shard``."""
    return [tuple(q.shape) for q in model.parameters()]
