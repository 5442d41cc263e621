"""Predicted bytes per rank: the ZeRO model, counted tensor by tensor from parameter shapes.

*Predicted*, not measured: nothing here touches a tensor. :mod:`guide.memory.measured` reads what a
live rank holds, and the memory examples assert that the two agree to the byte (on CPU gloo ranks,
as tensor storage bytes: the CUDA caching allocator's rounding, the CUDA context and fragmentation
are not modelled and not measured).

The vocabulary is the site's: strategies are :class:`guide.sharding.Strategy` (or its key),
optimizers are :data:`guide.optimizers.OPTIMIZERS` (their ``moments`` and ``step_bytes``), precisions
are :data:`~guide.memory.PRECISIONS` below.

* **Strategies**:

  - DDP: every rank holds everything.
  - ZeRO-1 (torch's, not the paper's stage 1): DDP + :class:`torch.distributed.optim.ZeroRedundancyOptimizer`. Optimizer state is
    split **by whole parameter**, greedily (largest first, each to the rank with the fewest elements
    so far), as ``ZeroRedundancyOptimizer._partition_parameters`` does; not exactly 1/N, so the
    model replays the partition from the shapes (:func:`~guide.memory.zero1_partition`).
  - ZeRO-2: the paper's stage 2 (gradients and optimizer state split evenly, parameters
    replicated). PyTorch has no such wrapper; it is here for the paper's Figure 1, analytic only.
  - FSDP2 (``fully_shard``) and FSDP2 without resharding (``reshard_after_forward=False``): every
    parameter is a ``Shard(0)`` DTensor split like ``torch.chunk``: ``ceil(dim0/N)`` rows per rank
    until the rows run out, so the last ranks get what is left, possibly nothing. Every rank
    *allocates* ``ceil(dim0/N)`` rows of each parameter and gradient (FSDP2 pads its shards); the
    optimizer state is built from the unpadded local view, so it holds the rank's real rows only.
    Both FSDP2 modes hold the same state between steps;
    :func:`~guide.memory.unsharded_param_bytes` is what ``reshard_after_forward=False`` keeps from
    forward to backward on top.

* **DDP's gradient buckets** are decided in one place: the keyword ``ddp_buckets`` (no default) of
  :func:`~guide.memory.state_bytes_by_rank`, :func:`~guide.memory.per_rank_state_bytes` and
  :func:`~guide.memory.state_bytes_for_count`. ``ddp_buckets=True`` is DDP's default
  (``gradient_as_bucket_view=False``): the strategies with DDP underneath (DDP, ZeRO-1) hold one
  more copy of every gradient, in :attr:`~guide.memory.StateBytes.buckets`. ``False`` models
  ``gradient_as_bucket_view=True``. :attr:`~guide.memory.StateBytes.model_state` never includes
  them; ``.total`` does.

* **Activations** are :mod:`guide.memory.activations`' count and the step's transient buffers
  :mod:`guide.memory.transient`'s; :func:`guide.memory.fit.per_gpu` adds them to this model state
  (and :func:`guide.memory.min_world_size` searches its totals).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Sequence

from guide.constants import CONSTANTS
from guide.layout import chunk_sizes
from guide.memory.architectures import Shape
from guide.memory.state import StateBytes
from guide.sharding import Strategy
from guide.optimizers import OPTIMIZERS, Optimizer
from guide.validate import positive_int

__all__ = ["GPU_MEMORY_CONSTANTS", "GPU_TOTAL_MEMORY_GIB", "PRECISIONS", "WORLD_SIZES", "Precision",
           "per_rank_state_bytes", "state_bytes_by_rank", "state_bytes_for_count",
           "unsharded_param_bytes", "zero1_partition"]

#: The cited constant (:data:`guide.constants.CONSTANTS`, in MiB, with its source) behind each
#: GPU's entry in :data:`GPU_TOTAL_MEMORY_GIB`: a page that states a GPU's memory cites it with
#: ``constants.cite(ledger, GPU_MEMORY_CONSTANTS[gpu])``.
GPU_MEMORY_CONSTANTS = {"H100 (80 GB)": "h100.memory_total", "H200 (141 GB)": "h200.memory_total"}


def _total_gib(constant: str) -> float:
    c = CONSTANTS[constant]
    if c.unit != "MiB":
        raise ValueError(f"guide.constants: {constant} must be in MiB (nvidia-smi's unit), "
                         f"not {c.unit}.")
    return c.value / 1024


#: The *total* memory ``nvidia-smi`` reports for one GPU (``memory.total``), in GiB, keyed by the
#: GPU's marketing name. It is not what training can use: the CUDA context, NCCL's buffers and the
#: caching allocator's fragmentation take part of it, and none of them is predicted here. A
#: configuration that "just fits" under it may not.
GPU_TOTAL_MEMORY_GIB = {gpu: _total_gib(key) for gpu, key in GPU_MEMORY_CONSTANTS.items()}

#: The world sizes :func:`guide.memory.min_world_size` tries by default: powers of two up to 1,024.
WORLD_SIZES = tuple(2**k for k in range(11))


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of state under one precision recipe.

    ``param``, ``grad``: the stored parameter and its gradient; ``moment``: each optimizer moment;
    ``master``: an fp32 master copy kept *inside* the optimizer (ZeRO's accounting); ``compute``:
    the unsharded parameter a layer computes with (what FSDP2 all-gathers).
    """

    key: str
    label: str
    param: int
    grad: int
    moment: int
    master: int
    compute: int


#: The precisions the site prices, by key. ``bf16_mixed`` is PyTorch's mixed precision: the stored
#: parameter *is* the fp32 master (FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16,
#: reduce_dtype=fp32)``, or DDP under ``torch.autocast``), so its model state equals fp32's;
#: ``zero_mixed`` is the ZeRO paper's (fp16/bf16 weights and grads, fp32 master + moments: K = 12).
#: With AdamW fp32, bf16_mixed and zero_mixed are 16 bytes per parameter; pure bf16 is 8.
PRECISIONS: dict[str, Precision] = {p.key: p for p in (
    Precision("fp32", "fp32", param=4, grad=4, moment=4, master=0, compute=4),
    Precision("bf16_mixed", "bf16 compute, fp32 master", param=4, grad=4, moment=4, master=0,
              compute=2),
    Precision("bf16", "pure bf16", param=2, grad=2, moment=2, master=0, compute=2),
    Precision("zero_mixed", "ZeRO's mixed precision", param=2, grad=2, moment=4, master=4,
              compute=2),
)}


# -- vocabulary and validation -----------------------------------------------------------------


def _precision(key: str) -> Precision:
    if key not in PRECISIONS:
        raise ValueError(f"unknown precision {key!r}; choose one of {', '.join(PRECISIONS)}.")
    return PRECISIONS[key]


def _optimizer(key: str) -> Optimizer:
    if key not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {key!r}; choose one of {', '.join(OPTIMIZERS)}.")
    return OPTIMIZERS[key]


def _shapes(param_shapes: Sequence[Sequence[int]]) -> list[Shape]:
    if isinstance(param_shapes, (str, bytes)) or not isinstance(param_shapes, Sequence):
        raise ValueError("param_shapes must be a sequence of shapes such as [(4096, 4096), (4096,)], "
                         f"got {type(param_shapes).__name__}.")
    if not param_shapes:
        raise ValueError("param_shapes is empty: pass one shape per parameter tensor.")
    shapes = []
    for i, shape in enumerate(param_shapes):
        try:
            dims = tuple(shape)
        except TypeError:
            raise ValueError(f"param_shapes[{i}] = {shape!r} is not a shape; "
                             "pass a tuple of dimension sizes.") from None
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ValueError(f"param_shapes[{i}] = {shape!r}: every dimension must be an integer >= 0.")
        shapes.append(dims)
    return shapes


def _rows(shape: Shape) -> tuple[int, int]:
    """(dim 0, elements per row); a 0-d tensor is one row of one element."""
    return (shape[0], math.prod(shape[1:])) if shape else (1, 1)


def _bucket_bytes(strategy: Strategy, n_elements: int, precision: Precision, ddp_buckets: bool) -> int:
    """The one place that decides whether DDP's gradient buckets are counted: one more copy of
    every gradient where DDP is underneath and ``ddp_buckets`` (DDP's default) is on."""
    if not isinstance(ddp_buckets, bool):
        raise ValueError("ddp_buckets must be True (DDP's default, gradient_as_bucket_view=False: its "
                         "reducer keeps a second copy of the gradients) or False "
                         f"(gradient_as_bucket_view=True), got {ddp_buckets!r}.")
    return n_elements * precision.grad if ddp_buckets and strategy.ddp_underneath else 0


# -- the shape-based model (what PyTorch allocates, to the byte) -------------------------------------


def zero1_partition(param_shapes: Sequence[Sequence[int]], world_size: int) -> list[list[int]]:
    """Which parameter indices each rank's ``ZeroRedundancyOptimizer`` owns.

    The greedy rule of ``ZeroRedundancyOptimizer._partition_parameters`` (one parameter group):
    sort by ``numel`` descending (stable), give each to the first rank with the fewest elements.
    The ranks wait in a heap of (elements held, rank): the same choice as scanning them all, in
    O(log N) instead of O(N) per parameter (65,536 ranks x 1,137 tensors: 10 s to 0.1 s).
    """
    shapes = _shapes(param_shapes)
    positive_int("world_size", world_size, "the number of ranks")
    order = sorted(range(len(shapes)), key=lambda i: math.prod(shapes[i]), reverse=True)
    heap = [(0, rank) for rank in range(world_size)]  # sorted, so already a heap
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        held, rank = heap[0]  # the fewest elements; among equals, the lowest rank
        owned[rank].append(i)
        heapq.heapreplace(heap, (held + math.prod(shapes[i]), rank))
    return owned


def state_bytes_by_rank(param_shapes: Sequence[Sequence[int]], strategy: Strategy | str,
                        world_size: int, precision: str, optimizer: str, *,
                        ddp_buckets: bool) -> list[StateBytes]:
    """Predicted bytes of every rank, in rank order (see
    :func:`~guide.memory.per_rank_state_bytes`)."""
    shapes = _shapes(param_shapes)
    strategy = Strategy.parse(strategy)
    n = positive_int("world_size", world_size, "the number of ranks")
    pr, opt = _precision(precision), _optimizer(optimizer)
    opt_per_elem = pr.master + opt.moments * pr.moment
    total = sum(math.prod(s) for s in shapes)
    buckets = _bucket_bytes(strategy, total, pr, ddp_buckets)

    if strategy is Strategy.DDP:
        return [StateBytes(total * pr.param, total * pr.grad,
                           total * opt_per_elem + len(shapes) * opt.step_bytes, buckets)] * n
    if strategy is Strategy.ZERO1:
        return [StateBytes(total * pr.param, total * pr.grad,
                           sum(math.prod(shapes[i]) for i in idx) * opt_per_elem
                           + len(idx) * opt.step_bytes, buckets)
                for idx in zero1_partition(shapes, n)]
    if strategy is Strategy.ZERO2:  # DeepSpeed-style flat, even partition of grads and optimizer
        return [StateBytes(total * pr.param, mine * pr.grad,
                           mine * opt_per_elem + (len(shapes) * opt.step_bytes if mine else 0),
                           buckets)
                for mine in chunk_sizes(total, n)]
    # FSDP2: every rank allocates ceil(dim0/N) rows of each parameter and gradient (padded); the
    # optimizer state follows the rank's real (unpadded) rows.
    # Equal shapes split equally: count each (dim0, row) once (a 126-layer model has a few).
    padded, real = 0, [0] * n
    for (dim0, row), count in collections.Counter(_rows(shape) for shape in shapes).items():
        sizes = chunk_sizes(dim0, n)
        padded += sizes[0] * row * count
        for r, rows in enumerate(sizes):
            real[r] += rows * row * count
    return [StateBytes(padded * pr.param, padded * pr.grad,
                       real[r] * opt_per_elem + len(shapes) * opt.step_bytes, buckets)
            for r in range(n)]


def per_rank_state_bytes(param_shapes: Sequence[Sequence[int]], strategy: Strategy | str,
                         world_size: int, precision: str, optimizer: str, *,
                         ddp_buckets: bool) -> StateBytes:
    """Predicted bytes on the rank that holds the most (ties: the lowest rank).

    ``param_shapes`` is one shape per parameter tensor, in ``model.parameters()`` order (the order
    matters only for ZeRO-1's tie-breaking). Exact to the byte for the tensor storage PyTorch
    allocates (asserted against :func:`guide.memory.measure` on CPU gloo ranks), including
    FSDP2's dim-0 padding, ZeRO-1's uneven greedy partition and AdamW's ``step`` tensors.
    ``ddp_buckets``: see the module docstring.

    >>> per_rank_state_bytes([(1024, 1024)], "fsdp2", 8, "fp32", "adamw", ddp_buckets=True).total
    2097156
    """
    per_rank = state_bytes_by_rank(param_shapes, strategy, world_size, precision, optimizer,
                                   ddp_buckets=ddp_buckets)
    return max(per_rank, key=lambda s: s.total)


def unsharded_param_bytes(param_shapes: Sequence[Sequence[int]], world_size: int,
                          precision: str) -> int:
    """Bytes of all parameters unsharded (padded to N equal chunks) in ``precision``'s compute
    dtype: what ``fully_shard(..., reshard_after_forward=False)`` keeps alive from forward to
    backward on top of its shards (2 bytes per element under ``param_dtype=torch.bfloat16``)."""
    shapes = _shapes(param_shapes)
    n = positive_int("world_size", world_size, "the number of ranks")
    padded = 0
    for shape in shapes:
        dim0, row = _rows(shape)
        padded += math.ceil(dim0 / n) * n * row
    return padded * _precision(precision).compute


# -- the count-based model (the ZeRO paper's formulas) ------------------------------------------------


def state_bytes_for_count(n_params: int, strategy: Strategy | str, world_size: int,
                          precision: str, optimizer: str, *, ddp_buckets: bool) -> StateBytes:
    """Predicted per-rank bytes from a parameter count alone (ZeRO §5's formulas).

    Sharded parts are ``ceil(n_params / N)`` elements: an ideal, even partition with no padding and
    no per-tensor ``step``. Use :func:`~guide.memory.per_rank_state_bytes` when the shapes are
    known. ZeRO-1 here is the ideal 1/N (DeepSpeed's flat partition), not PyTorch's per-parameter
    greedy one.

    >>> round(state_bytes_for_count(7_500_000_000, "zero1", 64, "zero_mixed", "adamw",
    ...                             ddp_buckets=False).total / 10**9, 1)
    31.4
    """
    if isinstance(n_params, bool) or not isinstance(n_params, int) or n_params < 0:
        raise ValueError(f"n_params must be an integer >= 0, got {n_params!r}.")
    strategy = Strategy.parse(strategy)
    n = positive_int("world_size", world_size, "the number of ranks")
    pr, opt = _precision(precision), _optimizer(optimizer)
    share = math.ceil(n_params / n)
    p_n = share if strategy.is_fsdp2 else n_params
    g_n = share if strategy is Strategy.ZERO2 or strategy.is_fsdp2 else n_params
    o_n = n_params if strategy is Strategy.DDP else share
    return StateBytes(p_n * pr.param, g_n * pr.grad, o_n * (pr.master + opt.moments * pr.moment),
                      _bucket_bytes(strategy, n_params, pr, ddp_buckets))
