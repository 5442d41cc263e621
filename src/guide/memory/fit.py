"""Will it fit? Per-GPU bytes of the five data-parallel layouts, against one GPU's memory.

What a reader asks the calculator: for a model, a precision, an optimizer and a micro-batch, how
many bytes does each GPU hold under each strategy, split into parameters, gradients, optimizer
state, DDP's buckets, activations and the step's transient buffers; does that fit a GPU; and what
is the smallest number of GPUs that fits. Every number is :mod:`guide.memory.predicted`'s (model
state, to the byte of tensor storage) plus :func:`guide.memory.activation_bytes` (the per-operation
count of the blocks, the logits and their gradient) plus :mod:`guide.memory.transient`'s autocast
weight copies (DDP, ZeRO-1) and FSDP2 buffers (root and two blocks gathered, one block's gradient
buffers). The browser widget
(``docs/_static/memory_widget.js``) is a port of this module, checked against it number by number.

The layouts (:data:`FIT_STRATEGIES`), on ``N`` GPUs:

* ``ddp``: every GPU holds everything, plus DDP's gradient buckets (``ddp_buckets``).
* ``zero1`` (labelled *DDP + ZeroRedundancyOptimizer*): torch's
  ``ZeroRedundancyOptimizer`` over DDP, under autocast: the optimizer state split by whole
  parameter, parameters, gradients and DDP's buckets replicated. The ZeRO paper's stage 1 is
  different (an even flat partition, fp16 parameters and gradients: ``state_bytes_for_count``).
* ``fsdp2_no_reshard`` (labelled *FSDP2, reshard_after_forward=False*, often called ZeRO-2):
  ``fully_shard(..., reshard_after_forward=False)``.
  Between steps it holds what FSDP2 holds (parameter, gradient and optimizer shards). After a
  unit's forward it does *not* free the parameters it all-gathered: each unit keeps its unsharded
  parameters (in the compute dtype, padded to ``N`` equal chunks) until its backward has used them.
  At the start of the backward every unit's copy is alive at once: all parameters, unsharded, on
  every GPU, on top of the shards. That is :func:`~guide.memory.unsharded_param_bytes`, counted in
  :attr:`GpuSplit.unsharded`. Gradients and optimizer state stay sharded: ZeRO stage 2's memory
  at its peak (replicated parameters, sharded gradients and optimizer state), hence that name.
* ``fsdp2``: ``fully_shard`` with resharding: parameters, gradients and optimizer state sharded
  over all ``N`` GPUs, plus the transient buffers of
  :func:`guide.memory.transient.fsdp2_buffer_bytes` in :attr:`GpuSplit.buffers`.
* ``hsdp``: FSDP2 on a 2-D mesh ``(N / G, G)``: each parameter is sharded over a *shard group* of
  ``G`` GPUs (one node: ``shard_group``, default :data:`DEFAULT_SHARD_GROUP`) and replicated over
  the ``N / G`` groups. A GPU holds what FSDP2 on ``G`` GPUs holds, whatever ``N`` is; on fewer than
  ``G`` GPUs the one group is all of them. ``N`` must be a multiple of ``G`` (else the mesh does not
  exist: :func:`hsdp_shard_size` says so). No DDP buckets.

Not counted: the CUDA context, NCCL's buffers, the optimizer step's temporaries, the caching
allocator's rounding and fragmentation (reserved over allocated).
*Fits* means the predicted bytes are at most the GPU's
memory; the *headroom* is what is left (negative: missing), and the things not counted come out of
it. The smallest ``N`` is searched over :data:`FIT_WORLD_SIZES` (powers of two up to 4,096).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from guide.constants import CONSTANTS
from guide.memory.activations import activation_bytes
from guide.memory.architectures import Architecture
from guide.memory.predicted import (
    GPU_MEMORY_CONSTANTS,
    PRECISIONS,
    WORLD_SIZES,
    per_rank_state_bytes,
    state_bytes_for_count,
    unsharded_param_bytes,
)
from guide.memory.state import GiB
from guide.memory.transient import autocast_weight_bytes, fsdp2_buffer_bytes
from guide.sharding import Strategy
from guide.validate import positive_int

__all__ = ["DEFAULT_SHARD_GROUP", "FIT_LABELS", "FIT_STRATEGIES", "FIT_WORLD_SIZES", "GPU_BYTES",
           "GpuSplit", "capacity_bytes", "fit_report", "hsdp_shard_size", "min_world_size",
           "per_gpu", "smallest_world_size"]

#: The layouts the calculator prices, in the order it shows them (see the module docstring).
FIT_STRATEGIES = ("ddp", "zero1", "fsdp2_no_reshard", "fsdp2", "hsdp")
#: How the calculator names them.
FIT_LABELS = {"ddp": "DDP", "zero1": "DDP + ZeroRedundancyOptimizer",
              "fsdp2_no_reshard": "FSDP2, reshard_after_forward=False",
              "fsdp2": "FSDP2", "hsdp": "HSDP", "zero2": "ZeRO-2 (the paper's, analytic)"}
#: GPUs per HSDP shard group unless told: one node of 8 GPUs.
DEFAULT_SHARD_GROUP = 8
#: The world sizes the smallest fitting ``N`` is searched over: 1, 2, 4, ..., 4,096.
FIT_WORLD_SIZES = tuple(2**k for k in range(13))
#: Each GPU preset's total memory in bytes (``nvidia-smi``'s MiB, cited in guide.constants).
GPU_BYTES = {gpu: int(CONSTANTS[key].value) * 2**20 for gpu, key in GPU_MEMORY_CONSTANTS.items()}


@dataclasses.dataclass(frozen=True)
class GpuSplit:
    """Predicted bytes on the fullest GPU of one layout at one world size, part by part.

    ``unsharded``: the parameters ``reshard_after_forward=False`` keeps unsharded from forward to
    backward (0 for the other layouts). ``autocast``: the bf16 weight copies autocast saves (DDP,
    ZeRO-1 in mixed precision). ``buffers``: FSDP2's gathered parameters and gradient buffers.
    Both are 0 when the model is a parameter count alone. ``shard_group``: how many GPUs a
    parameter is sharded over
    (1 for DDP and ZeRO-1, ``N`` for ZeRO-2 and FSDP2, ``G`` for HSDP).
    """

    strategy: str
    world_size: int
    shard_group: int
    params: int
    unsharded: int
    grads: int
    optimizer: int
    buckets: int
    activations: int
    autocast: int = 0
    buffers: int = 0

    @property
    def total(self) -> int:
        """Every part added up: what the GPU must hold at the step's peak."""
        return (self.params + self.unsharded + self.grads + self.optimizer + self.buckets
                + self.activations + self.autocast + self.buffers)


def _strategy(key: str) -> str:
    """``key`` if priced here: :data:`FIT_STRATEGIES`, or ``"zero2"`` (the ZeRO paper's stage 2,
    parameters replicated between steps: analytic, no PyTorch wrapper; the command line and the
    widget offer it by name, outside ``all``)."""
    if key not in FIT_LABELS:
        raise ValueError(f"unknown strategy {key!r}; choose one of {', '.join(FIT_LABELS)}.")
    return key


def hsdp_shard_size(world_size: int, shard_group: int) -> int:
    """GPUs one HSDP shard group spans on ``world_size`` GPUs: ``shard_group``, or all of them
    when there are fewer; a ``ValueError`` naming the fix when the 2-D mesh cannot be built."""
    n = positive_int("world_size", world_size, "the number of GPUs")
    g = positive_int("shard_group", shard_group, "GPUs per HSDP shard group")
    if n > g and n % g:
        raise ValueError(f"HSDP needs N to be a multiple of the shard group size {g}, got N={n}; "
                         f"use N={n - n % g} or {n - n % g + g}, or another shard group size.")
    return min(n, g)


def per_gpu(model: Architecture | int, strategy: str, world_size: int, precision: str,
            optimizer: str, *, activations: int, ddp_buckets: bool,
            shard_group: int = DEFAULT_SHARD_GROUP) -> GpuSplit:
    """The fullest GPU's bytes for ``strategy`` (a key of :data:`FIT_STRATEGIES`) on
    ``world_size`` GPUs. ``model`` is an :class:`Architecture` (shapes: exact, with FSDP2's padding
    and ZeRO-1's greedy partition) or a parameter count (ZeRO's ideal 1/N formulas, no padding).
    ``activations``: bytes per GPU (:func:`guide.memory.activation_bytes`, or 0). With an
    :class:`Architecture`, autocast's weight copies and FSDP2's buffers are added
    (:mod:`guide.memory.transient`); a parameter count prices model state alone."""
    key = _strategy(strategy)
    n = positive_int("world_size", world_size, "the number of GPUs")
    group = (hsdp_shard_size(n, shard_group) if key == "hsdp"
             else 1 if key in ("ddp", "zero1") else n)
    priced = "fsdp2" if key == "hsdp" else key
    width = group if key == "hsdp" else n
    if isinstance(model, Architecture):
        shapes = model.param_shapes()
        sb = per_rank_state_bytes(shapes, priced, width, precision, optimizer,
                                  ddp_buckets=ddp_buckets)
        unsharded = (unsharded_param_bytes(shapes, n, precision)
                     if key == "fsdp2_no_reshard" else 0)
        autocast = autocast_weight_bytes(model, key, precision)
        buffers = fsdp2_buffer_bytes(model, key, precision)
    else:
        autocast = buffers = 0
        sb = state_bytes_for_count(model, priced, width, precision, optimizer,
                                   ddp_buckets=ddp_buckets)
        unsharded = model * PRECISIONS[precision].compute if key == "fsdp2_no_reshard" else 0
    if isinstance(activations, bool) or not isinstance(activations, int) or activations < 0:
        raise ValueError(f"activations must be a number of bytes >= 0, got {activations!r}.")
    return GpuSplit(key, n, group, sb.params, unsharded, sb.grads, sb.optimizer, sb.buckets,
                    activations, autocast, buffers)


def capacity_bytes(gpu: str | None = None, gib: float | None = None) -> int:
    """A GPU's memory in bytes: a preset of :data:`GPU_BYTES`, or ``gib`` GiB rounded down to a
    byte (``floor(gib * 2**30)``, the same in Python and JavaScript)."""
    if (gpu is None) == (gib is None):
        raise ValueError("give the GPU's memory once: a GPU preset or its size in GiB.")
    if gpu is not None:
        if gpu not in GPU_BYTES:
            raise ValueError(f"unknown GPU {gpu!r}; choose one of {', '.join(GPU_BYTES)}, "
                             "or give its memory in GiB.")
        return GPU_BYTES[gpu]
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0 \
            or math.isinf(gib):
        raise ValueError(f"GPU memory must be a positive number of GiB, got {gib!r}.")
    return math.floor(gib * GiB)


def smallest_world_size(model: Architecture | int, strategy: str, capacity: int, precision: str,
                        optimizer: str, *, activations: int, ddp_buckets: bool,
                        shard_group: int = DEFAULT_SHARD_GROUP) -> int | None:
    """The smallest ``N`` of :data:`FIT_WORLD_SIZES` (a valid layout: HSDP's N a multiple of its
    group) whose fullest GPU fits in ``capacity`` bytes; ``None`` if none does."""
    positive_int("shard_group", shard_group, "GPUs per HSDP shard group")
    for n in FIT_WORLD_SIZES:
        if strategy == "hsdp" and n > shard_group and n % shard_group:
            continue
        split = per_gpu(model, strategy, n, precision, optimizer, activations=activations,
                        ddp_buckets=ddp_buckets, shard_group=shard_group)
        if split.total <= capacity:
            return n
    return None


def fit_report(model: Architecture | int, strategies: list[str], world_sizes: list[int],
               precision: str, optimizer: str, *, activations: int, ddp_buckets: bool,
               shard_group: int = DEFAULT_SHARD_GROUP,
               capacity: int | None = None) -> dict:
    """Everything the calculator shows, as JSON-ready data: one row per (strategy, N) with every
    part in bytes (HSDP at an N its mesh cannot have: the numbers are ``None`` and ``error`` says
    why) and, given a ``capacity``, whether each fits, its headroom and the smallest fitting N."""
    positive_int("shard_group", shard_group, "GPUs per HSDP shard group")
    rows = []
    for key in strategies:
        for n in world_sizes:
            row: dict = {"strategy": key, "label": FIT_LABELS[_strategy(key)], "N": n}
            try:
                split = per_gpu(model, key, n, precision, optimizer, activations=activations,
                                ddp_buckets=ddp_buckets, shard_group=shard_group)
            except ValueError as err:
                if key != "hsdp":
                    raise
                rows.append({**row, "error": str(err), "shard_group": None,
                             **{part: None for part in _PARTS},
                             **({} if capacity is None else {"fits": None, "headroom": None})})
                continue
            row |= {"shard_group": split.shard_group,
                    **{part: getattr(split, part) for part in _PARTS}}
            if capacity is not None:
                row |= {"fits": split.total <= capacity, "headroom": capacity - split.total}
            rows.append(row)
    report: dict = {"shard_group": shard_group, "rows": rows}
    if capacity is not None:
        report["capacity"] = capacity
        report["world_sizes_searched"] = list(FIT_WORLD_SIZES)
        report["smallest_world_size"] = {
            key: smallest_world_size(model, key, capacity, precision, optimizer,
                                     activations=activations, ddp_buckets=ddp_buckets,
                                     shard_group=shard_group) for key in strategies}
    return report


def min_world_size(arch: Architecture, strategy: Strategy | str, capacity_bytes: float,
                   precision: str, optimizer: str, *, ddp_buckets: bool, seq_len: int | None,
                   micro_batch: int = 1, checkpointing: str = "none", norm: str = "fused",
                   world_sizes: Sequence[int] = WORLD_SIZES) -> int | None:
    """The smallest N in ``world_sizes`` at which the fullest GPU's :func:`per_gpu` total fits
    in ``capacity_bytes``; ``None`` if none does. Every page that states a minimum N calls this
    (or :func:`smallest_world_size`, the same rule over :data:`FIT_WORLD_SIZES`).

    ``seq_len=None`` prices model state and transient buffers without activations; else
    :func:`guide.memory.activation_bytes` of ``micro_batch`` sequences (``checkpointing``,
    ``norm`` as there, activations in ``precision``'s compute dtype). The assumptions are
    keyword-only with no default, so every caller states them.
    """
    key = strategy.value if isinstance(strategy, Strategy) else Strategy.parse(strategy).value
    act = 0 if seq_len is None else activation_bytes(
        arch, seq_len, micro_batch, checkpointing=checkpointing, norm=norm,
        bytes_per_element=PRECISIONS[precision].compute)
    for n in world_sizes:
        if per_gpu(arch, key, n, precision, optimizer, activations=act,
                   ddp_buckets=ddp_buckets).total <= capacity_bytes:
            return n
    return None


_PARTS = ("params", "unsharded", "grads", "optimizer", "buckets", "activations", "autocast",
          "buffers", "total")
