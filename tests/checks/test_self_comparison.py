"""A run compared with itself is refused before anything is recorded as asserted or bounded, and
a bound is recorded as bounded, never as asserted."""

from __future__ import annotations

import pytest
import torch

from guide import checks, claims
from guide.checked import Tautology, derived

LOSSES = [3.0, 2.5, 2.0]


def test_the_same_losses_object_is_refused() -> None:
    with pytest.raises(Tautology, match="compared with itself \\(the same object\\)"):
        checks.assert_losses_match("FSDP2 x2, True", LOSSES, LOSSES, against="the True run")


def test_the_same_parameters_are_refused_as_one_mapping_or_the_same_tensors() -> None:
    params = {"w": torch.ones(2)}
    with pytest.raises(Tautology, match="the same object"):
        checks.assert_params_match("FSDP1", params, params, 1e-6, against="FSDP1")
    with pytest.raises(Tautology, match="the same object"):  # a new dict of the same tensors
        checks.assert_params_match("FSDP1", params, dict(params), 1e-6, against="the reference")


def test_a_reference_named_as_the_run_is_refused() -> None:
    with pytest.raises(Tautology, match="the reference is named as the run"):
        checks.assert_losses_match("FSDP2 x2", LOSSES, list(LOSSES), against=" fsdp2  X2")


def test_an_unnamed_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="name the reference in against"):
        checks.assert_losses_match("r", LOSSES, list(LOSSES), against=" ")
    with pytest.raises(TypeError):  # against is required: no default names a reference
        checks.assert_losses_match("r", LOSSES, list(LOSSES))


def test_an_independent_equal_run_passes_and_its_guard_names_its_reference() -> None:
    gap = checks.assert_losses_match("resume", LOSSES, list(LOSSES),
                                     against="the uninterrupted run")
    assert gap == 0 and gap.against == "the uninterrupted run"
    assert "vs the uninterrupted run" in gap.guard()
    params = {"w": torch.ones(2)}
    pgap = checks.assert_params_match("resume", params, {"w": torch.ones(2)}, 0.0,
                                      against="the saved state")
    assert "vs the saved state" in pgap.guard() and "single-process" not in pgap.guard()


def test_a_failure_names_the_reference_it_used() -> None:
    with pytest.raises(checks.CheckFailed, match="differs from the uninterrupted run"):
        checks.assert_losses_match("resume", LOSSES, [3.0, 2.6, 2.0],
                                   against="the uninterrupted run")
    with pytest.raises(checks.CheckFailed, match="w differs from the saved state"):
        checks.assert_params_match("resume", {"w": torch.ones(2)}, {"w": torch.zeros(2)}, 0.0,
                                   against="the saved state")


def test_a_ratio_of_a_quantity_by_itself_is_refused() -> None:
    with pytest.raises(Tautology):
        checks.expect_close("share", "DDP", 5.0, derived(5.0), 0.01)
    # The memory page's DDP rows: DDP's bytes over DDP's bytes, by name or by object, with no
    # flag from the page.
    with pytest.raises(Tautology, match="ratio of a quantity by itself"):
        checks.ratio("held ratio", 1000, 1000, of="DDP at N=4", over=" ddp  at N=4")
    held = 1234.5
    with pytest.raises(Tautology):
        checks.ratio("held ratio", held, held, of="FSDP2 at N=4", over="DDP at N=4")


def test_a_ratio_of_two_runs_is_their_quotient_and_names_both() -> None:
    assert checks.ratio("held ratio", 250, 1000, of="FSDP2 at N=4", over="DDP at N=4") == 0.25
    # Two equal values of two runs are a ratio of 1, not a tautology (small ints are one object).
    assert checks.ratio("held ratio", 7, 7, of="FSDP2 at N=1", over="DDP at N=1") == 1.0
    with pytest.raises(checks.CheckFailed, match="FSDP2 at N=4 over DDP at N=4: the denominator"):
        checks.ratio("held ratio", 1.0, 0, of="FSDP2 at N=4", over="DDP at N=4")
    with pytest.raises(ValueError, match="name both runs"):
        checks.ratio("held ratio", 1.0, 2.0, of="FSDP2", over=" ")


def test_a_loop_compared_with_the_function_it_loops_over_is_refused() -> None:
    """The "smallest N" shape: a search and a recount by the same function are one computation;
    the recount is flagged derived, and the check refuses it."""
    def held(n: int) -> float:
        return 100 / n

    def smallest(cap: float) -> int:
        return next(n for n in (1, 2, 4, 8) if held(n) <= cap)

    recount = derived(next(n for n in (1, 2, 4, 8) if held(n) <= 30))
    with pytest.raises(Tautology):
        checks.expect_close("smallest N", "loop", smallest(30), recount, 0)


def test_a_bound_is_recorded_as_bounded_and_a_match_as_asserted() -> None:
    ledger = claims.Ledger("plot_x")
    bound = checks.assert_losses_match("DDP", LOSSES, [3.0, 2.5, 2.0 + 1e-7],
                                       against=checks.SINGLE_PROCESS)
    ledger.record("x.gap", bound)
    match = checks.expect_close("bytes", "r", 100.0, 100.5, 1.0, against="the shapes")
    ledger.record("x.bytes", match)
    drop = checks.assert_learns("reference", [3.0, 2.0])
    ledger.record("x.drop", drop)
    kinds = {r.name: r.kind for r in ledger.records}
    assert kinds == {"x.gap": "bounded", "x.bytes": "asserted", "x.drop": "bounded"}
    assert ledger.records[0].guard.startswith("bounded: loss equivalence (|Δ| 1e-07 ≤ 1e-05")
    with pytest.raises(ValueError, match="is typed"):
        ledger.claim("x.typed", 1.0, "", guard="bounded: by hand")
