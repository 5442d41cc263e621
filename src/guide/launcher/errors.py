"""What can go wrong in a job, as exception classes that name the rank at fault.

:class:`LaunchError` is a request that cannot run (bad arguments, a torch this guide does not
support, a world size torchrun disagrees with). Every other class is a :class:`RankError`: the job
started and a rank failed; ``rank`` is the root cause and ``details`` tells every rank's story.
"""

from __future__ import annotations

__all__ = [
    "JobTimeout",
    "LaunchError",
    "RankDied",
    "RankError",
    "RankHung",
    "RankOutOfMemory",
    "RankRaised",
]


class LaunchError(RuntimeError):
    """The job could not be started as asked (bad world size, mismatched torchrun, ...)."""


class RankError(RuntimeError):
    """A rank failed. ``rank`` is the root cause; ``details`` has every rank's story."""

    def __init__(self, message: str, rank: int, details: str = "") -> None:
        super().__init__(message + (f"\n\n{details}" if details else ""))
        self.rank = rank
        self.details = details


class RankRaised(RankError):
    """A rank raised an exception; ``exc_type`` is its class name, ``remote_traceback`` its traceback."""

    def __init__(self, message: str, rank: int, exc_type: str, remote_traceback: str,
                 details: str = "") -> None:
        super().__init__(message, rank, details)
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


class RankOutOfMemory(RankRaised):
    """A rank could not allocate memory. ``requested_bytes`` is what it asked for (when the
    allocator said), ``limit_mib`` the per-rank budget it ran under (``None`` without one)."""

    def __init__(self, message: str, rank: int, exc_type: str, remote_traceback: str,
                 requested_bytes: int | None, limit_mib: int | None, details: str = "") -> None:
        super().__init__(message, rank, exc_type, remote_traceback, details)
        self.requested_bytes = requested_bytes
        self.limit_mib = limit_mib


class RankDied(RankError):
    """A rank exited without raising: killed by a signal or ``os._exit``."""


class RankHung(RankError):
    """A rank stopped taking part: its peers timed out waiting for it in a collective."""


class JobTimeout(RankError):
    """The whole job outlived its deadline."""
