"""benchmarks/ci_time.py: the per-session times of a CI log, overlaps and failures included."""

from __future__ import annotations

import pytest

import benchmark_script

ci_time = benchmark_script.load("ci_time")

LOG = """\
+ timeout 1800 pipx run --spec nox==2026.10.20 nox --add-timestamp -s tests
nox > [2026-12-02 10:00:00,000] Running session tests
nox > [2026-12-02 10:00:30,500] Running session compat(torch='2.9.0')
nox > [2026-12-02 10:06:00,000] Session tests was successful in 6 minutes.
============================= slowest 3 durations ==============================
22.10s call     tests/test_faults.py::test_two_builds
3.50s setup    tests/test_launcher.py::test_x
0.01s teardown tests/test_a.py::test_b
nox > [2026-12-02 10:06:01,000] Running session docs
nox > [2026-12-02 10:10:01,000] Session docs failed.
nox > [2026-12-02 10:20:30,500] Session compat(torch='2.9.0') was successful in 20 minutes.
nox > [2026-12-02 10:21:00,000] Running session browser
"""


def test_each_session_gets_its_start_its_seconds_and_its_outcome() -> None:
    found = ci_time.sessions(LOG.splitlines())
    assert [(s.name, s.seconds, s.outcome) for s in found] == [
        ("tests", 360.0, "passed"), ("compat(torch='2.9.0')", 1200.0, "passed"),
        ("docs", 240.0, "failed"), ("browser", None, "unfinished")]


def test_the_report_shows_offsets_the_span_and_the_slowest_tests_longest_first() -> None:
    text = ci_time.report(LOG.splitlines())
    assert "compat(torch='2.9.0')" in text and "  0.5 min  20.0 min  passed" in text
    assert "docs" in text and "  6.0 min   4.0 min  failed" in text
    assert "span: 20.5 min" in text  # the compat lane's end, not the last line's session
    slow = text.split("slowest tests:")[1].splitlines()[1:]
    assert [line.split()[0] for line in slow] == ["22.10", "3.50", "0.01"]
    assert "tests/test_faults.py::test_two_builds" in slow[0]


def test_a_rerun_session_counts_twice_and_pairs_in_order() -> None:
    log = ["nox > [2026-12-02 10:00:00,000] Running session docs",
           "nox > [2026-12-02 10:01:00,000] Session docs failed.",
           "nox > [2026-12-02 10:02:00,000] Running session docs",
           "nox > [2026-12-02 10:05:00,000] Session docs was successful in 3 minutes."]
    assert [(s.seconds, s.outcome) for s in ci_time.sessions(log)] == [(60.0, "failed"),
                                                                        (180.0, "passed")]


def test_an_end_without_a_start_and_a_log_without_stamps_are_errors(capsys, tmp_path) -> None:
    with pytest.raises(ValueError, match="ends without having started"):
        ci_time.sessions(["nox > [2026-12-02 10:01:00,000] Session docs failed."])
    log = tmp_path / "ci.log"
    log.write_text("nox > Running session tests\nnox > Session tests was successful.\n")
    assert ci_time.main([str(log)]) == 2
    assert "--add-timestamp" in capsys.readouterr().err


def test_ci_runs_nox_with_timestamps_and_prints_the_slowest_tests() -> None:
    """The script reads what .ci/run writes: nox's timestamps and pytest's durations."""
    run = (benchmark_script.BENCHMARKS.parent / ".ci" / "run").read_text()
    assert "--add-timestamp" in run and "--durations=20" in run
