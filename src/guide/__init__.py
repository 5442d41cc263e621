"""guide: the code the DDP-vs-FSDP2 site runs, measures and asserts with.

One concept per module:

* :mod:`guide.launcher` -- run a worker on N ranks (forkserver + gloo locally, or under torchrun).
* :mod:`guide.model` -- the mini transformer every example trains.
* :mod:`guide.sharding` -- one function per data-parallel policy (DDP, FSDP2 per block + root).
* :mod:`guide.data` -- deterministic synthetic token batches and the per-rank slice of a batch.
* :mod:`guide.training` -- the plain training loop and the single-process reference run.
* :mod:`guide.checks` -- the assertions that fail the build: equivalence and sharding.
* :mod:`guide.plotting` -- one figure style for the whole site.
* :mod:`guide.comm` -- count each collective a rank issues; the 2Ψ-vs-3Ψ model; lower-bound times.
* :mod:`guide.peak_memory` -- a rank's measured peak memory during a step (VmHWM on CPU, CUDA allocator stats).
* :mod:`guide.memory` -- per-rank model-state bytes (DDP, ZeRO-1, FSDP2) by the ZeRO model; the ``guide-memory`` calculator.
* :mod:`guide.model_state` -- measure the parameter, gradient and optimizer bytes a rank really holds.
* :mod:`guide.precision` -- which dtype each tensor has under mixed precision; bf16's rounding and the loss-gap bound.
* :mod:`guide.steps` -- a training step taken apart: loss, micro-batches, a shard's gradient norm, a phased memory step.
* :mod:`guide.knob_plots` -- the charts of the FSDP2-knob pages.
"""

from __future__ import annotations

import re

#: The torch releases this guide supports (see README: why this lower bound).
SUPPORTED_TORCH = ">=2.9"
_MIN_TORCH = (2, 9)


def torch_version_ok(version: str) -> bool:
    """True if ``version`` (e.g. ``"2.13.0+cpu"``) satisfies :data:`SUPPORTED_TORCH`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and (int(match[1]), int(match[2])) >= _MIN_TORCH


from guide.launcher import (  # noqa: E402 (the version gate above is used by launch)
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

__all__ = [
    "SUPPORTED_TORCH",
    "JobTimeout",
    "LaunchError",
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
