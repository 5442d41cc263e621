"""Run one function on N ranks of a ``torch.distributed`` process group and bring the results home.

An example calls :func:`launch` with a worker it defines itself::

    def worker(rank: guide.Rank, steps: int) -> dict: ...
    results = guide.launch(worker, 2, steps=20)   # one result per rank, in rank order

Three ways to run, one call:

* **Local** (docs build, ``python example.py``, Jupyter): the ranks are processes forked from a
  ``forkserver`` that has ``torch`` preloaded, forming a CPU **gloo** group on loopback
  (``guide.launcher.local``; inside each rank, ``guide.launcher.rank_main``).
* **torchrun**: when the script itself was started by ``torchrun``, the process group torchrun set up is
  used (``nccl`` and one GPU per rank when CUDA is available), the worker runs in this process, and
  every rank gets every rank's result (``guide.launcher.torchrun``). Only rank 0 prints and draws:
  importing this package under torchrun silences the other ranks unless they fail.

Failure is loud and fast (``guide.launcher.supervise``): a rank that raises or dies ends the job
within seconds with *that* rank's traceback; a rank stuck in Python is named, with its Python stack,
once its peers time out in the next collective (``collective_timeout_s``); and a job that outlives
``deadline_s`` is killed. The exceptions are in ``guide.launcher.errors``; the torch version floor
and the gloo ``AVG`` self-check in ``guide.launcher.torch_support``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from guide.launcher.errors import (
    JobTimeout,
    LaunchError,
    RankDied,
    RankError,
    RankHung,
    RankOutOfMemory,
    RankRaised,
)
from guide.launcher.local import launch_local
from guide.launcher.rank import Rank, under_torchrun, world_size
from guide.launcher.torch_support import check_torch
from guide.launcher.torchrun import launch_in_torchrun, speak_only_on_rank0
from guide.validate import positive_int

__all__ = [
    "JobTimeout",
    "LaunchError",
    "Rank",
    "RankDied",
    "RankError",
    "RankHung",
    "RankOutOfMemory",
    "RankRaised",
    "launch",
    "under_torchrun",
    "world_size",
]


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    deadline_s: float = 600.0,
    collective_timeout_s: float = 30.0,
    threads_per_rank: int | None = None,
    memory_limit_mib: int | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, *args, **kwargs)`` on ``world_size`` ranks; return the results in rank order.

    ``fn`` gets a :class:`Rank` first. Its return value must be picklable; tensors are moved to the
    CPU before they travel. ``collective_timeout_s`` is the process group's timeout: how long a rank
    waits in a collective for a peer that does not come. ``deadline_s`` bounds the whole job.
    ``threads_per_rank`` defaults to ``cores // world_size`` (at least 1): oversubscribing two cores
    made DDP 2.7–4.2× slower. ``memory_limit_mib`` caps each local rank's data segment
    (``RLIMIT_DATA``) before the worker runs, so over-use becomes a real allocation failure,
    reported as :class:`RankOutOfMemory`; it also sets glibc's mmap threshold to 64 KiB in the rank,
    without which heap fragmentation, not the model, decides who fits.

    Raises :class:`RankRaised`, :class:`RankDied`, :class:`RankHung` or :class:`JobTimeout` naming the
    rank at fault, and :class:`LaunchError` for a request that cannot run.
    """
    if not callable(fn):
        raise LaunchError(f"launch() needs a function to run on each rank, got {type(fn).__name__}.")
    _positive_int("world_size", world_size, "the number of ranks")
    for name, value in (("deadline_s", deadline_s), ("collective_timeout_s", collective_timeout_s)):
        if not value > 0:
            raise LaunchError(f"{name} must be a positive number of seconds, got {value!r}.")
    check_torch()
    if under_torchrun():
        return launch_in_torchrun(fn, world_size, args, kwargs, collective_timeout_s)
    if memory_limit_mib is not None:
        _positive_int("memory_limit_mib", memory_limit_mib)
    cores = os.cpu_count() or 1
    threads = threads_per_rank or max(1, cores // world_size)
    name = getattr(fn, "__name__", type(fn).__name__)
    _progress(f"[guide] {name} on {world_size} ranks ...")
    started = time.monotonic()
    results = launch_local(fn, world_size, args, kwargs, deadline_s, collective_timeout_s,
                           threads, memory_limit_mib)
    _progress(f"[guide] {name} on {world_size} ranks: done in {time.monotonic() - started:.1f} s")
    return results


def _progress(line: str) -> None:
    """One progress line per job on a terminal (``python example.py``), so nobody wonders whether
    it hangs; silent where output is captured (docs build, notebooks, CI logs) unless
    ``GUIDE_PROGRESS=1``."""
    if os.environ.get("GUIDE_PROGRESS") == "1" or (sys.stderr.isatty()
                                                  and os.environ.get("GUIDE_PROGRESS") != "0"):
        print(line, file=sys.stderr, flush=True)


def _positive_int(name: str, value: Any, what: str = "") -> None:
    """:func:`guide.validate.positive_int`, raised as :class:`LaunchError` (the launcher's one error
    for a request that cannot run)."""
    try:
        positive_int(name, value, what)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


speak_only_on_rank0()  # under torchrun: only rank 0 prints and draws (see guide.launcher.torchrun)
