"""Measured peak memory of one rank during a piece of work (one training step).

Where :mod:`guide.memory.measured` counts tensor storage between steps, this measures the whole
process at its worst moment during a step. Use it inside a rank (a worker run by
:func:`guide.launch`, or a plain process)::

    from guide.memory import PeakMemory, prepare

    def worker(rank):
        prepare()                       # first thing in the worker (CPU: glibc mmap threshold)
        ...build model, optimizer; run one warm-up step...
        with PeakMemory() as peak:
            <one training step>
        return peak.peak_bytes, peak.baseline_bytes

**On CPU** the measure is the process's resident set: at entry the kernel's high-water mark
``VmHWM`` is reset to the current ``VmRSS`` by writing ``5`` to ``/proc/self/clear_refs`` (Linux
≥ 4.0); at exit ``peak_bytes = VmHWM - baseline_bytes``. It therefore counts every page this process
touched and still held at the worst moment: tensor storage (parameters, gradients, optimizer state,
activations, FSDP2's all-gather and reduce-scatter buffers, DDP's gradient buckets), gloo's send and
receive buffers, Python objects, thread stacks and code pages faulted in for the first time. It does
not count memory that was reserved but never touched, memory of other processes (the other ranks,
the launcher), swapped-out pages, or ``mmap``'d files shared with others twice.

That is only a measure of the *model's* memory if freed memory really leaves the process. glibc's
default heap keeps freed blocks (up to its dynamic mmap threshold, 32 MiB on 64-bit) and fragments:
measured with torch 2.13 on gloo, FSDP2 then *looked* bigger than DDP. :func:`prepare` sets glibc's
``M_MMAP_THRESHOLD`` to 64 KiB, so every allocation above that is its own ``mmap`` and goes back to
the kernel on ``free``; with it, per-rank peaks grow with depth as the model state does, plus a
small per-block remainder (the "memory against depth" example asserts it). Allocations below
64 KiB still come from the heap and may reuse pages that were resident before entry: they are
undercounted, never overcounted (the site's checks allow :data:`RESOLUTION_BYTES` for this).
(Call :func:`prepare` before the model is built; :func:`guide.launch` with ``memory_limit_mib``
does the same.)
Measure a step *after* a warm-up step, so that lazily imported code and one-time buffers are not
charged to it.

**On CUDA** the measure is the caching allocator's: ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, minus ``memory_allocated`` at entry. It counts tensor storage only:
not the CUDA context, not NCCL's internal buffers, not memory cached but unused by the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import re
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

__all__ = ["MMAP_THRESHOLD", "PeakMemory", "RESOLUTION_BYTES", "current_bytes",
           "data_segment_bytes", "is_prepared", "prepare"]

#: The glibc mmap threshold :func:`prepare` sets (bytes): every allocation above it is a private
#: ``mmap`` that ``free`` returns to the kernel at once. Same value as ``guide.launch(memory_limit_mib=...)``.
MMAP_THRESHOLD = 64 * 1024

#: How far a CPU reading (resident memory) may miss the tensor bytes it should see, either way:
#: pages, allocations under :data:`MMAP_THRESHOLD` that reuse heap pages already resident, Python
#: objects made or freed inside the block. A check that compares a CPU :class:`PeakMemory` or
#: :func:`current_bytes` difference with counted tensor bytes allows this much.
RESOLUTION_BYTES = 2**20

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_prepared_pid: int | None = None
_active = False


def prepare(mmap_threshold: int = MMAP_THRESHOLD) -> None:
    """Make freed memory leave this process, so that resident memory tracks live tensors.

    Sets glibc's ``M_MMAP_THRESHOLD`` to ``mmap_threshold`` bytes (which also stops glibc from
    raising it dynamically). Call it first thing in the worker, before the model is built. Needed
    for CPU measurements only; harmless on CUDA ranks. Raises :class:`ValueError` for a threshold
    that is not a positive int, :class:`RuntimeError` where glibc or ``/proc`` is missing (the CPU
    measurement needs Linux with glibc).
    """
    global _prepared_pid
    if isinstance(mmap_threshold, bool) or not isinstance(mmap_threshold, int) or mmap_threshold < 1:
        raise ValueError(f"mmap_threshold must be a positive number of bytes, got {mmap_threshold!r}.")
    _require_proc()
    libc = _libc()
    if libc is None or not libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold):
        raise RuntimeError(
            "could not set glibc's M_MMAP_THRESHOLD (mallopt): the CPU peak-memory measurement "
            "needs Linux with glibc. On CUDA, use PeakMemory(device='cuda') without prepare().")
    _prepared_pid = os.getpid()


def release_freed_heap() -> None:
    """Hand the heap's free pages back to the kernel: ``gc.collect()``, then glibc's
    ``malloc_trim(0)``.

    Blocks below the mmap threshold come from the heap, and glibc keeps a freed block's pages
    resident while anything above them is still allocated; the next allocation reuses them unseen.
    A process that measures a second model after a first (torchrun's ranks run every point of a
    page in one process) calls this between the two, so that the second measure starts from what
    is live. Raises :class:`RuntimeError` where glibc is missing, as :func:`prepare` does.
    """
    gc.collect()
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        raise RuntimeError("malloc_trim is glibc's: releasing the freed heap needs Linux with glibc.")
    libc.malloc_trim(0)


def is_prepared() -> bool:
    """True if this process's mmap threshold was lowered by :func:`prepare` (which
    :func:`guide.launch` with ``memory_limit_mib`` calls in every rank)."""
    return _prepared_pid == os.getpid()


def current_bytes(device: Any = None) -> int:
    """This process's memory now: ``VmRSS`` on CPU, ``torch.cuda.memory_allocated`` on CUDA."""
    dev = _resolve(device)
    if dev.type == "cuda":
        return int(torch.cuda.memory_allocated(dev))
    return _status_bytes("VmRSS")


def data_segment_bytes() -> int:
    """This process's data segment now (``VmData``): what ``RLIMIT_DATA`` limits, and so what
    :func:`guide.launch`'s ``memory_limit_mib`` counts. It includes everything a rank inherited from
    the fork server (``torch`` imported) and address space reserved but not yet touched, so a
    budget must be set relative to this level measured inside a rank, not to zero."""
    _require_proc()
    return _status_bytes("VmData")


class PeakMemory:
    """Context manager: the peak memory of this process while the ``with`` body ran.

    After the block:

    * ``peak_bytes``: the highest level reached inside the block, minus ``baseline_bytes``
      (≥ 0; what the block added at its worst moment);
    * ``baseline_bytes``: the level at entry (CPU: ``VmRSS`` after a ``gc.collect()``; CUDA:
      ``memory_allocated``);
    * ``end_bytes``: the level at exit minus ``baseline_bytes`` (what the block left behind; may be
      negative if it freed more than it kept);
    * ``method``: what was read (``"VmHWM"`` or ``"cuda.max_memory_allocated"``).

    ``device``: ``None`` picks CUDA when it is available, else CPU; or pass ``rank.device``.
    On CPU the process must be prepared (:func:`prepare`), else :class:`RuntimeError`: without it
    glibc keeps freed memory and the number measures the heap, not the work. Blocks cannot nest:
    the kernel keeps one high-water mark per process.
    """

    def __init__(self, device: Any = None) -> None:
        self.device = _resolve(device)
        self.method = "cuda.max_memory_allocated" if self.device.type == "cuda" else "VmHWM"
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self.end_bytes = 0
        self._done = False

    def __enter__(self) -> PeakMemory:
        global _active
        if _active:
            raise RuntimeError("PeakMemory blocks cannot nest: the process has one high-water mark.")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = int(torch.cuda.memory_allocated(self.device))
        else:
            _require_proc()
            if not is_prepared():
                raise RuntimeError(
                    "PeakMemory on CPU needs guide.memory.prepare() at the start of the worker "
                    "(or guide.launch(..., memory_limit_mib=...)): with glibc's default heap, freed "
                    "memory stays resident and the peak measures fragmentation, not the step.")
            gc.collect()
            _CLEAR_REFS.write_text("5")  # VmHWM := VmRSS
            self.baseline_bytes = _status_bytes("VmRSS")
        _active = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _active
        _active = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            high = int(torch.cuda.max_memory_allocated(self.device))
            now = int(torch.cuda.memory_allocated(self.device))
        else:
            status = _status()
            high, now = status["VmHWM"], status["VmRSS"]
        self.peak_bytes = max(0, high - self.baseline_bytes)
        self.end_bytes = now - self.baseline_bytes
        self._done = True

    @property
    def peak_level_bytes(self) -> int:
        """The absolute peak level: ``baseline_bytes + peak_bytes``."""
        return self.baseline_bytes + self.peak_bytes

    def __repr__(self) -> str:
        if not self._done:
            return f"PeakMemory(device={self.device}, not measured yet)"
        return (f"PeakMemory(peak={self.peak_bytes / 2**20:.1f} MiB above a baseline of "
                f"{self.baseline_bytes / 2**20:.1f} MiB, end={self.end_bytes / 2**20:+.1f} MiB, "
                f"{self.method})")


# --------------------------------------------------------------------------------------------------


def _resolve(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}."
                         ) from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"PeakMemory measures 'cpu' or 'cuda' devices, got {dev}.")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _libc():
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


def _require_proc() -> None:
    if not (_STATUS.exists() and _CLEAR_REFS.exists()):
        raise RuntimeError("the CPU peak-memory measurement reads /proc/self/status and writes "
                           "/proc/self/clear_refs: it needs Linux.")


_FIELD = re.compile(r"^(Vm\w+):\s+(\d+) kB$", re.MULTILINE)


def _status() -> dict[str, int]:
    return {k: int(v) * 1024 for k, v in _FIELD.findall(_STATUS.read_text())}


def _status_bytes(field: str) -> int:
    return _status()[field]
