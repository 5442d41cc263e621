"""What ranks *do* send: every collective a rank issues, counted from inside the rank.

:class:`CollectiveLog` is a context manager a worker wraps around one or more training steps. While
it is active it wraps the Python collectives of :mod:`torch.distributed` (``all_gather_single``,
``reduce_scatter_single``, ``all_reduce``, ``broadcast``, ...) and records one
:class:`~guide.comm.expected.Collective` per call: kind, dtype, element count, bytes, and the phase
of the step it ran in. It also reads the bytes this process actually wrote to its sockets (``wchar``
in ``/proc/self/io``), which is what the backend put on the wire. The counterpart, what a step
*should* send, is :mod:`guide.comm.expected`; :func:`guide.checks.check_volume` and
:func:`guide.checks.check_wire` compare the two.

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
records predict to within :data:`guide.checks.WIRE_TOL`, so nothing invisible runs in the steps it
counts. :func:`guide.launch` runs one gloo reduce-scatter self-check in every rank *before* the
worker starts; a log opened in the worker never sees it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from guide.comm.expected import KINDS, Collective, collective, summarize

__all__ = ["CollectiveLog", "count_ddp_allreduce", "wire_bytes_written"]

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


def _numel_and_dtype(name: str, bound: Mapping[str, Any]) -> tuple[int, torch.dtype, int]:
    """(full-buffer numel, dtype, group size) of one call, from its arguments.

    The full buffer is what the collective spans: the list forms' tensors together, ``all_to_all``'s
    input, and otherwise the call's largest tensor (a flat all-gather's output, a flat
    reduce-scatter's input, whatever the argument is called in this release; the one tensor of an
    all-reduce, broadcast or reduce). Without a process group this raises torch's own error, as the
    collective itself would, and nothing is recorded."""
    n = dist.get_world_size(bound.get("group"))
    if name == "all_gather":  # the list form: one copy of ``tensor`` from every rank
        t = bound["tensor"]
        return t.numel() * n, t.dtype, n
    if name == "reduce_scatter":  # the list form: one input per rank
        parts = bound["input_list"]
        return sum(p.numel() for p in parts), parts[0].dtype, n
    if name == "all_to_all_single":  # uneven splits: the input is what this rank sends
        t = bound["input"]
    else:
        t = max((v for v in bound.values() if isinstance(v, torch.Tensor)), key=torch.Tensor.numel)
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
            self.records.append(collective(kind, dtype, int(tensor_numel), self._current_phase(),
                                           group_size))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
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

    def summary(self) -> dict[tuple[str, str], dict[str, float]]:
        """``{(kind, dtype): {"calls", "numel", "bytes"}}`` over every record
        (:func:`guide.comm.expected.summarize`)."""
        return summarize(self.records)


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
    if getattr(ddp_model, "_guide_comm_counter", False):
        return
    # Imported here, not at the top: importing DDP's hook package scripts functions with
    # torch.jit, which warns (DeprecationWarning) in every process that merely imports guide.comm.
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
