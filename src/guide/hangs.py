"""Show a hang without hanging the build: a job that must fail, bounded, and what each rank saw.

A page that reproduces a collective mismatch on purpose (a rank that skips a module the others
run) must end either way: the ranks' process group gets a timeout of a few seconds and the
launcher a deadline (:func:`guide.launch`'s ``collective_timeout_s`` and ``deadline_s``), so the
job fails fast instead of waiting torch's default 30 minutes. :func:`expect_failure` runs such a
job, requires it to fail (else ``[pitfall reproduces]`` fails the page: the mistake stopped
hanging), and returns what each rank saw: torch's error, the FSDP2 collective the rank was
waiting in, how long it waited, and what the rank's C++ code wrote to stderr (gloo aborts the
process on a size mismatch: its message never reaches Python). Inside the worker,
:func:`witness` records it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from guide import checks
from guide.launcher import RankError, launch

__all__ = ["Failure", "RankStory", "expect_failure", "gist", "waiting_in", "witness"]

#: FSDP2's collective functions (``_fsdp_collectives.py``), as a rank's stack names them, and
#: what each one is: the first found from the innermost frame outwards names the wait.
_COLLECTIVES = (("foreach_all_gather", "all-gather"), ("foreach_reduce", "reduce-scatter"),
                ("all_gather", "all-gather"), ("reduce_scatter", "reduce-scatter"),
                ("all_reduce", "all-reduce"), ("barrier", "barrier"))
_WHERE = re.compile(r"\s*\[[^\]]*\](?::\d+)?")  # "[/path/pair.cc:553]", "[127.0.0.1]:51426"
_DIED_STACK = "when it died ---"


@dataclasses.dataclass(frozen=True)
class RankStory:
    """How one rank of a failed job ended: ``error`` is torch's message as :func:`gist` shows it
    (``""``: the rank raised nothing, e.g. killed by a signal), ``waiting_in`` the collective its
    stack was in (``""``: none), ``seconds`` from entering the witnessed block to the error
    (``None`` without an error), ``stderr`` what its C++ code wrote."""

    rank: int
    error: str
    waiting_in: str
    seconds: float | None
    stderr: str


@dataclasses.dataclass(frozen=True)
class Failure:
    """A job that failed as expected: the launcher's exception, each rank's story, and the
    wall-clock seconds the job took from launch to the exception (startup included)."""

    error: RankError
    ranks: list[RankStory]
    seconds: float

    @property
    def messages(self) -> list[str]:
        """Everything the job said, as text: the launcher's exception (its class first), each
        rank's error and each rank's stderr."""
        return [f"{type(self.error).__name__}: {self.error}",
                *(s.error for s in self.ranks if s.error),
                *(s.stderr for s in self.ranks if s.stderr)]


def gist(message: str) -> str:
    """torch's message without its source location and addresses (``[/path/pair.cc:553]``,
    ``[127.0.0.1]:51426``) and on one line: what a reader pastes into a search box."""
    return " ".join(_WHERE.sub("", message).split())


def waiting_in(stack: str) -> str:
    """The collective a rank's stack text (a traceback, or faulthandler's dump) was waiting in:
    ``"all-gather"``, ``"reduce-scatter"``, ... (``""`` if none). Tracebacks list the innermost
    frame last, faulthandler's dumps first; FSDP2's own function names win over torch's."""
    found = [(name, what) for name, what in _COLLECTIVES if re.search(rf"\b{name}\b", stack)]
    return found[0][1] if found else ""


@contextlib.contextmanager
def witness(folder: str | os.PathLike, rank: int) -> Iterator[None]:
    """Inside a rank: run the block and, if it raises, write ``rank{r}.json`` in ``folder`` (the
    error, the collective the rank waited in, the seconds the block ran) before re-raising. The
    rank's stderr (file descriptor 2, where C++ writes) goes to ``rank{r}.stderr`` meanwhile."""
    folder = Path(folder)
    saved = os.dup(2)
    with open(folder / f"rank{rank}.stderr", "w") as err:  # noqa: PTH123
        os.dup2(err.fileno(), 2)
    start = time.monotonic()
    try:
        yield
    except BaseException as exc:
        record = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start,
                  "waiting_in": waiting_in(traceback.format_exc())}
        (folder / f"rank{rank}.json").write_text(json.dumps(record))
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def expect_failure(pitfall: str, worker: Callable[..., Any], world_size: int, *args: Any,
                   timeout_s: float, deadline_s: float = 60.0, **kwargs: Any) -> Failure:
    """Run ``worker(rank, folder, *args, **kwargs)`` on ``world_size`` ranks, with a process
    group timeout of ``timeout_s`` and a job deadline of ``deadline_s``; it must fail (else
    ``[pitfall reproduces]`` names ``pitfall``). ``folder`` is where the worker's
    :func:`witness` writes; it is removed afterwards."""
    folder = tempfile.mkdtemp(prefix="guide-hang-")
    start = time.monotonic()
    try:
        try:
            launch(worker, world_size, folder, *args, collective_timeout_s=timeout_s,
                   deadline_s=deadline_s, **kwargs)
        except RankError as exc:
            return Failure(exc, _stories(Path(folder), world_size, exc),
                           time.monotonic() - start)
        checks.expect("pitfall reproduces", pitfall, False,
                      f"the job finished on every rank in {time.monotonic() - start:.1f} s: the "
                      "mistake no longer hangs or fails; update this section of the page.")
        raise AssertionError("unreachable")  # pragma: no cover (expect raised)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stories(folder: Path, world_size: int, exc: RankError) -> list[RankStory]:
    """Each rank's story from its witness files; a rank killed by a signal gets its collective
    from the stack the launcher reported (faulthandler's, in the exception's details)."""
    died = exc.details.split(_DIED_STACK, 1)[1] if _DIED_STACK in exc.details else ""
    stories = []
    for rank in range(world_size):
        path, err = folder / f"rank{rank}.json", folder / f"rank{rank}.stderr"
        stderr = err.read_text().strip() if err.exists() else ""
        if path.exists():
            rec = json.loads(path.read_text())
            stories.append(RankStory(rank, gist(rec["error"]), rec["waiting_in"],
                                     rec["seconds"], stderr))
        else:
            stack = died if rank == exc.rank else ""
            stories.append(RankStory(rank, "", waiting_in(stack), None, stderr))
    return stories

