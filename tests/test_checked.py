"""Checked values: a recorded number carries the check that ran; "asserted" cannot be typed."""

from __future__ import annotations

import pickle

import pytest

from guide import checks, claims, report
from guide.checked import Checked, Tautology, derived


def test_typing_an_asserted_guard_by_hand_fails_naming_the_fix() -> None:
    ledger = claims.Ledger("plot_a")
    for guard in ("asserted: loss equivalence", "ordered: a < b"):
        with pytest.raises(ValueError, match=r"is typed.*ledger\.record\(name, checks\."):
            ledger.claim("x", 1.0, "GiB", guard=guard)
    assert ledger.records == []


def test_a_recorded_check_takes_its_guard_from_the_check_that_ran() -> None:
    ledger = claims.Ledger("plot_a", model="tiny", world_size=2)
    gap = checks.assert_losses_match("DDP x2", [3.0, 2.0], [3.0, 2.0 + 2.1e-7], against=checks.SINGLE_PROCESS)
    assert ledger.record("gap", gap, fmt=".1e") == 2.1e-7
    (r,) = ledger.records
    assert r.guard == ("bounded: loss equivalence (|Δ| 2.1e-07 ≤ 1e-05 vs the single-process "
                       "reference)")
    assert (r.kind, r.check, r.text, r.unit) == ("bounded", "loss equivalence", "2.1e-07", "nats")
    assert r.assumptions == (("model", "tiny"), ("world_size", "2"))


def test_a_plain_number_cannot_be_recorded_as_checked() -> None:
    with pytest.raises(TypeError, match="not the value a guide.checks check returned"):
        claims.Ledger("plot_a").record("x", 1.0)  # type: ignore[arg-type]


def test_an_allowance_containing_zero_cannot_be_recorded_as_asserted() -> None:
    ledger = claims.Ledger("plot_a")
    kept = checks.expect_close("kept after forward", "r", 0.28, 0.31, 0.31, unit="MiB")
    with pytest.raises(ValueError, match=r"0\.28 ± 0\.31 .*allows 0 or the opposite sign.*"
                                         r"tighten the allowance, or record the number .*computed"):
        ledger.record("kept", kept)
    rel = checks.expect_close("c", "r", 0.5, 1.0, 1.0, rel=True)  # ±100 %: reaches 0
    with pytest.raises(ValueError, match="allows 0"):
        ledger.record("rel", rel)
    tight = checks.expect_close("kept after forward", "r", 6.1, 6.16, 0.5, unit="MiB")
    assert ledger.record("kept", tight) == 6.1
    assert ledger.records[0].guard == "asserted: kept after forward (6.1 ≈ 6.16 ± 0.5)"


def test_a_tautological_check_is_refused() -> None:
    x = 12_345.0
    with pytest.raises(Tautology, match="the reference is the checked value itself"):
        checks.expect_close("activations", "r", x, x, 1e-9)  # the same object
    with pytest.raises(Tautology, match="record the number as computed"):
        checks.expect_close("activations", "r", 34.0 * 8, derived(34.0 * 8), 1e-9)
    with pytest.raises(Tautology):
        checks.expect_order("o", "r", x, x, low_name="a", high_name="b", strict=False)


def test_an_ordering_is_recorded_as_ordered_never_asserted() -> None:
    ledger = claims.Ledger("plot_a")
    o = checks.expect_order("save time", "r", 0.2, 1.5, low_name="async save",
                            high_name="blocking save", unit="s")
    ledger.record("async_save_s", o)
    (r,) = ledger.records
    assert r.kind == "ordered" and r.guard.startswith("ordered: async save < blocking save")
    high = checks.expect_order("oom", "r", 10.0, 14.0, low_name="headroom", high_name="peak",
                               keep="high")
    assert high == 14.0 and high.kind == "ordered"
    assert high.guard().startswith("ordered: peak > headroom (14 > 10)")
    with pytest.raises(checks.CheckFailed, match=r"\[save time\] r: expected b < a"):
        checks.expect_order("save time", "r", 2.0, 1.0, low_name="b", high_name="a")


def test_assumptions_come_from_the_page_and_the_scope() -> None:
    ledger = claims.Ledger("plot_a", model="tiny")
    with ledger.scope(steps=20, world_size=2):
        ledger.claim("a", 1, "x", world_size=4)  # the call's own keyword wins
    ledger.claim("b", 1, "x")
    a, b = ledger.records
    assert a.assumptions == (("model", "tiny"), ("steps", "20"), ("world_size", "4"))
    assert b.assumptions == (("model", "tiny"),)


def test_the_shown_text_is_what_is_recorded() -> None:
    ledger = claims.Ledger("plot_a")
    assert ledger.claim("m", 7559.63, "GiB", fmt=",.1f") == 7559.6
    assert ledger.claim("s", 0.24694, "fraction", fmt=".1%") == 0.247
    assert [r.text for r in ledger.records] == ["7,559.6", "24.7%"]


def test_checked_is_a_float_that_survives_pickling_and_scaling() -> None:
    c = checks.expect_close("bytes", "r", 2.0 * 2**20, 2.1 * 2**20, 0.2 * 2**20, unit="B")
    mib = c.scaled(1 / 2**20, "MiB")
    assert (mib, mib.reference, mib.tol, mib.unit) == (2.0, 2.1, pytest.approx(0.2), "MiB")
    back = pickle.loads(pickle.dumps(c))
    assert isinstance(back, Checked) and back.guard() == c.guard() and c + 1 == 2.0 * 2**20 + 1
    with pytest.raises(AttributeError, match="immutable"):
        c.tol = 1.0


def test_table_cells_are_recorded_as_shown() -> None:
    ledger = claims.Ledger("plot_a")
    gap = checks.assert_losses_match("r", [1.0], [1.0 + 3e-7], against=checks.SINGLE_PROCESS)
    t = report.table([["DDP x2", gap, 217_728], ["FSDP2 x2", 0.25, 3]], ["run", "gap", "params"],
                     formats={"gap": ".1e"}, record=ledger, name="main.gaps")
    got = {r.name: (r.text, r.kind) for r in ledger.records}
    assert got == {"main.gaps.ddp_x2.gap": ("3.0e-07", "bounded"),
                   "main.gaps.ddp_x2.params": ("217,728", "computed"),
                   "main.gaps.fsdp2_x2.gap": ("2.5e-01", "computed"),
                   "main.gaps.fsdp2_x2.params": ("3", "computed")}
    assert "<td style=\"text-align:right\">217,728</td>" in t._repr_html_()
    assert str(t).splitlines()[2].split() == ["DDP", "x2", "3.0e-07", "217,728"]
    with pytest.raises(ValueError, match="share a key; give keys"):
        report.table([["a", 1], ["a", 2]], ["k", "v"], record=ledger, name="dup")


def test_a_conclusion_wraps(capsys) -> None:
    report.conclusion("word " * 100)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= report.WIDTH and len(lines) > 3


# -- Checked itself: the allowance, the zero test, the guard's words, scaling (mutation survivors) --


def _match(value: float, reference: float | None, tol: float, rel: bool = False) -> Checked:
    return Checked(value, check="c", relation="≈", tol=tol, rel=rel, reference=reference)


def test_the_allowance_is_absolute_or_relative_to_the_reference_and_only_for_a_match() -> None:
    assert _match(49.0, 50.0, 0.1, rel=True).allowance() == pytest.approx(5.0)  # 10 % of 50
    assert _match(49.0, 50.0, 0.5).allowance() == 0.5
    assert _match(1.0, None, 0.5).allowance() is None  # no reference: nothing to be near
    bound = Checked(1e-7, check="c", relation="≤", tol=1e-5, reference=3.0)
    assert bound.allowance() is None  # a bound has no allowance, even beside a reference


def test_an_allowance_that_just_reaches_zero_is_refused() -> None:
    assert _match(0.5, 0.3, 0.3).reaches_zero()  # 0.3 - 0.3 = 0: the check would pass a zero
    assert _match(0.3, 0.5, 0.3).reaches_zero()  # around the value, too
    assert not _match(0.5, 0.31, 0.3).reaches_zero()


def test_the_guard_names_each_relation_and_formats_the_allowance() -> None:
    order = Checked(1.0, check="c", relation="<", reference=2.0)
    assert order.guard() == "ordered: value < reference (1 < 2)"  # names default
    floor = Checked(5.0, check="floor", relation="≥", tol=1.0, against="a formula")
    assert floor.guard() == "bounded: floor (5 ≥ 1 vs a formula)"
    assert _match(2.0, 2.123456, 0.5).guard() == "asserted: c (2 ≈ 2.123 ± 0.5)"
    assert _match(2.0, 2.1, 0.05, rel=True).guard() == "asserted: c (2 ≈ 2.1 ± 5%)"
    assert _match(2.0, 2.1, 0.01, rel=True).guard() == "asserted: c (2 ≈ 2.1 ± 1%)"
    assert _match(2.0, 2.1, 0.001, rel=True).guard() == "asserted: c (2 ≈ 2.1 ± 0.001 relative)"
    assert repr(_match(2.0, 2.1, 0.5)) == "Checked(2.0, 'asserted: c (2 ≈ 2.1 ± 0.5)')"


def test_scaling_scales_absolute_allowances_only_and_refuses_a_bad_factor() -> None:
    rel = _match(2.0, 2.1, 0.1, rel=True).scaled(1000.0, "m")
    assert (rel, rel.reference, rel.tol) == (2000.0, 2100.0, 0.1)  # 10 % stays 10 %
    for relation in ("≤", "≥"):
        bound = Checked(2.0, check="c", relation=relation, tol=4.0).scaled(0.5, "half")
        assert (bound, bound.tol, bound.unit) == (1.0, 2.0, "half")
    for factor in (-1.0, 0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=f"factor {factor} must be positive and finite"):
            _match(2.0, 2.1, 0.5).scaled(factor, "x")


def test_a_derived_reference_is_refused_in_words_that_name_the_fix() -> None:
    from guide.checked import refuse_derived

    for want in (derived(2.0), [1.0, derived(2.0)]):
        with pytest.raises(Tautology) as err:
            refuse_derived("activations", "r", 2.0, want)
        assert str(err.value) == (
            "[activations] r: the reference is the checked value itself (the same object, or "
            "flagged guide.checked.derived): such a check proves nothing. Compare with an "
            "independent value (a formula from other inputs, torch's own instrument, a reference "
            "run), or record the number as computed.")


@pytest.mark.parametrize("against, same_object, how", [
    ("the reference", True, "the same object"),
    (" FSDP2  x2 ", False, "the reference is named as the run"),
])
def test_a_self_comparison_is_refused_in_words_that_say_how_and_the_fix(
        against: str, same_object: bool, how: str) -> None:
    from guide.checked import refuse_self_comparison

    with pytest.raises(Tautology) as err:
        refuse_self_comparison("loss equivalence", "FSDP2 x2", against, same_object)
    assert str(err.value) == (
        f"[loss equivalence] FSDP2 x2: compared with itself ({how}): such a check proves "
        "nothing. Compare with an independent run (e.g. one process on the full batch), or show "
        "the value without a check.")


def test_a_ratio_of_a_run_by_itself_is_refused_in_words_that_name_the_fix() -> None:
    from guide.checked import ratio

    held = 1000.5
    for of, over, num, den in (("DDP at N=4", " ddp  at N=4", 1.0, 2.0),
                               ("FSDP2 at N=4", "DDP at N=4", held, held)):
        with pytest.raises(Tautology) as err:
            ratio("held ratio", num, den, of=of, over=over)
        assert str(err.value) == (
            f"[held ratio] {of} over {over}: a ratio of a quantity by itself is 1 by "
            "construction; show that row as the reference, not as a checked ratio.")
