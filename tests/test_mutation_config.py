"""benchmarks/mutation.py stays runnable: a hand-written mutant whose line moved, or a module in its
scope that mutmut does not mutate, would stop `nox -s mutation` after an hour of mutmut (it did:
three checks' tolerances moved to guide.comm.checks and the run exited on "occurs 0 times")."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


mutation = benchmark_script.load("mutation")


@pytest.mark.parametrize("m", mutation.HAND_MUTANTS, ids=lambda m: f"{m.path}:{m.new[:40]}")
def test_every_hand_mutant_names_a_line_that_occurs_once(m):
    assert (ROOT / m.path).read_text().count(m.old) == 1, (
        f"{m.old!r} is not in {m.path} exactly once: update HAND_MUTANTS")
    for test in m.tests:
        if not test.startswith("-"):
            assert (ROOT / test).exists(), f"{test}: no such test path"


def test_every_module_in_scope_is_mutated_and_its_file_exists():
    mutation.check_config()  # exits naming the module otherwise
    for module, (path, _) in mutation.SCOPE.items():
        assert (ROOT / path).is_file(), f"{module}: {path} does not exist"


def test_a_stale_hand_mutant_is_caught(monkeypatch):
    stale = mutation.HandMutant("src/guide/comm/checks.py", "TOL_THAT_MOVED = 1", "x", ())
    assert (ROOT / stale.path).read_text().count(stale.old) == 0
    with pytest.raises(SystemExit, match="occurs 0 times"):
        mutation.run_hand_mutant(stale)
