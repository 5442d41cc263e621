"""Under ``torchrun``: run the worker in this process, on the group torchrun describes, with one voice.

torchrun starts one process per rank and every one of them runs the whole script, so every
``print`` and every figure of a page would appear once per rank. :func:`speak_only_on_rank0` makes
rank 0 the page's only voice: the other ranks write nothing to stdout or stderr and save or show no
figure, unless they fail; then their traceback is printed, every line prefixed with ``[rank k]``.
It runs when :mod:`guide.launcher` is imported, so a page needs no change.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, TextIO

from guide.launcher.errors import LaunchError
from guide.launcher.rank import Rank, under_torchrun
from guide.launcher.rank_main import teardown, to_cpu

__all__ = ["launch_in_torchrun", "speak_only_on_rank0"]


def launch_in_torchrun(fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict,
                       collective_timeout_s: float) -> list[Any]:
    """Run ``fn`` on this torchrun rank; every rank gets every rank's result, in rank order.

    The process group is torchrun's: ``nccl`` and one GPU per rank when CUDA is available, else
    gloo on the CPU. It is created on the first job and destroyed when the script exits.
    """
    import torch
    import torch.distributed as dist

    env_ws = int(os.environ["WORLD_SIZE"])
    if env_ws != world_size:
        raise LaunchError(
            f"this script runs under torchrun with WORLD_SIZE={env_ws}, but the job asks for "
            f"{world_size} ranks. Start it with `torchrun --nproc-per-node={world_size}` or pass "
            f"guide.world_size({world_size}) to launch()."
        )
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout_s),
                                device_id=device if device.type == "cuda" else None)
        atexit.register(_teardown_unless_failed)
    result = to_cpu(fn(Rank(rank, world_size, device, backend), *args, **kwargs))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, result)
    return gathered


def _teardown_unless_failed() -> None:
    """At exit: :func:`teardown` after a script that finished; nothing after one that died of an
    uncaught exception (``sys.last_value`` is set), whose peers may be gone or stuck elsewhere: the
    final barrier would fail or wait ``collective_timeout_s``, only to repeat the error already shown.
    """
    if getattr(sys, "last_value", None) is None:
        teardown()


def speak_only_on_rank0() -> None:
    """Under torchrun, silence every rank but 0, and make each rank's traceback name its rank.

    On ranks other than 0, stdout and stderr go to ``os.devnull`` and matplotlib's ``show`` and
    ``savefig`` do nothing. On every rank, an uncaught exception is printed to the real stderr with
    each line prefixed ``[rank k]``, so interleaved failures from several ranks stay attributable.
    Outside torchrun, and when called again, it does nothing.
    """
    if not under_torchrun() or getattr(sys.excepthook, "guide_rank", None) is not None:
        return
    rank = int(os.environ.get("RANK", "0"))
    sys.excepthook = _prefixed_excepthook(rank, sys.stderr)
    if rank == 0:
        return
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (replaces stdout for the process's life)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (warnings repeat rank 0's)
    _figures_off()


def _prefixed_excepthook(rank: int, stream: TextIO) -> Callable[..., None]:
    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        stream.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        stream.flush()

    hook.guide_rank = rank  # type: ignore[attr-defined]  (marks the hook as installed)
    return hook


def _figures_off() -> None:
    """Make ``plt.show()``, ``plt.savefig()`` and ``Figure.savefig()`` do nothing in this process."""
    import matplotlib.figure
    import matplotlib.pyplot as plt

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    plt.show = nothing
    matplotlib.figure.Figure.savefig = nothing  # plt.savefig calls it
