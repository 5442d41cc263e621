"""A rank's memory budget: its level now plus a headroom, enforced, then lifted.

The OOM page makes DDP fail for real under a budget that FSDP2 fits. What "memory" means depends on
the device, so does the cap:

* **CPU** (gloo ranks, this site's build): the process's data segment, ``RLIMIT_DATA``, capped at
  its level now (:func:`guide.memory.data_segment_bytes`) plus the headroom. Over it, PyTorch's CPU
  allocator raises ``DefaultCPUAllocator: can't allocate memory``.
* **CUDA** (torchrun with nccl): the caching allocator's share of the GPU,
  ``torch.cuda.set_per_process_memory_fraction``, set to what is allocated now plus the headroom
  over the device's total. Over it, torch raises ``torch.OutOfMemoryError: CUDA out of memory``.
  ``RLIMIT_DATA`` is left alone there: it would count CUDA's host mappings, not GPU memory.

Each cap is lifted when the ``with`` block ends, whatever happened inside it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from guide.memory.peak import data_segment_bytes

__all__ = ["OUT_OF_MEMORY", "budget", "gpu_budget", "host_budget", "is_out_of_memory"]

#: The messages of an allocation over a cap: the CPU allocator's, the libc's, CUDA's.
OUT_OF_MEMORY = re.compile(r"can't allocate memory|Cannot allocate memory|out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation over a budget (``MemoryError``, or a ``RuntimeError`` --
    ``torch.OutOfMemoryError`` is one -- whose message says so), not another failure."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and OUT_OF_MEMORY.search(str(exc)) is not None)


def _check_headroom(headroom_bytes: int) -> None:
    if isinstance(headroom_bytes, bool) or not isinstance(headroom_bytes, int) \
            or headroom_bytes <= 0:
        raise ValueError(f"headroom_bytes={headroom_bytes!r}: give a positive whole number of "
                         "bytes the rank may grow by.")


@contextlib.contextmanager
def host_budget(headroom_bytes: int) -> Iterator[int]:
    """Cap this process's data segment at its level now plus ``headroom_bytes``; yields the cap
    in bytes and restores the previous limit on exit."""
    import resource  # POSIX only: imported where it is used

    _check_headroom(headroom_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = data_segment_bytes() + headroom_bytes
    if hard != resource.RLIM_INFINITY and limit > hard:
        raise ValueError(f"the budget ({limit} bytes) is above this process's hard RLIMIT_DATA "
                         f"({hard} bytes): lower the headroom or raise the hard limit.")
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


@contextlib.contextmanager
def gpu_budget(device, headroom_bytes: int) -> Iterator[int]:
    """Cap the caching allocator on ``device`` (a CUDA device) at what is allocated now plus
    ``headroom_bytes``; yields the cap in bytes and gives the whole device back on exit. Cached
    blocks are released first, so memory reserved earlier cannot hide the cap."""
    import torch

    _check_headroom(headroom_bytes)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    limit = torch.cuda.memory_allocated(device) + headroom_bytes
    if limit > total:
        raise ValueError(f"the budget ({limit} bytes) is above the device's {total} bytes: a cap "
                         "that high separates nothing; lower the headroom.")
    torch.cuda.set_per_process_memory_fraction(limit / total, device)
    try:
        yield limit
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def budget(device, headroom_bytes: int) -> contextlib.AbstractContextManager[int]:
    """:func:`gpu_budget` on a CUDA device (``torch.device`` or its name, ``"cuda:1"``),
    :func:`host_budget` on any other."""
    # a torch.device prints as its name (cuda:1, cpu): one rule reads both
    if str(device).split(":")[0] == "cuda":
        return gpu_budget(device, headroom_bytes)
    return host_budget(headroom_bytes)
