"""The process's heap, set so that resident memory tracks live tensors: glibc's mmap threshold.

In the launcher's layer because every rank a job starts with ``memory_limit_mib`` calls
:func:`prepare` before the worker runs (:mod:`guide.launcher.rank_main`); the memory measurement
(:mod:`guide.memory.peak`) reads :func:`is_prepared` and uses the same functions. Linux with glibc
only; nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from pathlib import Path

__all__ = ["MMAP_THRESHOLD", "is_prepared", "prepare", "release_freed_heap"]

#: The glibc mmap threshold :func:`prepare` sets (bytes): every allocation above it is a private
#: ``mmap`` that ``free`` returns to the kernel at once. Same value as ``guide.launch(memory_limit_mib=...)``.
MMAP_THRESHOLD = 64 * 1024

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_prepared_pid: int | None = None


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
