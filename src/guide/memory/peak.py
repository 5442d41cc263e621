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
``M_MMAP_THRESHOLD`` to 64 KiB, so an allocation above that is its own ``mmap`` and goes back to
the kernel on ``free``; with it, per-rank peaks grow with depth as the model state does, plus a
small per-block remainder (the "memory against depth" example asserts it). Allocations below
64 KiB still come from the heap, and freed heap blocks coalesce into holes that glibc hands out
*before* it maps anything new, even to an allocation above the threshold. So at entry the block
also hands the heap's free pages back to the kernel (:func:`release_freed_heap`): without that, a
tensor placed in a hole whose pages were still resident added nothing to ``VmRSS`` (on torch 2.9
beside CPU hogs, whole gradient shards of the gradient-accumulation page went unseen). At exit
it does so again before reading ``end_bytes``, so that heap blocks made and freed inside the block
(which refill those released pages) count in the peak but not in what the block kept. Small
tensors share pages with other objects, so a reading can miss or add part of a page for each,
either way (the site's checks allow :data:`RESOLUTION_BYTES` for this).
(Call :func:`prepare` before the model is built; :func:`guide.launch` with ``memory_limit_mib``
does the same.)
Measure a step *after* a warm-up step, so that lazily imported code and one-time buffers are not
charged to it.

**On CUDA** the measure is the caching allocator's: ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, minus ``memory_allocated`` at entry. It counts tensor storage only:
not the CUDA context, not NCCL's internal buffers, not memory cached but unused by the allocator.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

# The heap settings live with the launcher, which applies them in every rank; pages call them as
# guide.memory.prepare() beside the measurement they serve.
from guide.launcher.heap import MMAP_THRESHOLD, is_prepared, prepare, release_freed_heap

__all__ = ["MMAP_THRESHOLD", "PeakMemory", "RESOLUTION_BYTES", "current_bytes",
           "data_segment_bytes", "is_prepared", "prepare", "release_freed_heap"]

#: How far a CPU reading (resident memory) may miss the tensor bytes it should see, either way:
#: pages, allocations under :data:`MMAP_THRESHOLD` that reuse heap pages already resident, Python
#: objects made or freed inside the block. A check that compares a CPU :class:`PeakMemory` or
#: :func:`current_bytes` difference with counted tensor bytes allows this much.
RESOLUTION_BYTES = 2**20

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_active = False


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
    * ``baseline_bytes``: the level at entry (CPU: ``VmRSS`` after :func:`release_freed_heap`;
      CUDA: ``memory_allocated``);
    * ``end_bytes``: the level at exit (CPU: after :func:`release_freed_heap` again) minus
      ``baseline_bytes`` (what the block left behind; may be negative if it freed more than it
      kept);
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
            release_freed_heap()  # gc.collect(), then free heap pages go back: see the module's text
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
            high = _status_bytes("VmHWM")
            release_freed_heap()  # what the block freed on the heap leaves too: only what it kept stays
            now = _status_bytes("VmRSS")
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


def _require_proc() -> None:
    if not (_STATUS.exists() and _CLEAR_REFS.exists()):
        raise RuntimeError("the CPU peak-memory measurement reads /proc/self/status and writes "
                           "/proc/self/clear_refs: it needs Linux.")


_FIELD = re.compile(r"^(Vm\w+):\s+(\d+) kB$", re.MULTILINE)


def _status() -> dict[str, int]:
    return {k: int(v) * 1024 for k, v in _FIELD.findall(_STATUS.read_text())}


def _status_bytes(field: str) -> int:
    return _status()[field]
