"""The launcher's failure story, field by field: the exit record it keeps for each rank
(guide.launcher.supervise._exit_record), the exception it builds from the records (failure) and the
exception classes themselves (guide.launcher.errors). tests/launcher/test_supervise.py checks who is
blamed; these check that everything the user reads (type, traceback, details, bytes) is carried whole.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from guide.launcher.errors import RankDied, RankHung, RankOutOfMemory, RankRaised
from guide.launcher.supervise import RankExit, _exit_record, describe_exit, failure

pytestmark = pytest.mark.timeout(60)


def _error(when: float, message: str, exc_type: str = "RuntimeError") -> dict:
    return {"time": when, "type": exc_type, "message": message, "traceback": f"TB of {exc_type}"}


@dataclass
class _Proc:
    """What _exit_record reads of a multiprocessing.Process."""

    exitcode: int | None


# -- the exit record of each rank -----------------------------------------------------------------

@pytest.mark.parametrize("code", [0, None])
def test_a_rank_that_finished_or_runs_keeps_when_it_was_seen(tmp_path: Path, code: int | None) -> None:
    (tmp_path / "rank0.error").write_text(json.dumps(_error(1.0, "stale")))  # not read: no failure
    assert _exit_record(0, _Proc(code), tmp_path, {0: 5.0}) == RankExit(0, code, 5.0)
    assert _exit_record(0, _Proc(code), tmp_path, {}) == RankExit(0, code, None)


def test_a_failed_rank_carries_its_own_error_record(tmp_path: Path) -> None:
    error = _error(4.5, "boom", "KeyError")
    (tmp_path / "rank1.error").write_text(json.dumps(error))
    assert _exit_record(1, _Proc(1), tmp_path, {1: 7.0, 0: 2.0}) == RankExit(1, 1, 7.0, error)
    assert _exit_record(1, _Proc(-9), tmp_path / "nothing", {1: 7.0}) == RankExit(1, -9, 7.0, None)


def test_a_rank_that_died_after_the_last_poll_is_dated_now(tmp_path: Path) -> None:
    """Later than anything it could have caused: it cannot take the blame from a peer by date."""
    before = time.time()
    record = _exit_record(1, _Proc(-signal.SIGKILL), tmp_path, {0: 1.0})
    assert record.seen_at is not None and before <= record.seen_at <= time.time()


# -- the exception built from the records ---------------------------------------------------------

def test_a_silent_death_tells_every_ranks_story_and_nothing_else() -> None:
    err = failure([RankExit(0, 0, 1.0), RankExit(1, -signal.SIGKILL, 2.0)], collective_timeout_s=30)
    assert type(err) is RankDied
    assert err.details == "Ranks:\n  rank 0: finished\n  rank 1: was killed by SIGKILL"
    assert str(err) == "rank 1 of 2 was killed by SIGKILL.\n\n" + err.details


def test_a_rank_that_raised_next_to_a_running_peer_raised_it_did_not_hang() -> None:
    """Only a gloo timeout means a peer hung; any other error is the rank's own."""
    err = failure([RankExit(0, 1, 1.0, _error(0.5, "boom", "ValueError")), RankExit(1, None)], 30,
                  stacks="--- Python stack of rank 1 ---\nsleep")
    assert type(err) is RankRaised and (err.rank, err.exc_type, err.remote_traceback) == \
        (0, "ValueError", "TB of ValueError")
    assert err.details == ("Ranks:\n  rank 0: raised ValueError: boom [exit code 1]\n"
                           "  rank 1: still running (killed by the launcher)\n\n"
                           "--- Python stack of rank 1 ---\nsleep")


def test_a_hang_carries_the_stacks_after_the_stories() -> None:
    err = failure([RankExit(0, 1, 9.0, _error(8.0, "Timed out waiting 5000ms")), RankExit(1, None)],
                  5, stacks="STACKS")
    assert type(err) is RankHung
    assert err.details == ("Ranks:\n  rank 0: raised RuntimeError: Timed out waiting 5000ms "
                           "[exit code 1; reads like a consequence of another failure]\n"
                           "  rank 1: still running (killed by the launcher)\n\nSTACKS")


def test_an_empty_error_message_is_reported_as_empty() -> None:
    err = failure([RankExit(0, 1, 1.0, _error(0.5, "  \n", "KeyError"))], 30)
    assert str(err).startswith("rank 0 of 1 raised KeyError: \n\nTraceback from rank 0:\nTB of KeyError")


def test_out_of_memory_carries_type_traceback_details_and_an_unknown_size() -> None:
    err = failure([RankExit(0, 1, 1.0, _error(0.5, "MemoryError: out of memory", "MemoryError"))], 30)
    assert type(err) is RankOutOfMemory
    assert (err.exc_type, err.remote_traceback, err.requested_bytes, err.limit_mib) == \
        ("MemoryError", "TB of MemoryError", None, None)
    assert err.details == ("Ranks:\n  rank 0: raised MemoryError: MemoryError: out of memory "
                           "[exit code 1]")
    assert str(err).startswith("rank 0 of 1 ran out of memory: it tried to allocate an unknown "
                               "amount.\n\n")


@pytest.mark.parametrize("code, words", [(1, "exited with code 1 without raising"),
                                         (0, "exited with code 0 without raising"),
                                         (-signal.SIGKILL, "was killed by SIGKILL"),
                                         (-200, "was killed by signal 200")])
def test_an_exit_code_in_words(code: int, words: str) -> None:
    assert describe_exit(code) == words


# -- the exception classes ------------------------------------------------------------------------

def test_rank_raised_keeps_every_field() -> None:
    err = RankRaised("msg", 3, "ValueError", "TB", details="D")
    assert (err.rank, err.exc_type, err.remote_traceback, err.details, str(err)) == \
        (3, "ValueError", "TB", "D", "msg\n\nD")
    plain = RankRaised("msg", 3, "ValueError", "TB")
    assert (plain.details, str(plain)) == ("", "msg")


def test_rank_out_of_memory_keeps_every_field() -> None:
    err = RankOutOfMemory("msg", 1, "MemoryError", "TB", 2**20, 800, details="D")
    assert (err.rank, err.exc_type, err.remote_traceback, err.requested_bytes, err.limit_mib,
            err.details, str(err)) == (1, "MemoryError", "TB", 2**20, 800, "D", "msg\n\nD")
    plain = RankOutOfMemory("msg", 1, "MemoryError", "TB", None, None)
    assert (plain.details, str(plain)) == ("", "msg")


# -- every rank's story, and the root cause among them ---------------------------------------------

def test_every_rank_shows_its_type_message_and_exit_code_and_the_earliest_is_the_cause() -> None:
    """Rank 0 raises RuntimeError("A"); rank 1 raises ValueError("B") 0.3 s later: rank 0 is the
    cause, with its whole traceback, and rank 1's message is shown too."""
    exits = [RankExit(0, 1, 101.0, _error(100.0, "A")),
             RankExit(1, 1, 101.0, _error(100.3, "B", "ValueError")),
             RankExit(2, -signal.SIGKILL, 101.0)]
    err = failure(exits, 30)
    assert type(err) is RankRaised and err.rank == 0
    assert str(err).startswith("rank 0 of 3 raised RuntimeError: A\n\nTraceback from rank 0:\n"
                               "TB of RuntimeError")
    assert err.details == ("Ranks:\n  rank 0: raised RuntimeError: A [exit code 1]\n"
                           "  rank 1: raised ValueError: B [exit code 1]\n"
                           "  rank 2: was killed by SIGKILL")


def test_a_long_message_shows_its_first_lines_and_how_many_more() -> None:
    message = "\n".join(f"line {i}" for i in range(10))
    err = failure([RankExit(0, 1, 1.0, _error(0.5, message))], 30)
    assert err.details == ("Ranks:\n  rank 0: raised RuntimeError: line 0\n      line 1\n"
                           "      line 2\n      ... (7 more lines) [exit code 1]")


def test_a_signal_after_raising_is_shown_as_the_signal() -> None:
    err = failure([RankExit(0, -signal.SIGTERM, 1.0, _error(0.5, "boom"))], 30)
    assert err.details == "Ranks:\n  rank 0: raised RuntimeError: boom [was killed by SIGTERM]"


@pytest.mark.parametrize("message, exc_type", [
    ("[gloo] Connection closed by peer [127.0.0.1]:1234", "RuntimeError"),
    ("Timed out waiting 30000ms for recv operation to complete", "DistBackendError"),
    ("/tmp/x/async.partial has no .metadata: dcp.save did not finish", "CheckpointError"),
    ("[Errno 2] No such file or directory: '/tmp/x/__0_0.distcp'", "FileNotFoundError"),
    ("whatever it says", "FileNotFoundError"),
])
def test_a_consequence_is_not_blamed_over_a_later_originating_error(message: str,
                                                                   exc_type: str) -> None:
    """The consequence came first (the rank noticed fast); the origin raised later but is blamed."""
    exits = [RankExit(0, 1, 101.0, _error(100.0, message, exc_type)),
             RankExit(1, 1, 101.0, _error(100.3, "the real fault", "ValueError"))]
    err = failure(exits, 30)
    assert err.rank == 1 and str(err).startswith("rank 1 of 2 raised ValueError: the real fault")
    assert "reads like a consequence" in err.details.splitlines()[1]
    assert message.splitlines()[0] in err.details


def test_when_every_error_is_a_consequence_the_earliest_is_blamed() -> None:
    exits = [RankExit(0, 1, 101.0, _error(100.2, "Connection closed by peer")),
             RankExit(1, 1, 101.0, _error(100.1, "x.partial has no .metadata", "CheckpointError"))]
    assert failure(exits, 30).rank == 1
