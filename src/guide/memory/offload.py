"""FSDP2's CPU offload, predicted from shapes: the bytes it moves per step and the memory it moves.

``fully_shard(..., offload_policy=CPUOffloadPolicy())`` keeps each rank's sharded parameters,
their gradients and the optimizer state in host memory (pinned by default) and steps the optimizer
on the CPU. **Predicted**, like :mod:`guide.memory.predicted`: nothing here touches a tensor.
:class:`guide.host_copies.HostDeviceCopies` counts the copies a live rank asks for, and the CPU
offload page checks :func:`offload_traffic` against it.

* :func:`offload_traffic`: bytes per rank per synced micro-batch. *Parameters in*: each unit's
  padded shard (``ceil(dim0/N)`` rows of every parameter, in the stored parameter dtype: the copy
  comes before the cast to ``param_dtype``) once per all-gather: the root once (FSDP2 keeps it
  gathered from forward to backward), every other unit twice when it reshards after forward (its
  backward gathers it again). *Gradients out*: each parameter's reduced gradient shard (this rank's
  real rows, in the gradient dtype), once per reduce-scatter.
* :func:`offload_memory`: what leaves the GPU, per rank: the FSDP2 model state of
  :func:`guide.memory.per_rank_state_bytes` (parameter, gradient and optimizer-state shards). The
  host must hold the same bytes, per rank: a node's host RAM must hold them for every GPU of the
  node. The transient buffers (gathered units, unsharded gradients,
  :func:`guide.memory.transient.fsdp2_buffer_bytes`) and the activations stay on the GPU.

Not counted: the staging copy of a unit's shard on the GPU between its host-to-device copy and its
all-gather (one unit's shard, freed after the all-gather), pinned-memory rounding, and time: how
long the copies and the CPU optimizer step take, and how much of it overlaps, only a GPU run shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from guide.layout import chunk_sizes
from guide.memory.architectures import Architecture
from guide.memory.predicted import PRECISIONS, per_rank_state_bytes
from guide.validate import positive_int

__all__ = ["OffloadMemory", "OffloadTraffic", "offload_memory", "offload_traffic"]


@dataclasses.dataclass(frozen=True)
class OffloadTraffic:
    """Bytes one rank copies per synced micro-batch: ``to_device`` (parameter shards in, before
    each all-gather) and ``to_host`` (gradient shards out, after each reduce-scatter), and the
    number of copies of each (one per parameter per all-gather, one per parameter per
    reduce-scatter)."""

    to_device: int
    to_host: int
    to_device_copies: int
    to_host_copies: int


@dataclasses.dataclass(frozen=True)
class OffloadMemory:
    """Per rank: ``gpu_saved``, the model state that leaves the GPU (``params``, ``grads``,
    ``optimizer``: FSDP2's shards), equal to ``host``, the host RAM it needs there."""

    params: int
    grads: int
    optimizer: int

    @property
    def gpu_saved(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def host(self) -> int:
        return self.gpu_saved


def _rows(shape: Sequence[int]) -> tuple[int, int]:
    return (shape[0], math.prod(shape[1:])) if len(shape) else (1, 1)


def offload_traffic(units: Sequence[Sequence[Sequence[int]]], world_size: int, precision: str,
                    *, rank: int = 0, reshard_after_forward: bool = True) -> OffloadTraffic:
    """The host-device bytes of one synced micro-batch on ``rank`` (see the module docstring).

    ``units``: the parameter shapes of each ``fully_shard`` unit, the root first (as
    :meth:`guide.memory.Architecture.fsdp2_units` and :func:`guide.sharding.fsdp2_units` give
    them). ``reshard_after_forward`` is the non-root units' setting (the root is gathered once).
    """
    n = positive_int("world_size", world_size, "the number of ranks")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ValueError(f"rank must be an integer in [0, {n}), got {rank!r}.")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}.")
    if not units:
        raise ValueError("units is empty: pass the root's shapes, then each block's.")
    p = PRECISIONS[precision]
    to_device = to_host = copies_in = copies_out = 0
    split: dict[int, list[int]] = {}  # chunk_sizes per distinct dim 0 (the blocks repeat)
    for u, unit in enumerate(units):
        gathers = 1 if u == 0 or not reshard_after_forward else 2
        padded = real = 0
        for shape in unit:
            dim0, row = _rows(shape)
            if dim0 not in split:
                split[dim0] = chunk_sizes(dim0, n)
            sizes = split[dim0]
            padded += sizes[0] * row
            real += sizes[rank] * row
        to_device += gathers * padded * p.param
        to_host += real * p.grad
        copies_in += gathers * len(unit)
        copies_out += len(unit)
    return OffloadTraffic(to_device, to_host, copies_in, copies_out)


def offload_memory(model: Architecture | Sequence[Sequence[int]], world_size: int,
                   precision: str, optimizer: str) -> OffloadMemory:
    """The FSDP2 model state one rank moves from the GPU to the host under ``CPUOffloadPolicy``
    (the fullest rank's, :func:`guide.memory.per_rank_state_bytes`); ``model`` is an
    :class:`Architecture` or its parameter shapes."""
    shapes = model.param_shapes() if isinstance(model, Architecture) else model
    state = per_rank_state_bytes(shapes, "fsdp2", world_size, precision, optimizer,
                                 ddp_buckets=False)
    return OffloadMemory(state.params, state.grads, state.optimizer)
