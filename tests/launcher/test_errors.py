"""The exception classes carry what they are given: the message a user reads, every rank's story
only when there is one, and the fields a caller branches on."""

from __future__ import annotations

import pytest

from guide.launcher import errors


def test_a_rank_error_without_details_is_its_message_alone() -> None:
    e = errors.RankError("rank 1 died", rank=1)
    assert (str(e), e.rank, e.details) == ("rank 1 died", 1, "")


def test_details_follow_the_message_after_a_blank_line() -> None:
    e = errors.RankDied("rank 0 died", rank=0, details="rank 0: SIGKILL\nrank 1: ok")
    assert str(e) == "rank 0 died\n\nrank 0: SIGKILL\nrank 1: ok"
    assert e.details == "rank 0: SIGKILL\nrank 1: ok"


def test_rank_raised_keeps_the_remote_exception() -> None:
    e = errors.RankRaised("rank 1 raised", 1, "ValueError", "Traceback ...", details="story")
    assert (e.rank, e.exc_type, e.remote_traceback, e.details) == (
        1, "ValueError", "Traceback ...", "story")
    assert str(e) == "rank 1 raised\n\nstory"
    assert str(errors.RankRaised("m", 0, "E", "tb")) == "m"


def test_out_of_memory_keeps_the_request_the_budget_and_the_remote_exception() -> None:
    e = errors.RankOutOfMemory("rank 0 OOM", 0, "OutOfMemoryError", "tb", requested_bytes=1024,
                               limit_mib=512, details="story")
    assert (e.rank, e.exc_type, e.remote_traceback, e.requested_bytes, e.limit_mib, e.details) == (
        0, "OutOfMemoryError", "tb", 1024, 512, "story")
    assert str(e) == "rank 0 OOM\n\nstory"
    assert str(errors.RankOutOfMemory("m", 0, "E", "tb", None, None)) == "m"


@pytest.mark.parametrize("cls", [errors.RankDied, errors.RankHung, errors.JobTimeout,
                                 errors.RankRaised, errors.RankOutOfMemory])
def test_every_rank_failure_is_a_rank_error_and_a_runtime_error(cls: type) -> None:
    assert issubclass(cls, errors.RankError) and issubclass(cls, RuntimeError)
    assert not issubclass(errors.LaunchError, errors.RankError)
