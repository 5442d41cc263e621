"""Which torch this guide runs on: the version floor, and a live check of the gloo bug it avoids.

The floor (:data:`SUPPORTED_TORCH`) is checked in the launching process before any rank starts.
The property behind it, a gloo reduce-scatter whose ``AVG`` really averages (pytorch#162338, fixed in
torch 2.9), is checked again inside every local job by :func:`check_gloo_avg`, so that a backport, a
patched build or a regression cannot silently scale FSDP2's gradients by the world size.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from guide.launcher.errors import LaunchError

__all__ = ["SUPPORTED_TORCH", "check_gloo_avg", "check_torch", "flat_collective",
           "flat_collective_name", "torch_version_ok"]

#: The torch releases this guide supports. Why this floor: the module docstring above, and the
#: install page's "What breaks below the floor" (``docs/pages/install.md``).
SUPPORTED_TORCH = ">=2.9"
_MIN_TORCH = (2, 9)


def torch_version_ok(version: str) -> bool:
    """True if ``version`` (e.g. ``"2.13.0+cpu"``) satisfies :data:`SUPPORTED_TORCH`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and (int(match[1]), int(match[2])) >= _MIN_TORCH


#: The flat-tensor collectives by kind: the newer name first, then torch 2.9's (same arguments).
_FLAT_NAMES = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
               "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}


def flat_collective_name(kind: str) -> str:
    """The :mod:`torch.distributed` name of the flat-tensor ``"all_gather"`` or ``"reduce_scatter"``
    on this torch: ``all_gather_single`` / ``reduce_scatter_single`` where they exist, else
    torch 2.9's ``all_gather_into_tensor`` / ``reduce_scatter_tensor``."""
    import torch.distributed as dist

    if kind not in _FLAT_NAMES:
        raise ValueError(f"flat collective kind must be one of {sorted(_FLAT_NAMES)}, got {kind!r}.")
    newer, older = _FLAT_NAMES[kind]
    return newer if hasattr(dist, newer) else older


def flat_collective(kind: str) -> Callable[..., Any]:
    """That function, looked up when called, so that a wrapper in place (a
    :class:`guide.comm.log.CollectiveLog`, a test's fault) is the one that runs."""
    import torch.distributed as dist

    return getattr(dist, flat_collective_name(kind))


def check_torch() -> None:
    """Raise :class:`LaunchError` naming the fix if the installed torch is below the floor."""
    import torch

    if not torch_version_ok(torch.__version__):
        raise LaunchError(
            f"torch {torch.__version__} is not supported: this guide needs torch {SUPPORTED_TORCH} "
            f"(fully_shard and a correct gloo AVG reduction). `pip install 'torch{SUPPORTED_TORCH}'`."
        )


def check_gloo_avg(rank: int, world_size: int) -> None:
    """Refuse to train where gloo's AVG reduce-scatter sums (pytorch#162338, torch <= 2.8): FSDP2
    reduces fp32 gradients with it, and the bug silently scales every gradient by world_size.

    Runs inside a rank, on the job's process group; every rank must call it (it is a collective).
    """
    import torch
    import torch.distributed as dist

    if world_size == 1:
        return
    out = torch.empty(1)
    mine = torch.full((world_size,), float(rank))  # every rank sends its own rank number
    flat_collective("reduce_scatter")(out, mine, op=dist.ReduceOp.AVG)
    expected = (world_size - 1) / 2
    if not abs(out.item() - expected) <= 1e-6:  # a NaN fails too
        raise LaunchError(
            f"gloo reduce_scatter_tensor(op=AVG) returned {out.item()} instead of the mean "
            f"{expected}: this torch ({torch.__version__}) has the gloo AVG bug (pytorch#162338) and "
            f"FSDP2 gradients would be {world_size}x too large. Upgrade torch (>= 2.9).")
