"""guide: the code the DDP-vs-FSDP2 site runs, measures and asserts with.

The names below are the public API every page uses: :func:`~guide.launcher.launch` runs a worker on
N ranks, :class:`~guide.launcher.Rank` is what the worker gets, :func:`~guide.launcher.world_size` is
the scale to ask for, and the exception classes name the rank at fault when a job fails;
:class:`~guide.page.Page` is how a page declares itself (its section, key API and world sizes);
:data:`SUPPORTED_TORCH` is the torch this needs. Everything else lives in its own module, one concept
each: import it from there (``from guide.model import build_model``).
"""

from __future__ import annotations

from guide.launcher import (
    JobTimeout,
    LaunchError,
    Rank,
    RankDied,
    RankError,
    RankHung,
    RankOutOfMemory,
    RankRaised,
    launch,
    under_torchrun,
    world_size,
)
from guide.launcher import torch_support
from guide.launcher.torch_support import torch_version_ok
from guide.page import Page

#: The torch releases this guide supports (:func:`~guide.launcher.launch` refuses any other).
SUPPORTED_TORCH = torch_support.SUPPORTED_TORCH

__all__ = [
    "SUPPORTED_TORCH",
    "JobTimeout",
    "LaunchError",
    "Page",
    "Rank",
    "RankDied",
    "RankError",
    "RankHung",
    "RankOutOfMemory",
    "RankRaised",
    "launch",
    "torch_version_ok",
    "under_torchrun",
    "world_size",
]
