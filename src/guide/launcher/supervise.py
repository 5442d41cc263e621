"""Watch a local job's ranks and, when one fails, stop the job and name the rank at fault.

:func:`supervise` polls the rank processes. On the first failure it waits a short grace period
(:data:`GRACE_S`) for the other ranks to report their own errors, asks any rank still running for its
Python stack, and raises; a job that outlives its deadline is killed with :class:`JobTimeout`.

Which rank to blame is decided by two pure functions, testable without processes: :func:`root_cause`
picks the culprit from the ranks' exit records, :func:`failure` turns the records into the exception
(:class:`RankRaised`, :class:`RankOutOfMemory`, :class:`RankHung` or :class:`RankDied`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import time
from collections.abc import Sequence
from multiprocessing import connection
from pathlib import Path
from time import monotonic
from typing import Any

from guide.launcher.errors import (
    JobTimeout,
    RankDied,
    RankError,
    RankHung,
    RankOutOfMemory,
    RankRaised,
)

__all__ = ["GRACE_S", "MESSAGE_LINES", "RankExit", "describe_exit", "failure", "is_consequence",
           "root_cause", "supervise"]

#: Seconds the launcher waits, after the first rank fails, for the others to report their own errors.
GRACE_S = 2.0

_GLOO_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
#: What a rank says when it is not the culprit but noticed a peer go away.
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crashing")
#: Errors that are usually a *consequence* of another rank's failure: a peer gone, a timeout waiting
#: for a peer, a file another rank should have written (or already moved). Such a rank is blamed
#: only when no rank failed otherwise.
_CONSEQUENCE = re.compile(
    _PEER_GONE.pattern + r"|Broken pipe|timed out|timeout|No such file or directory|is missing"
    r"|has no \.metadata", re.IGNORECASE)
_CONSEQUENCE_TYPES = frozenset({"FileNotFoundError", "TimeoutError", "BrokenPipeError",
                                "ConnectionResetError", "ConnectionAbortedError"})
#: How many lines of each rank's message the report shows (the root cause's traceback is whole).
MESSAGE_LINES = 3
_OOM = re.compile(r"can't allocate memory|out of memory|Cannot allocate memory|MemoryError")
_OOM_BYTES = re.compile(r"tried to allocate (\d+) bytes")


@dataclasses.dataclass(frozen=True)
class RankExit:
    """How one rank ended, as the supervisor recorded it.

    ``exitcode`` is the process's (``None``: still running when the job was stopped; negative: the
    signal that killed it). ``seen_at`` is the wall-clock time (``time.time()``) the supervisor saw
    the process gone. ``error`` is the rank's own record when it raised: ``time`` (when it raised,
    ``time.time()`` in the rank), ``type``, ``message`` and ``traceback``. ``fatal_stack`` is the
    Python stack faulthandler wrote when a fatal signal killed the rank (empty otherwise, and for
    SIGKILL, which no process can catch).
    """

    rank: int
    exitcode: int | None
    seen_at: float | None = None
    error: dict[str, Any] | None = None
    fatal_stack: str = ""

    @property
    def failed(self) -> bool:
        """True if the rank ended badly: raised, exited non-zero, or was killed by a signal."""
        return self.exitcode is not None and self.exitcode != 0


def supervise(procs: Sequence[Any], workdir: Path, deadline_s: float, collective_timeout_s: float,
              memory_limit_mib: int | None = None) -> None:
    """Wait for the ranks; on the first failure or at the deadline, raise (the caller kills the rest).

    ``procs`` are the rank processes in rank order (``multiprocessing.Process``).
    """
    start = monotonic()
    seen_dead: dict[int, float] = {}
    first_failure: float | None = None
    while True:
        now = time.time()
        for rank, proc in enumerate(procs):
            if proc.exitcode is not None and rank not in seen_dead:
                seen_dead[rank] = now
                if proc.exitcode != 0 and first_failure is None:
                    first_failure = monotonic()
        alive = [p for p in procs if p.exitcode is None]
        if first_failure is not None and (not alive or monotonic() - first_failure > GRACE_S):
            stacks = dump_stacks(procs, workdir) if alive else ""
            exits = [_exit_record(rank, proc, workdir, seen_dead) for rank, proc in enumerate(procs)]
            raise failure(exits, collective_timeout_s, memory_limit_mib, stacks)
        if not alive:
            return
        if monotonic() - start > deadline_s:
            stacks = dump_stacks(procs, workdir)
            ranks = [r for r, p in enumerate(procs) if p.exitcode is None]
            raise JobTimeout(
                f"the job did not finish within deadline_s={deadline_s:g} s; ranks {ranks} were still "
                "running and were killed. Raise deadline_s if the work is really this long.",
                ranks[0], stacks)
        connection.wait([p.sentinel for p in alive], timeout=0.2)


def root_cause(exits: Sequence[RankExit]) -> int:
    """The rank to blame: the earliest originating failure, not a rank reporting a consequence.

    A rank that raised is dated by its own record (``time.time()`` when it raised); a rank that died
    without a word (a signal, ``os._exit``) by when the supervisor saw it go, which can be *later*
    than the error of a peer that noticed the death first ("Connection reset by peer"). So ranks
    whose error is consequence-like (:func:`is_consequence`: a peer gone, a timeout waiting for a
    peer, a missing file) are ruled out first, whatever their timestamps; among the rest (or, if
    all are consequences, among those) the earliest is blamed. Raises ``ValueError`` if no rank
    failed.
    """
    failed = [e for e in exits if e.failed]
    if not failed:
        raise ValueError("root_cause() needs at least one failed rank; every rank finished or runs.")
    primary = [e for e in failed if not (e.error and is_consequence(e.error))]
    return min(primary or failed, key=_when).rank


def is_consequence(error: dict[str, Any]) -> bool:
    """True if a rank's error record reads like a consequence of another rank's failure (a peer
    gone, a timeout waiting for a peer, a file not there) rather than a fault of its own."""
    return error["type"] in _CONSEQUENCE_TYPES or bool(_CONSEQUENCE.search(error["message"]))


def failure(exits: Sequence[RankExit], collective_timeout_s: float,
            memory_limit_mib: int | None = None, stacks: str = "") -> RankError:
    """The exception that tells this failed job's story, blaming :func:`root_cause`.

    ``stacks`` is the Python stack text of ranks still running (see :func:`dump_stacks`).
    """
    ws = len(exits)
    root = root_cause(exits)
    hung = [e.rank for e in exits if e.exitcode is None]
    details = "Ranks:\n  " + "\n  ".join(_story(e) for e in exits)
    err = exits[root].error
    if err and _GLOO_TIMEOUT.search(err["message"]) and hung:
        return RankHung(
            f"rank {hung[0]} of {ws} hung: rank {root} waited collective_timeout_s="
            f"{collective_timeout_s:g} s for it in a collective. Rank {root}'s error: "
            f"{err['type']}: {_first_line(err['message'])}",
            hung[0], details + "\n\n" + stacks)
    if err and _OOM.search(err["message"]):
        match = _OOM_BYTES.search(err["message"])
        requested = int(match[1]) if match else None
        limit = memory_limit_mib
        return RankOutOfMemory(
            f"rank {root} of {ws} ran out of memory: it tried to allocate "
            f"{'an unknown amount' if requested is None else f'{requested / 2**20:.1f} MiB'}"
            f"{'' if limit is None else f' with a budget of {limit} MiB per rank'}.\n\n"
            f"Traceback from rank {root}:\n{err['traceback']}",
            root, err["type"], err["traceback"], requested, limit, details)
    with_stacks = details + (f"\n\n{stacks}" if stacks else "")
    if err:
        return RankRaised(
            f"rank {root} of {ws} raised {err['type']}: {_first_line(err['message'])}\n\n"
            f"Traceback from rank {root}:\n{err['traceback']}",
            root, err["type"], err["traceback"], with_stacks)
    exitcode = exits[root].exitcode
    assert exitcode is not None  # root_cause only returns a failed rank
    died = exits[root].fatal_stack
    where = f"\n\n--- Python stack of rank {root} when it died ---\n{died}" if died else ""
    return RankDied(f"rank {root} of {ws} {describe_exit(exitcode)}.", root,
                    with_stacks + where)


def describe_exit(code: int) -> str:
    """How a rank that did not raise ended, in words: ``was killed by SIGKILL``, ``exited with ...``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without raising"


def dump_stacks(procs: Sequence[Any], workdir: Path) -> str:
    """Ask each live rank for its Python stack (faulthandler on SIGUSR1) and return the text."""
    alive = [(r, p) for r, p in enumerate(procs) if p.exitcode is None]
    for _, proc in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(0.5)
    parts = []
    for rank, _ in alive:
        path = workdir / f"rank{rank}.stack"
        text = path.read_text() if path.exists() else "(no stack: the rank did not answer SIGUSR1)"
        parts.append(f"--- Python stack of rank {rank} ---\n{text.strip()}")
    return "\n".join(parts)


def _exit_record(rank: int, proc: Any, workdir: Path, seen_dead: dict[int, float]) -> RankExit:
    code = proc.exitcode
    if code is None or code == 0:
        return RankExit(rank, code, seen_dead.get(rank))
    path = workdir / f"rank{rank}.error"
    error = json.loads(path.read_text()) if path.exists() else None
    stack = workdir / f"rank{rank}.stack"  # faulthandler's, if a fatal signal killed the rank
    fatal_stack = stack.read_text().strip() if code < 0 and stack.exists() else ""
    # A rank that died after the last poll is dated now: later than anything it could have caused.
    return RankExit(rank, code, seen_dead.get(rank, time.time()), error, fatal_stack)


def _when(e: RankExit) -> float:
    """When a failed rank failed: its own record's time, else when the supervisor saw it gone."""
    if e.error:
        return float(e.error["time"])
    if e.seen_at is None:
        raise ValueError(f"rank {e.rank} failed without an error record or a time it was seen gone.")
    return e.seen_at


def _story(e: RankExit) -> str:
    """One rank's line (more for a long message): how it ended, its message's first lines, its
    exit code or signal."""
    if e.exitcode is None:
        return f"rank {e.rank}: still running (killed by the launcher)"
    if not e.failed:
        return f"rank {e.rank}: finished"
    if e.error:
        code = describe_exit(e.exitcode) if e.exitcode < 0 else f"exit code {e.exitcode}"
        lines = e.error["message"].strip().splitlines()
        head = (": " + "\n      ".join(lines[:MESSAGE_LINES])) if lines else ""
        more = f"\n      ... ({len(lines) - MESSAGE_LINES} more lines)" \
            if len(lines) > MESSAGE_LINES else ""
        note = "; reads like a consequence of another failure" if is_consequence(e.error) else ""
        return f"rank {e.rank}: raised {e.error['type']}{head}{more} [{code}{note}]"
    return f"rank {e.rank}: {describe_exit(e.exitcode)}"


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""
