"""Failures end the job fast and name the rank at fault: with real ranks that raise, die, hang or
overrun, and (for the choice of culprit) with fake exit records whose timestamps mislead."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import guide
from guide.launcher.supervise import RankExit, dump_stacks, failure, root_cause

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------------------------------
# Real ranks. Each worker sleeps only as long as its test needs, so a launcher that stopped noticing
# the fault makes the test fail (no exception, or too slow) instead of hanging.


def _raise_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        raise ValueError("root cause on rank 1")
    dist.barrier()  # rank 0 waits here for a peer that is gone


@pytest.mark.usefixtures("warm_fork_server")  # the time budget is the launcher's
def test_raising_rank_fails_fast_with_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankRaised) as info:
        guide.launch(_raise_on_rank1, 2)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1 of 2 raised ValueError: root cause on rank 1" in str(err)
    assert "_raise_on_rank1" in err.remote_traceback


def _raise_then_peer_raises_later(rank: guide.Rank) -> None:
    if rank.rank == 0:
        raise ValueError("first")
    time.sleep(0.5)  # well inside GRACE_S
    raise RuntimeError("second, 0.5 s later")


@pytest.mark.usefixtures("warm_fork_server")
def test_peers_get_the_grace_period_to_report_their_own_errors() -> None:
    """After the first failure the supervisor waits GRACE_S, so a peer that fails a moment later
    is reported with its own error, not killed as "still running" (a supervisor that raised at once
    would lose the peer's story)."""
    with pytest.raises(guide.RankRaised) as info:
        guide.launch(_raise_then_peer_raises_later, 2)
    assert info.value.rank == 0 and "first" in str(info.value)
    assert "rank 1: raised RuntimeError" in info.value.details, info.value.details


def _killed_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.usefixtures("warm_fork_server")  # the time budget is the launcher's
def test_killed_rank_fails_fast_and_is_named() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankDied, match="rank 1 of 2 was killed by SIGKILL") as info:
        guide.launch(_killed_on_rank1, 2)
    assert time.monotonic() - start < 10
    assert info.value.rank == 1


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (no such process, or a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def _aborts_after_peers_finished(rank: guide.Rank) -> int:
    """Rank 1 finishes its work, writes its result, tears down with the others, and only then, once
    rank 0 has exited, dies by SIGABRT: the shape of a C++ destructor aborting at exit."""
    pids: list[int] = [0] * rank.world_size
    dist.all_gather_object(pids, os.getpid())
    if rank.rank == 1:
        def abort_once_peers_are_gone(code: int) -> None:
            deadline = time.monotonic() + 10
            while not all(_gone(pid) for pid in pids[:1]) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.abort()

        os._exit = abort_once_peers_are_gone  # the rank's last act after a clean teardown
    return rank.rank


def test_rank_killed_after_its_peers_finished_is_not_a_success() -> None:
    with pytest.raises(guide.RankDied, match="rank 1 of 2 was killed by SIGABRT") as info:
        guide.launch(_aborts_after_peers_finished, 2)
    assert info.value.rank == 1
    # every rank's story (no SIGUSR1 stacks: no rank was left running), then where rank 1 died
    stories, died = info.value.details.split("\n\n", 1)
    assert stories == "Ranks:\n  rank 0: finished\n  rank 1: was killed by SIGABRT"
    assert died.startswith("--- Python stack of rank 1 when it died ---\nFatal Python error: Aborted")
    assert "abort_once_peers_are_gone" in died


def _segfaults_in_a_named_function(rank: guide.Rank) -> None:
    def read_address_zero() -> None:
        ctypes.string_at(0)  # SIGSEGV in C: no Python exception, no error record

    if rank.rank == 1:
        read_address_zero()


def test_rank_killed_by_a_fatal_signal_reports_where_it_died() -> None:
    """faulthandler in the rank writes its Python stack on SIGSEGV; the launcher shows it."""
    with pytest.raises(guide.RankDied, match="rank 1 of 2 was killed by SIGSEGV") as info:
        guide.launch(_segfaults_in_a_named_function, 2, collective_timeout_s=10)
    assert "--- Python stack of rank 1 when it died ---" in info.value.details
    assert "Fatal Python error: Segmentation fault" in info.value.details
    assert "read_address_zero" in info.value.details
    assert "_segfaults_in_a_named_function" in info.value.details


def test_one_rank_job_that_kills_itself_is_named() -> None:
    """SIGKILL cannot be caught, so there is no stack of where it died (and no stale one shown)."""
    def worker(rank: guide.Rank) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(guide.RankDied, match="rank 0 of 1 was killed by SIGKILL") as info:
        guide.launch(worker, 1)
    assert "when it died" not in str(info.value)


def test_rank_that_exits_without_raising_is_named() -> None:
    def worker(rank: guide.Rank) -> None:
        if rank.rank == 1:
            os._exit(7)
        dist.barrier()

    with pytest.raises(guide.RankDied, match="rank 1 of 2 exited with code 7 without raising"):
        guide.launch(worker, 2)


def _hang_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        time.sleep(30)  # stuck in Python, outside any collective: far past rank 0's 5 s timeout
    dist.barrier()


@pytest.mark.usefixtures("warm_fork_server")  # the time budget is the launcher's
def test_hung_rank_is_named_with_its_stack() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankHung) as info:
        guide.launch(_hang_on_rank1, 2, collective_timeout_s=5)
    elapsed = time.monotonic() - start
    assert elapsed < 20, elapsed
    msg = str(info.value)
    assert info.value.rank == 1
    assert "rank 1 of 2 hung: rank 0 waited collective_timeout_s=5 s" in msg
    assert "Python stack of rank 1" in msg and "_hang_on_rank1" in msg


def _overruns(rank: guide.Rank) -> None:
    time.sleep(30)  # ten times the deadline below; the job must be stopped long before


@pytest.mark.usefixtures("warm_fork_server")  # the time budget is the launcher's
def test_job_past_its_deadline_is_killed() -> None:
    start = time.monotonic()
    with pytest.raises(guide.JobTimeout, match=r"deadline_s=3 s; ranks \[0, 1\]") as info:
        guide.launch(_overruns, 2, deadline_s=3)
    assert time.monotonic() - start < 10
    assert "Python stack of rank 0" in str(info.value) and "_overruns" in str(info.value)
    assert info.value.rank == 0
    assert str(info.value).startswith(
        "the job did not finish within deadline_s=3 s; ranks [0, 1] were still running and were "
        "killed. Raise deadline_s if the work is really this long.\n\n--- Python stack of rank 0 ---")


def test_over_budget_allocation_is_reported_as_out_of_memory() -> None:
    def worker(rank: guide.Rank) -> int:
        return int(torch.ones(2 * 2**30, dtype=torch.uint8).sum())  # 2 GiB

    with pytest.raises(guide.RankOutOfMemory) as info:
        guide.launch(worker, 2, memory_limit_mib=800)
    err = info.value
    assert err.requested_bytes == 2 * 2**30 and err.limit_mib == 800
    assert "ran out of memory: it tried to allocate 2048.0 MiB with a budget of 800 MiB" in str(err)


# --------------------------------------------------------------------------------------------------
# The choice of culprit, from exit records alone. Timestamps are seconds on one wall clock.

PEER_RESET = "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer"
PEER_CLOSED = ("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242. "
               "This is typically caused by a remote worker crashing")


def _error(when: float, message: str, exc_type: str = "RuntimeError") -> dict:
    return {"time": when, "type": exc_type, "message": message,
            "traceback": f"Traceback (most recent call last):\n{exc_type}: {message}\n"}


def test_silent_death_seen_late_is_blamed_not_the_peer_that_noticed_it() -> None:
    """Rank 1 is SIGKILLed at t=100; rank 0 notices at 100.01 and raises; the launcher's poll sees
    rank 1 gone only at 100.2. The earliest timestamp is rank 0's, the culprit is rank 1."""
    exits = [RankExit(0, 1, seen_at=100.3, error=_error(100.01, PEER_RESET)),
             RankExit(1, -signal.SIGKILL, seen_at=100.2)]
    assert root_cause(exits) == 1
    err = failure(exits, collective_timeout_s=30)
    assert type(err) is guide.RankDied and err.rank == 1
    assert str(err).startswith("rank 1 of 2 was killed by SIGKILL.")
    assert "rank 0: raised RuntimeError" in err.details


def test_raising_rank_is_blamed_over_an_earlier_peer_gone_error() -> None:
    exits = [RankExit(0, 1, 101.5, _error(100.0, PEER_CLOSED)),
             RankExit(1, 0, 101.0),
             RankExit(2, 1, 101.5, _error(100.5, "injected: rank 2 raises", "ValueError"))]
    assert root_cause(exits) == 2
    err = failure(exits, collective_timeout_s=30)
    assert type(err) is guide.RankRaised and (err.rank, err.exc_type) == (2, "ValueError")
    assert "rank 2 of 3 raised ValueError: injected: rank 2 raises" in str(err)


def test_a_raising_rank_is_dated_by_when_it_raised_not_when_it_was_seen() -> None:
    """Rank 0 raised at 100 but was seen gone at 103 (it took time to write its error); rank 1 died
    silently, seen at 101. Rank 0 failed first."""
    exits = [RankExit(0, 1, seen_at=103.0, error=_error(100.0, "boom", "KeyError")),
             RankExit(1, -signal.SIGTERM, seen_at=101.0)]
    assert root_cause(exits) == 0
    assert type(failure(exits, 30)) is guide.RankRaised


def test_when_every_error_blames_a_peer_the_earliest_failure_is_the_culprit() -> None:
    exits = [RankExit(0, 1, 100.5, _error(100.4, PEER_CLOSED)),
             RankExit(1, 1, 100.5, _error(100.1, PEER_RESET))]
    assert root_cause(exits) == 1


def test_a_gloo_timeout_next_to_a_running_rank_blames_the_running_rank() -> None:
    exits = [RankExit(0, 1, 105.2, _error(105.0, "[gloo] Timed out waiting 5000ms for recv")),
             RankExit(1, None)]
    err = failure(exits, collective_timeout_s=5, stacks="--- Python stack of rank 1 ---\nsleep")
    assert type(err) is guide.RankHung and err.rank == 1
    assert "rank 1 of 2 hung: rank 0 waited collective_timeout_s=5 s" in str(err)
    assert "rank 1: still running (killed by the launcher)" in err.details
    assert "Python stack of rank 1" in str(err)


def test_an_allocation_failure_is_out_of_memory_with_the_requested_bytes() -> None:
    message = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: " \
              "you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)"
    exits = [RankExit(0, 1, 10.0, _error(9.0, message)), RankExit(1, 1, 10.0, _error(9.5, PEER_RESET))]
    err = failure(exits, collective_timeout_s=30, memory_limit_mib=800)
    assert type(err) is guide.RankOutOfMemory
    assert (err.rank, err.requested_bytes, err.limit_mib) == (0, 2**31, 800)


def test_root_cause_needs_a_failure() -> None:
    with pytest.raises(ValueError, match="at least one failed rank"):
        root_cause([RankExit(0, 0, 1.0), RankExit(1, None)])


def test_unknown_signal_number_is_still_named() -> None:
    err = failure([RankExit(0, -200, 1.0)], collective_timeout_s=30)
    assert str(err).startswith("rank 0 of 1 was killed by signal 200.")


# --------------------------------------------------------------------------------------------------
# The last line of defence: a launcher whose deadline never fires must not hang the test session.

NEVER_FIRES = textwrap.dedent("""
    import time

    import guide
    from guide.launcher import supervise

    guide.launch(lambda rank: None, 2)  # start the fork server while collecting, outside the timeout


    def test_deadline_that_never_fires(monkeypatch):
        def overruns(rank):  # defined here: it travels by value, the ranks never import this file
            time.sleep(60)

        monkeypatch.setattr(supervise, "monotonic", lambda: 0.0)  # a frozen clock: no deadline
        guide.launch(overruns, 2, deadline_s=1)
""")


def test_session_has_a_per_test_timeout(pytestconfig: pytest.Config) -> None:
    """pytest-timeout is active and pyproject.toml gives every test a limit."""
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert float(pytestconfig.getini("timeout")) > 0, "no timeout in [tool.pytest.ini_options]"


@pytest.mark.timeout(150)  # a whole inner pytest session (39 s measured under load), bounded at 120 s
def test_a_launcher_whose_deadline_never_fires_is_failed_by_the_timeout(tmp_path: Path) -> None:
    """The deadline test with its guard broken: pytest-timeout fails it in the supervision loop after
    the timeout (5 s here, counted from the test's start: the fork server starts at collection),
    long before its worker would wake (60 s)."""
    (tmp_path / "test_never_fires.py").write_text(NEVER_FIRES)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=5",
         "--rootdir", str(tmp_path), str(tmp_path / "test_never_fires.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = proc.stdout + proc.stderr
    # Without the timeout the job would end after 60 s and the inner test would pass (exit code 0).
    assert proc.returncode == 1, out[-3000:]
    assert "Timeout (>5.0s) from pytest-timeout" in out and "1 failed" in out, out[-3000:]
    # pytest names the frame "supervise.py:N: in supervise", or "supervise.py:N: Failed" when the
    # timeout lands on a line of supervise itself (its last frame): in the supervision loop both
    assert re.search(r"supervise\.py:\d+: (in supervise|Failed)", out), (
        f"the timeout did not fire in the supervision loop:\n{out[-3000:]}")


def test_of_two_silent_deaths_the_first_seen_is_blamed() -> None:
    exits = [RankExit(0, -signal.SIGKILL, seen_at=100.4), RankExit(1, -signal.SIGTERM, seen_at=100.1)]
    assert root_cause(exits) == 1
    assert str(failure(exits, 30)).startswith("rank 1 of 2 was killed by SIGTERM.")


def test_a_failed_rank_without_a_time_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match=r"rank 0 failed without an error record or a time"):
        root_cause([RankExit(0, 1, seen_at=None), RankExit(1, 0, seen_at=100.0)])


def test_root_cause_needs_a_failed_rank() -> None:
    with pytest.raises(ValueError, match=r"^root_cause\(\) needs at least one failed rank; every "
                                         r"rank finished or runs\.$"):
        root_cause([RankExit(0, 0, 100.0), RankExit(1, None)])


def test_a_rank_that_does_not_answer_for_its_stack_is_said_so(tmp_path) -> None:
    """dump_stacks asks live ranks with SIGUSR1; one that ignores it gets a line saying so."""
    ignores = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                "signal.signal(signal.SIGUSR1, signal.SIG_IGN); print('ready', "
                                "flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert ignores.stdout.readline().strip() == "ready"
        alive = SimpleNamespace(pid=ignores.pid, exitcode=None)
        done = SimpleNamespace(pid=0, exitcode=0)
        (tmp_path / "rank2.stack").write_text("  File worker.py, line 3\n")
        alive2 = SimpleNamespace(pid=ignores.pid, exitcode=None)
        assert dump_stacks([alive, done, alive2], tmp_path) == (
            "--- Python stack of rank 0 ---\n(no stack: the rank did not answer SIGUSR1)\n"
            "--- Python stack of rank 2 ---\nFile worker.py, line 3")
    finally:
        ignores.kill()
        ignores.wait()


def test_a_rank_that_dies_before_it_is_asked_for_its_stack_is_said_so(tmp_path) -> None:
    """A rank that was alive at the last poll but is gone when SIGUSR1 is sent (a race the
    supervisor cannot prevent) costs a "no stack" line, not a ProcessLookupError that would hide
    the job's real error."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid names no process now
    stale = SimpleNamespace(pid=gone.pid, exitcode=None)
    assert dump_stacks([stale], tmp_path) == (
        "--- Python stack of rank 0 ---\n(no stack: the rank did not answer SIGUSR1)")


def _a_then_b(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 0:
        raise RuntimeError("A")
    time.sleep(0.3)
    raise ValueError("B")


@pytest.mark.usefixtures("warm_fork_server")
def test_every_ranks_message_is_shown_and_the_earliest_raiser_is_the_cause() -> None:
    """Rank 0 raises RuntimeError("A"), rank 1 ValueError("B") 0.3 s later: rank 0 is named, with
    its traceback; rank 1's type, message and exit code are in the report too."""
    with pytest.raises(guide.RankRaised) as info:
        guide.launch(_a_then_b, 2, deadline_s=30)
    err = info.value
    assert (err.rank, err.exc_type) == (0, "RuntimeError")
    assert str(err).startswith("rank 0 of 2 raised RuntimeError: A\n\nTraceback from rank 0:")
    assert 'raise RuntimeError("A")' in err.remote_traceback
    assert "rank 0: raised RuntimeError: A [exit code 1]" in err.details
    assert "rank 1: raised ValueError: B [exit code 1]" in err.details
