"""Who this process is in a job: the :class:`Rank` every worker gets, and the world size to ask for.

Nothing here imports torch: an example calls :func:`world_size` at the top of the page, before the
first job starts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from guide.world_sizes import Contract, check

__all__ = ["Rank", "under_torchrun", "world_size"]


@dataclasses.dataclass(frozen=True)
class Rank:
    """Who this process is in the job: passed as the first argument to every worker."""

    rank: int
    world_size: int
    device: Any  # torch.device; kept untyped so importing this module does not import torch
    backend: str

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that speaks for the job."""
        return self.rank == 0


def under_torchrun() -> bool:
    """True when this process was started by ``torchrun`` (or another launcher that sets its env)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    )


def world_size(default: int, *, supports: Iterable[int] | None = None, why: str = "") -> int:
    """The number of ranks an example should use: torchrun's ``WORLD_SIZE`` if set, else ``default``.

    Examples call this once, at the top, so that ``torchrun --nproc-per-node=4 example.py`` and
    ``python example.py`` run the same code at their own scale. ``supports`` is the example's
    world-size contract (:mod:`guide.world_sizes`): the sizes it runs and checks correctly, ``why``
    the reason it is restricted. Under torchrun at any other size the call stops the script at once
    with :class:`~guide.world_sizes.UnsupportedWorldSize`, naming the sizes and the command to use.
    The docs and the test matrix read the same call without running it
    (:func:`guide.world_sizes.declared`).
    """
    contract = None if supports is None else Contract(default, tuple(supports), why)
    if not under_torchrun():
        return default
    got = int(os.environ["WORLD_SIZE"])
    return got if contract is None else check(got, contract)
