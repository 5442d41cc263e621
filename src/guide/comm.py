"""Communication, counted: every collective a rank issues, what it moves, and what it should move.

Three things live here, because each page that talks about communication needs all three:

1. **Counting, inside a rank.** :class:`CollectiveLog` is a context manager a worker wraps around one or
   more training steps. While it is active it wraps the Python collectives of
   :mod:`torch.distributed` (``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``,
   ``broadcast``, ...) and records one :class:`Collective` per call: kind, dtype, element count, bytes,
   and the phase of the step it ran in. It also reads the bytes this process actually wrote to its
   sockets (``wchar`` in ``/proc/self/io``), which is what the backend put on the wire.
2. **The analytical model.** :func:`ddp_step`, :func:`fsdp2_step` and :func:`zero1_step` list the
   collectives one step *should* issue, from parameter shapes alone (FSDP2's dim-0 padding included),
   so a page can assert measurement against theory.
3. **Cost.** :func:`zero_volume` (ZeRO's element accounting: an all-reduce is a reduce-scatter plus an
   all-gather, 2x its size), :func:`ring_bytes` (bytes one rank sends under the standard ring
   algorithm, what nccl's native collectives approach), :func:`gloo_bytes` (the same, for gloo, which
   runs a reduce-scatter as a full all-reduce), and :func:`lower_bound_seconds` /
   :func:`compute_seconds` for the lower-bound time tables.

What :class:`CollectiveLog` sees and misses
-------------------------------------------
It sees every collective called *through the module attribute* ``torch.distributed.<name>`` while the
context is active, on any thread of this process. That covers FSDP2 (``fully_shard`` calls
``dist.all_gather_single`` / ``dist.reduce_scatter_single`` / ``dist.all_reduce``),
``ZeroRedundancyOptimizer`` (``dist.broadcast`` of each rank's updated shard), and DDP's gradient
all-reduce **once a Python communication hook is registered**: DDP's reducer all-reduces in C++, which
no Python wrapper sees, so when :class:`CollectiveLog` is given a ``DistributedDataParallel`` model it
registers :func:`torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook` on it
(the same arithmetic as DDP's built-in hook: divide by N, then all-reduce). See
:func:`count_ddp_allreduce`.

It misses collectives issued from C++ or through other entry points: DDP's construction-time broadcast
of rank 0's weights and its one-time bucket-rebuild broadcasts in the first step (start counting after
one warm-up step), DTensor's functional collectives (``full_tensor()``, ``clip_grad_norm_`` on
DTensors), ``torch.compile``-traced collectives, and anything imported by name before the context was
entered (``from torch.distributed import all_reduce``). The byte counter (:attr:`CollectiveLog.wire_bytes`)
misses nothing a process writes through ``write``/``writev`` (gloo's TCP transport), which is its
weakness too: a ``print`` inside the context is counted. It does not see GPU traffic (nccl over NVLink
or InfiniBand writes no file descriptor), so on GPUs only the records mean anything. On gloo the two
agree: the DDP, ZeRO-1 and FSDP2 runs of the communication example write, per rank, the bytes the
records predict to within :data:`WIRE_TOL`, so nothing invisible runs in the steps it counts.
:func:`guide.launch` runs one gloo reduce-scatter self-check in every rank *before* the worker starts;
a log opened in the worker never sees it.

Element counts follow ZeRO's convention of the *full* buffer: an all-gather's output, a
reduce-scatter's input, an all-reduce's or broadcast's tensor. For N ranks the ring algorithm sends
``(N-1)/N`` of that per rank for an all-gather or reduce-scatter and ``2(N-1)/N`` for an all-reduce.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from guide.checks import CheckFailed

__all__ = [
    "KINDS",
    "KIND_COLORS",
    "ELEMENT_TOL",
    "Collective",
    "CollectiveLog",
    "FSDPGroup",
    "Link",
    "WIRE_TOL",
    "bytes_chart",
    "check_volume",
    "check_wire",
    "compute_seconds",
    "count_ddp_allreduce",
    "ddp_step",
    "dtype_name",
    "fsdp2_groups",
    "fsdp2_padded_numel",
    "fsdp2_step",
    "gloo_bytes",
    "lower_bound_seconds",
    "ring_bytes",
    "summarize",
    "wire_bytes_written",
    "zero1_step",
    "zero_bytes",
    "zero_volume",
]

#: How far measured element counts may sit from the analytical model (relative) before a page fails.
ELEMENT_TOL = 0.02

#: How far a rank's measured wire bytes (``wchar``) may sit from the gloo model (relative): the gap
#: is gloo's message headers; the communication example prints both for every run.
WIRE_TOL = 0.02

#: The ``torch.distributed`` functions :class:`CollectiveLog` wraps, and the kind each one records.
#: A call made from inside another wrapped call (a deprecated alias forwarding to its replacement)
#: is recorded once, by the outermost wrapper.
_WRAPPED: dict[str, str] = {
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "all_to_all_single": "all_to_all",
    "reduce": "reduce",
}

#: Every kind a :class:`Collective` can have.
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "reduce")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the short name used in :class:`Collective`."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective call as this rank issued it (or, from the model functions, should issue it).

    ``numel`` is the size of the full buffer (all-gather output, reduce-scatter input, all-reduce or
    broadcast tensor) and ``bytes`` is ``numel`` times the element size. ``phase`` is ``"forward"``,
    ``"backward"``, ``"optimizer"``, a label set with :meth:`CollectiveLog.phase`, or ``None``. ``group_size`` is the
    number of ranks the collective spans.
    """

    kind: str
    dtype: str
    numel: int
    bytes: int
    phase: str | None = None
    group_size: int = 1


def _numel_and_dtype(name: str, bound: Mapping[str, Any]) -> tuple[int, torch.dtype, int]:
    """(full-buffer numel, dtype, group size) of one call, from its arguments."""
    group = bound.get("group")
    n = dist.get_world_size(group) if dist.is_initialized() else 1
    if name in ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"):
        t = bound["output_tensor"]
    elif name == "all_gather":
        t = bound["tensor"]
        return t.numel() * n, t.dtype, n
    elif name in ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"):
        t = bound.get("input", bound.get("input_tensor"))
        if t is None:  # positional names differ between releases: take the larger tensor
            t = max((v for v in bound.values() if isinstance(v, torch.Tensor)), key=torch.Tensor.numel)
    elif name == "reduce_scatter":
        parts = bound["input_list"]
        return sum(p.numel() for p in parts), parts[0].dtype, n
    elif name == "all_to_all_single":
        t = bound["input"]
    else:  # all_reduce, broadcast, reduce
        t = bound["tensor"]
    return t.numel(), t.dtype, n


_state = threading.local()  # .depth: nesting of wrapped calls on this thread (count the outermost)


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class CollectiveLog:
    """Record every collective this rank issues while the context is active.

    Use it inside a worker, around the steps to count (after one warm-up step, so one-time setup
    traffic is excluded)::

        with CollectiveLog(model) as log:
            train_steps(model, opt, batches, ...)
        log.count("all_gather"), log.bytes("reduce_scatter"), log.wire_bytes

    ``model`` is optional. A ``DistributedDataParallel`` model gets a counting communication hook
    (:func:`count_ddp_allreduce`); any module gets forward hooks so that collectives issued during its
    forward are labelled ``"forward"``. Collectives issued inside autograd's backward are labelled
    ``"backward"`` and those inside any ``Optimizer.step`` ``"optimizer"`` (global optimizer step
    hooks) either way; :meth:`phase` overrides all three (``with log.phase("checkpoint"): ...``).

    Only one log may be active per process at a time. See the module docstring for what it sees and
    what it misses.
    """

    _active: CollectiveLog | None = None

    def __init__(self, model: nn.Module | None = None) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(
                f"CollectiveLog(model) takes the nn.Module being trained (or None), "
                f"got {type(model).__name__}.")
        self.model = model
        self.records: list[Collective] = []
        #: Bytes this process wrote while the context was active (``/proc/self/io`` ``wchar``);
        #: ``None`` where that file does not exist (not Linux).
        self.wire_bytes: int | None = None
        self._label: str | None = None
        self._in_forward = 0
        self._in_optimizer = 0
        self._originals: dict[str, Callable[..., Any]] = {}
        self._handles: list[Any] = []
        self._wchar0: int | None = None
        self._lock = threading.Lock()

    # -- context ---------------------------------------------------------------------------------
    def __enter__(self) -> CollectiveLog:
        if CollectiveLog._active is not None:
            raise ValueError("a CollectiveLog is already active in this process; close it first "
                             "(logs do not nest).")
        CollectiveLog._active = self
        for name in _WRAPPED:
            original = getattr(dist, name, None)
            if original is not None:
                self._originals[name] = original
                setattr(dist, name, self._wrap(name, original))
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(self._enter_forward,
                                                                      prepend=True))
            self._handles.append(self.model.register_forward_hook(self._leave_forward,
                                                                  always_call=True))
            if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
                count_ddp_allreduce(self.model)
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self._handles.append(register_optimizer_step_pre_hook(self._enter_optimizer))
        self._handles.append(register_optimizer_step_post_hook(self._leave_optimizer))
        self._wchar0 = wire_bytes_written()
        return self

    def __exit__(self, *exc: object) -> None:
        wchar1 = wire_bytes_written()
        if self._wchar0 is not None and wchar1 is not None:
            self.wire_bytes = wchar1 - self._wchar0
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        CollectiveLog._active = None

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Label every collective issued inside this block ``label`` (overrides automatic phases)."""
        if not isinstance(label, str) or not label:
            raise ValueError(f"phase label must be a non-empty string, got {label!r}.")
        previous, self._label = self._label, label
        try:
            yield
        finally:
            self._label = previous

    # -- recording -------------------------------------------------------------------------------
    def _enter_forward(self, *_: object) -> None:
        self._in_forward += 1

    def _leave_forward(self, *_: object) -> None:
        self._in_forward = max(0, self._in_forward - 1)

    def _enter_optimizer(self, *_: object) -> None:
        self._in_optimizer += 1

    def _leave_optimizer(self, *_: object) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)

    def _current_phase(self) -> str | None:
        if self._label is not None:
            return self._label
        if _in_backward():
            return "backward"
        if self._in_forward:
            return "forward"
        if self._in_optimizer:
            return "optimizer"
        return None

    def record(self, kind: str, tensor_numel: int, dtype: torch.dtype, group_size: int) -> None:
        """Append one collective (used by the wrappers and the DDP hook; public for custom hooks)."""
        with self._lock:
            self.records.append(_coll(kind, dtype, int(tensor_numel), self._current_phase(),
                                      group_size))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        signature = inspect.signature(original)
        kind = _WRAPPED[name]

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_state, "depth", 0)
            if depth == 0:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                numel, dtype, n = _numel_and_dtype(name, bound.arguments)
                self.record(kind, numel, dtype, n)
            _state.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                _state.depth = depth

        return counted

    # -- reading ---------------------------------------------------------------------------------
    def _select(self, kind: str | None, phase: str | None) -> list[Collective]:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown collective kind {kind!r}; choose one of {KINDS}.")
        return [c for c in self.records
                if (kind is None or c.kind == kind) and (phase is None or c.phase == phase)]

    def count(self, kind: str | None = None, phase: str | None = None) -> int:
        """Number of calls of ``kind`` (all kinds if ``None``), optionally only in ``phase``."""
        return len(self._select(kind, phase))

    def elements(self, kind: str | None = None, phase: str | None = None) -> int:
        """Total full-buffer elements of ``kind`` (all kinds if ``None``)."""
        return sum(c.numel for c in self._select(kind, phase))

    def bytes(self, kind: str | None = None, phase: str | None = None) -> int:
        """Total full-buffer bytes of ``kind`` (all kinds if ``None``)."""
        return sum(c.bytes for c in self._select(kind, phase))

    def summary(self) -> dict[tuple[str, str], dict[str, int]]:
        """``{(kind, dtype): {"calls", "numel", "bytes"}}`` over every record (see :func:`summarize`)."""
        return summarize(self.records)


def summarize(records: Iterable[Collective], steps: int = 1) -> dict[tuple[str, str], dict[str, float]]:
    """Group collectives by ``(kind, dtype)``: calls, elements and bytes, divided by ``steps``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}.")
    out: dict[tuple[str, str], dict[str, float]] = {}
    for c in records:
        row = out.setdefault((c.kind, c.dtype), {"calls": 0, "numel": 0, "bytes": 0})
        row["calls"] += 1
        row["numel"] += c.numel
        row["bytes"] += c.bytes
    if steps > 1:
        out = {key: {k: v / steps for k, v in row.items()} for key, row in out.items()}
    return out


def count_ddp_allreduce(ddp_model: nn.Module) -> None:
    """Make DDP's gradient all-reduce visible to :class:`CollectiveLog`.

    DDP's reducer all-reduces each gradient bucket in C++. This registers a Python communication hook
    that does the same arithmetic as DDP's built-in one (divide by N, all-reduce, via
    ``allreduce_hook``) through ``torch.distributed.all_reduce``, which an active log records. DDP
    allows one hook per model, so the hook is registered once and reused; registering it before the
    first step (or at least before the steps you count) is safest. Whichever log is active when a
    bucket is reduced records it.
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise ValueError(
            f"count_ddp_allreduce needs a DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}; FSDP2 and ZeRO-1 collectives need no hook.")
    if getattr(ddp_model, "_guide_comm_counter", None) is not None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # allreduce_hook calls dist.all_reduce through the module: an active CollectiveLog records it.
    ddp_model.register_comm_hook(ddp_model.process_group, allreduce_hook)
    ddp_model._guide_comm_counter = True


def wire_bytes_written() -> int | None:
    """Bytes this process has written so far (``wchar`` of ``/proc/self/io``: sockets included, so
    a rank's collectives show up here as the bytes it sent); ``None`` where the file is missing."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return None


# -- the analytical model ---------------------------------------------------------------------------

def _shape_list(shapes: Iterable[Any], what: str) -> list[torch.Size]:
    out = []
    for s in shapes:
        if isinstance(s, torch.Tensor):
            s = s.shape
        try:
            size = torch.Size(s)
        except TypeError:
            raise ValueError(f"{what}: {s!r} is not a shape (a tuple of ints or a tensor).") from None
        if len(size) == 0:
            size = torch.Size([1])
        out.append(size)
    if not out:
        raise ValueError(f"{what}: no parameter shapes given.")
    return out


def _check_ws(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}.")


def fsdp2_padded_numel(shape: Sequence[int] | torch.Size, world_size: int) -> int:
    """Elements one parameter contributes to FSDP2's all-gather/reduce-scatter buffer: dim 0 is
    chunked into ``world_size`` pieces of ``ceil(dim0 / N)`` rows (``torch.chunk``) and every shard is
    padded to that size, so the buffer holds ``ceil(dim0 / N) * N`` rows."""
    _check_ws(world_size)
    size = _shape_list([shape], "fsdp2_padded_numel")[0]
    rows = -(-size[0] // world_size) * world_size
    return rows * (size.numel() // size[0]) if size[0] else 0


@dataclasses.dataclass(frozen=True)
class FSDPGroup:
    """One ``fully_shard`` unit: the shapes of the parameters it owns and its
    ``reshard_after_forward`` (``True``: gathered again in backward)."""

    shapes: tuple[tuple[int, ...], ...]
    reshard_after_forward: bool = True

    @classmethod
    def of(cls, params: Iterable[nn.Parameter | torch.Tensor], reshard_after_forward: bool = True
           ) -> FSDPGroup:
        """A group from the (unsharded) parameters a ``fully_shard`` call will own."""
        return cls(tuple(tuple(s) for s in _shape_list(params, "FSDPGroup.of")),
                   bool(reshard_after_forward))


def fsdp2_groups(model: nn.Module, reshard_after_forward: bool | None = None) -> list[FSDPGroup]:
    """The units :func:`guide.sharding.apply_fsdp2` makes of ``model``, in forward order: the root
    (what the final ``fully_shard(model)`` owns: embeddings, final norm, head), then each block.

    ``reshard_after_forward`` is the value given to ``apply_fsdp2``; ``None`` is ``fully_shard``'s
    default, which reshards the blocks and keeps the root's parameters until backward. Shapes are
    global, so the model may be called before or after sharding.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(model, nn.Module) or blocks is None:
        raise ValueError(f"fsdp2_groups expects a model with .blocks (a TinyLM), got "
                         f"{type(model).__name__}; build FSDPGroup.of(...) per fully_shard call instead.")
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_blocks]
    root_flag, block_flag = ((False, True) if reshard_after_forward is None
                             else (reshard_after_forward, reshard_after_forward))
    return [FSDPGroup.of(root, root_flag), *(FSDPGroup.of(b.parameters(), block_flag) for b in blocks)]


def _coll(kind: str, dtype: torch.dtype, numel: int, phase: str | None, n: int) -> Collective:
    return Collective(kind, dtype_name(dtype), numel, numel * dtype.itemsize, phase, n)


def ddp_step(shapes: Iterable[Any], world_size: int,
             grad_dtype: torch.dtype = torch.float32) -> list[Collective]:
    """DDP's communication in one step: the gradients all-reduced, Ψ elements in total. DDP splits
    them into buckets (one call each); the model returns one record for the total, since bucket
    boundaries are DDP's choice."""
    _check_ws(world_size)
    total = sum(s.numel() for s in _shape_list(shapes, "ddp_step"))
    return [_coll("all_reduce", grad_dtype, total, "backward", world_size)]


def zero1_step(shapes: Iterable[Any], world_size: int,
               dtype: torch.dtype = torch.float32) -> list[Collective]:
    """DDP + ``ZeroRedundancyOptimizer`` in one step: DDP's all-reduce of Ψ gradient elements, then,
    after each rank updates its own shard of the parameters, one broadcast per parameter from its
    owner (``parameters_as_bucket_view=False``, the default): Ψ more elements. (ZeRO's P_os would
    reduce-scatter and all-gather instead; torch's ZeRO-1 keeps DDP's all-reduce.)"""
    shape_list = _shape_list(shapes, "zero1_step")
    out = ddp_step(shape_list, world_size, dtype)
    out += [_coll("broadcast", dtype, s.numel(), "optimizer", world_size) for s in shape_list]
    return out


def fsdp2_step(groups: Sequence[FSDPGroup], world_size: int,
               param_dtype: torch.dtype = torch.float32,
               reduce_dtype: torch.dtype | None = None) -> list[Collective]:
    """FSDP2's communication in one step, one record per call: each group all-gathers its padded
    parameters in ``param_dtype`` in forward, again in backward if it reshards after forward, and
    reduce-scatters its padded gradients in ``reduce_dtype`` (default: ``param_dtype``). The calls
    are listed group by group; FSDP2 issues the same calls but interleaves them (it prefetches the
    next backward all-gather before the current reduce-scatter), so compare them as a multiset."""
    _check_ws(world_size)
    if not groups or not all(isinstance(g, FSDPGroup) for g in groups):
        raise ValueError("fsdp2_step needs a non-empty sequence of FSDPGroup (one per fully_shard).")
    reduce_dtype = reduce_dtype or param_dtype
    sizes = [sum(fsdp2_padded_numel(s, world_size) for s in g.shapes) for g in groups]
    out = [_coll("all_gather", param_dtype, numel, "forward", world_size) for numel in sizes]
    for g, numel in zip(reversed(groups), reversed(sizes)):
        if g.reshard_after_forward:
            out.append(_coll("all_gather", param_dtype, numel, "backward", world_size))
        out.append(_coll("reduce_scatter", reduce_dtype, numel, "backward", world_size))
    return out


# -- cost ---------------------------------------------------------------------------------------------

_RING_FACTOR = {"all_gather": 1, "reduce_scatter": 1, "broadcast": 1, "all_reduce": 2,
                "all_to_all": 1, "reduce": 1}


def zero_volume(c: Collective) -> int:
    """ZeRO's element count for a collective (arXiv 1910.02054 §7): an all-reduce is a reduce-scatter
    plus an all-gather, so it counts twice its size; every other kind counts its size once."""
    return c.numel * (2 if c.kind == "all_reduce" else 1)


def zero_bytes(c: Collective) -> int:
    """:func:`zero_volume` in bytes: the elements ZeRO counts, times the collective's element size.
    This is where dtypes enter: a bf16 all-gather counts half the bytes of an fp32 one."""
    return c.bytes * (2 if c.kind == "all_reduce" else 1)


def ring_bytes(c: Collective, world_size: int | None = None) -> float:
    """Bytes one rank sends for ``c`` under the ring algorithm: ``(N-1)/N`` of the buffer for an
    all-gather, reduce-scatter or broadcast (averaged over ranks), ``2(N-1)/N`` for an all-reduce.
    This is what a backend with native collectives (nccl) approaches."""
    n = world_size or c.group_size
    _check_ws(n)
    return _RING_FACTOR[c.kind] * (n - 1) / n * c.bytes


def gloo_bytes(c: Collective, world_size: int | None = None) -> float:
    """Bytes one rank sends for ``c`` on gloo: as :func:`ring_bytes`, except that gloo runs a
    reduce-scatter as a full all-reduce (``c10d::_reduce_scatter_base_`` -> ``gloo:all_reduce``), which
    sends ``2(N-1)/N`` of the buffer instead of ``(N-1)/N``."""
    if c.kind == "reduce_scatter":
        c = dataclasses.replace(c, kind="all_reduce")
    return ring_bytes(c, world_size)


@dataclasses.dataclass(frozen=True)
class Link:
    """A link for lower-bound tables: ``bytes_per_s`` per direction per GPU, over ``world_size`` ranks."""

    name: str
    bytes_per_s: float
    world_size: int

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"Link {self.name!r}: bytes_per_s must be positive, got {self.bytes_per_s!r}.")
        _check_ws(self.world_size)


def lower_bound_seconds(step: Iterable[Collective], link: Link) -> float:
    """A lower bound on one step's communication time over ``link``: the ring bytes each rank sends
    (:func:`ring_bytes` at ``link.world_size``) divided by the link's bandwidth, with no latency, no
    overlap and perfect bandwidth. Real collectives are slower."""
    return sum(ring_bytes(c, link.world_size) for c in step) / link.bytes_per_s


def compute_seconds(n_params: float, tokens: float, peak_flops: float, fraction_of_peak: float) -> float:
    """Training compute per step, ``6 * Ψ * tokens`` FLOPs (forward 2, backward 4 per parameter per
    token), at ``fraction_of_peak`` of ``peak_flops``."""
    for name, v in (("n_params", n_params), ("tokens", tokens), ("peak_flops", peak_flops)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}.")
    if not 0 < fraction_of_peak <= 1:
        raise ValueError(f"fraction_of_peak must be in (0, 1], got {fraction_of_peak!r}.")
    return 6 * n_params * tokens / (peak_flops * fraction_of_peak)


# -- checks that fail the build ---------------------------------------------------------------------

def check_volume(run: str, measured: Sequence[Collective], expected: Sequence[Collective],
                 steps: int, tol: float = ELEMENT_TOL,
                 exact_calls: Sequence[str] = ("all_gather", "reduce_scatter", "broadcast"),
                 ) -> dict[tuple[str, str], tuple[float, int, float]]:
    """Compare ``measured`` (all records of ``steps`` steps) with one step of ``expected``.

    For each ``(kind, dtype)`` the measured elements per step must sit within ``tol`` (relative) of
    the model, and for the kinds in ``exact_calls`` the calls per step must match exactly (DDP's
    all-reduce is left out by default: how many buckets it uses is DDP's choice). Raises
    :class:`guide.checks.CheckFailed` naming the run, kind and dtype; returns
    ``{(kind, dtype): (measured elements/step, model elements/step, relative gap)}``.
    """
    got, want = summarize(measured, steps), summarize(expected)
    if set(got) != set(want):
        raise CheckFailed(
            f"[comm volume] {run}: issued {sorted(got)} (kind, dtype) per step, the model says "
            f"{sorted(want)}.")
    out = {}
    for key, row in want.items():
        m, e = got[key]["numel"], row["numel"]
        gap = abs(m - e) / e if e else float(m != 0)
        if gap > tol:
            raise CheckFailed(
                f"[comm volume] {run}: {key[0]} in {key[1]} moved {m:,.0f} elements per step, the "
                f"model says {e:,} (gap {gap:.2%} > {tol:.0%}).")
        if key[0] in exact_calls and got[key]["calls"] != row["calls"]:
            raise CheckFailed(
                f"[comm calls] {run}: {got[key]['calls']:g} {key[0]} calls in {key[1]} per step, "
                f"the model says {row['calls']}.")
        out[key] = (m, e, gap)
    return out


def check_wire(run: str, wire_bytes_per_rank: Sequence[int | None], expected_per_rank: float,
               steps: int, tol: float = WIRE_TOL) -> list[float]:
    """Each rank's measured wire bytes per step must sit within ``tol`` of ``expected_per_rank``
    (e.g. the sum of :func:`gloo_bytes` over one step's model). Raises
    :class:`guide.checks.CheckFailed` naming the run and rank; returns the bytes per step per rank."""
    if any(w is None for w in wire_bytes_per_rank):
        raise CheckFailed(f"[comm wire] {run}: /proc/self/io is not readable here; no wire bytes.")
    per_step = [w / steps for w in wire_bytes_per_rank]
    for rank, w in enumerate(per_step):
        gap = abs(w - expected_per_rank) / expected_per_rank
        if gap > tol:
            raise CheckFailed(
                f"[comm wire] {run}: rank {rank} wrote {w:,.0f} B per step, the gloo model says "
                f"{expected_per_rank:,.0f} B (gap {gap:.2%} > {tol:.0%}).")
    return per_step


# -- the chart --------------------------------------------------------------------------------------

#: One colour per collective kind (the strategy colours live in :data:`guide.plotting.COLORS`).
KIND_COLORS = {"all_gather": "#9467bd", "reduce_scatter": "#ff7f0e", "all_reduce": "#1f77b4",
               "broadcast": "#2ca02c", "all_to_all": "#8c564b", "reduce": "#7f7f7f"}


def bytes_chart(runs: Mapping[str, Sequence[Collective]], measured_wire: Mapping[str, float],
                world_size: int, unit: float = 2**10, unit_name: str = "KiB"):
    """Bars: bytes one rank sends per step under the ring model (what nccl's native collectives
    approach), stacked by collective kind, one bar per run (``runs``: one step of collectives each).
    Diamonds: what gloo actually wrote per rank per step (``measured_wire``)."""
    import matplotlib.pyplot as plt

    from guide import plotting

    plotting.style()
    fig, ax = plt.subplots(figsize=(8.6, 4.4))
    names = list(runs)
    labelled: set[str] = set()  # one legend entry per kind: on the first bar that has it
    for i, name in enumerate(names):
        bottom = 0.0
        for kind in KINDS:
            b = sum(ring_bytes(c, world_size) for c in runs[name] if c.kind == kind) / unit
            if b:
                ax.bar(i, b, bottom=bottom, color=KIND_COLORS[kind], width=0.6,
                       label=None if kind in labelled else kind.replace("_", "-"))
                labelled.add(kind)
                bottom += b
    ax.scatter(range(len(names)), [measured_wire[n] / unit for n in names], marker="D", s=60,
               color="black", zorder=3, label="gloo, measured (wchar)")
    ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=9)
    ax.set_ylabel(f"sent per rank per step ({unit_name})")
    ax.set_title(f"Bytes on the wire per step, {world_size} ranks: ring model (bars) vs gloo (◆)")
    ax.legend(loc="upper left", fontsize=9)
    return fig
