"""Every path of guide.checks that returns a :class:`Checked`: the value, its reference and every
field the ledger prints (issue 38: a relative gap divided by the measured value, a strict order
that accepted equal values, every rank given rank 0's reference and a derived reference nested in
a sequence all passed the tests before these)."""

from __future__ import annotations

import math

import pytest
import torch

from guide import checks
from guide.checked import Checked, Tautology, derived
from guide.checks import CheckFailed
from guide.layout import ParamLayout

NAN = float("nan")


def _fields(c: Checked) -> dict:
    return {k: getattr(c, k) for k in Checked.__slots__}


# -- expect_close ----------------------------------------------------------------------------------

def test_a_scalar_match_returns_the_value_matched_to_its_reference() -> None:
    c = checks.expect_close("peak", "FSDP2", 6.1, 6.16, 0.5, unit="MiB", against="the shapes")
    assert type(c) is Checked and float(c) == 6.1
    assert _fields(c) == dict(check="peak", run="FSDP2", unit="MiB", relation="≈", tol=0.5,
                              rel=False, reference=6.16, against="the shapes", value_name="",
                              reference_name="")
    assert type(c.reference) is float and type(float(c)) is float
    ints = checks.expect_close("n", "r", 3, 4, 1)
    assert type(ints.reference) is float and ints.reference == 4.0


def test_a_sequence_or_a_zero_reference_returns_the_worst_gap_bounded() -> None:
    seq = checks.expect_close("loss", "DDP", [1.0, 2.25], [1.0, 2.0], 0.5, unit="nats",
                              against="one process")
    assert float(seq) == 0.25 and _fields(seq) == dict(
        check="loss", run="DDP", unit="nats", relation="≤", tol=0.5, rel=False, reference=None,
        against="one process", value_name="", reference_name="")
    zero = checks.expect_close("drift", "r", -2e-6, 0.0, 1e-5, unit="B", against="nothing")
    assert float(zero) == 2e-6 and zero.relation == "≤" and zero.reference is None
    assert (zero.unit, zero.against, zero.tol, zero.check, zero.run) == (
        "B", "nothing", 1e-5, "drift", "r")
    rel = checks.expect_close("share", "r", [2.0, 3.0], [2.0, 2.0], 0.6, rel=True)
    assert float(rel) == 0.5 and rel.rel is True and rel.relation == "≤"


def test_a_relative_gap_is_divided_by_the_reference_not_the_measured_value() -> None:
    """|got - want| / |want|: 150 against 100 is 50 % off (divided by got it would be 33 %)."""
    with pytest.raises(CheckFailed, match=r"^\[m\] r: value differs by 50\.00% > 40%"):
        checks.expect_close("m", "r", 150.0, 100.0, 0.4, rel=True)
    c = checks.expect_close("m", "r", 60.0, 100.0, 0.4, rel=True)  # 40 % of 100 (of 60: 67 %)
    assert float(c) == 60.0 and c.reference == 100.0 and c.rel is True and c.tol == 0.4
    gap = checks.expect_close("m", "r", [60.0, 100.0], [100.0, 100.0], 0.45, rel=True)
    assert float(gap) == pytest.approx(0.4)  # 40/100, not 40/60
    neg = checks.expect_close("m", "r", [-60.0], [-100.0], 0.45, rel=True)
    assert float(neg) == pytest.approx(0.4)


def test_a_relative_check_against_zero_passes_zero_only() -> None:
    assert float(checks.expect_close("m", "r", [0.0, 1.0], [0.0, 1.0], 0.1, rel=True)) == 0.0
    with pytest.raises(CheckFailed, match=r"differs by inf%"):
        checks.expect_close("m", "r", [1e-30], [0.0], 1e9, rel=True)


def test_the_tolerance_is_inclusive_and_a_nan_gap_wins_over_finite_ones() -> None:
    assert float(checks.expect_close("m", "r", 1.5, 1.0, 0.5)) == 1.5
    with pytest.raises(CheckFailed, match=r"differs by 5\.00e-01 > tol 5e-01"):
        checks.expect_close("m", "r", 1.5, 1.0, 0.4999999)
    with pytest.raises(CheckFailed, match=r"differs by nan > tol"):
        checks.expect_close("m", "r", [5.0, NAN], [1.0, 1.0], 1e9)
    with pytest.raises(CheckFailed, match=r"differs by nan > tol"):
        checks.expect_close("m", "r", [NAN, 5.0], [1.0, 1.0], 1e9)
    with pytest.raises(CheckFailed, match=r"differs by 4\.00e\+00 > tol 1e\+00"):
        checks.expect_close("m", "r", [5.0, 1.5], [1.0, 1.0], 1.0)  # the worst, not the first


def test_a_relative_failure_says_the_gap_in_percent() -> None:
    with pytest.raises(CheckFailed) as err:
        checks.expect_close("peak", "FSDP2", [1.0, 1.2], [1.0, 1.0], 0.1, rel=True, what="byte")
    assert str(err.value) == ("[peak] FSDP2: byte differs by 20.00% > 10% (got [1.0, 1.2], "
                              "expected [1.0, 1.0]).")


@pytest.mark.parametrize("want", [derived(5.0), [1.0, derived(5.0)], (derived(1.0), 5.0),
                                  [derived(1.0), derived(5.0)]])
def test_a_derived_reference_is_refused_alone_or_inside_a_sequence(want) -> None:
    got = 5.0 if not isinstance(want, (list, tuple)) else [1.0, 5.0]
    with pytest.raises(Tautology, match=r"^\[share\] DDP: the reference is the checked value"):
        checks.expect_close("share", "DDP", got, want, 0.01)


def test_a_sequence_compared_with_itself_is_refused_and_an_equal_copy_is_not() -> None:
    xs = [1.0, 2.0]
    with pytest.raises(Tautology):
        checks.expect_close("c", "r", xs, xs, 0.0)
    assert float(checks.expect_close("c", "r", xs, list(xs), 0.0)) == 0.0
    assert float(checks.expect_close("c", "r", 3, 3, 0)) == 3.0  # small ints are shared objects


def test_a_failing_check_fails_before_it_looks_for_a_tautology() -> None:
    with pytest.raises(CheckFailed):
        checks.expect_close("c", "r", 9.0, derived(1.0), 0.5)


# -- expect_order ----------------------------------------------------------------------------------

def test_a_strict_order_refuses_equal_values() -> None:
    with pytest.raises(CheckFailed) as err:
        checks.expect_order("save", "r", 1.0, float("1"), low_name="async", high_name="blocking")
    assert str(err.value) == "[save] r: expected async < blocking, got 1 vs 1."
    with pytest.raises(CheckFailed, match=r"expected async < blocking, got 2 vs 1\.$"):
        checks.expect_order("save", "r", 2.0, 1.0, low_name="async", high_name="blocking")


def test_a_non_strict_order_accepts_equal_values_and_refuses_a_reversed_pair() -> None:
    c = checks.expect_order("save", "r", 1.0, float("1"), low_name="a", high_name="b", strict=False)
    assert float(c) == 1.0 and c.relation == "<="
    with pytest.raises(CheckFailed) as err:
        checks.expect_order("save", "r", 1.5, 1.25, low_name="a", high_name="b", strict=False)
    assert str(err.value) == "[save] r: expected a <= b, got 1.5 vs 1.25."


def test_nan_is_never_ordered() -> None:
    for low, high in ((NAN, 1.0), (1.0, NAN)):
        for strict in (True, False):
            with pytest.raises(CheckFailed):
                checks.expect_order("o", "r", low, high, low_name="a", high_name="b",
                                    strict=strict)


def test_an_order_returns_the_low_value_with_every_field() -> None:
    c = checks.expect_order("save", "r", 0.2, 1.5, low_name="async", high_name="blocking",
                            unit="s")
    assert type(c) is Checked and float(c) == 0.2 and type(c.reference) is float
    assert _fields(c) == dict(check="save", run="r", unit="s", relation="<", tol=None, rel=False,
                              reference=1.5, against="", value_name="async",
                              reference_name="blocking")
    low = checks.expect_order("save", "r", 1, 2, low_name="a", high_name="b", keep="low",
                              strict=False)
    assert (float(low), low.relation, low.reference) == (1.0, "<=", 2.0)


def test_an_order_kept_high_returns_the_high_value_with_every_field() -> None:
    c = checks.expect_order("oom", "r", 10.0, 14.0, low_name="headroom", high_name="peak",
                            unit="GiB", keep="high")
    assert float(c) == 14.0 and type(c.reference) is float
    assert _fields(c) == dict(check="oom", run="r", unit="GiB", relation=">", tol=None, rel=False,
                              reference=10.0, against="", value_name="peak",
                              reference_name="headroom")
    ge = checks.expect_order("oom", "r", 3.0, float("3"), low_name="a", high_name="b", keep="high",
                             strict=False)
    assert (float(ge), ge.relation, ge.value_name, ge.reference_name) == (3.0, ">=", "b", "a")


def test_an_order_refuses_a_bad_keep_and_a_derived_bound() -> None:
    with pytest.raises(ValueError, match=r"^expect_order: keep='mid' is 'low' or 'high'\.$"):
        checks.expect_order("o", "r", 1.0, 2.0, low_name="a", high_name="b", keep="mid")
    with pytest.raises(Tautology, match=r"^\[o\] r: "):
        checks.expect_order("o", "r", 1.0, derived(2.0), low_name="a", high_name="b")


# -- assert_learns, assert_losses_match, assert_params_match -----------------------------------

def test_the_learning_check_returns_the_drop_bounded_below() -> None:
    c = checks.assert_learns("ref", [3.0, 2.5, 2.75], min_drop=0.1)
    assert float(c) == 0.5 and _fields(c) == dict(
        check="training happens", run="ref", unit="nats", relation="≥", tol=0.1, rel=False,
        reference=None, against="the loss of the same batch at step 0", value_name="",
        reference_name="")
    assert float(checks.assert_learns("ref", [3.0, 2.9])) == pytest.approx(0.1)
    with pytest.raises(CheckFailed, match=r"fell by 0\.00e\+00 from step 0's 3\.000000 \(needs >= "
                                          r"1e-01\)"):
        checks.assert_learns("ref", [3.0, 3.0], min_drop=0.1)


def test_the_loss_check_returns_the_worst_gap_bounded() -> None:
    c = checks.assert_losses_match("DDP", [3.0, 2.5], [3.0, 2.5 + 2e-6], 1e-5, against="one")
    assert float(c) == pytest.approx(2e-6) and _fields(c) == dict(
        check="loss equivalence", run="DDP", unit="nats", relation="≤", tol=1e-5, rel=False,
        reference=None, against="one", value_name="", reference_name="")
    assert float(checks.assert_losses_match("r", [], [], against="x")) == 0.0


def test_the_parameter_check_returns_the_worst_gap_bounded() -> None:
    ref = {"a": torch.zeros(3), "b": torch.zeros(2)}
    got = {"a": torch.tensor([0.0, 2e-7, 0.0]), "b": torch.tensor([-5e-7, 0.0])}
    c = checks.assert_params_match("FSDP2", ref, got, 1e-6, against="one process")
    assert float(c) == pytest.approx(5e-7, rel=1e-6) and _fields(c) == dict(
        check="parameter equivalence", run="FSDP2", unit="absolute", relation="≤", tol=1e-6,
        rel=False, reference=None, against="one process", value_name="", reference_name="")
    named = checks.assert_params_match("r", ref, {k: v.clone() for k, v in ref.items()}, 0.0,
                                       check="initial weights", against="x")
    assert named.check == "initial weights" and float(named) == 0.0
    with pytest.raises(CheckFailed, match=r"^\[p\] r: b differs from x by 5\.00e-07 > tol 1e-07\. "
                                          r"fix it$"):
        checks.assert_params_match("r", ref, got, 1e-7, check="p", hint="fix it", against="x")
    with pytest.raises(CheckFailed, match=r"by 5\.00e-07 > tol 1e-07\.$"):
        checks.assert_params_match("r", ref, got, 1e-7, against="x")


# -- assert_sharded ---------------------------------------------------------------------------------

def _layouts(shapes: dict[str, tuple[int, ...]], world: int) -> list[ParamLayout]:
    out = []
    for name, shape in shapes.items():
        for r in range(world):
            rows = len(torch.arange(shape[0]).chunk(world)[r]) \
                if r < len(torch.arange(shape[0]).chunk(world)) else 0
            out.append(ParamLayout(name, r, True, "(Shard(dim=0),)", shape, (rows, *shape[1:])))
    return out


def test_each_rank_is_checked_against_its_own_chunk_count() -> None:
    """127 rows over 2 ranks: rank 0 holds 64 x 4 + 3 elements, rank 1 63 x 4 + 2; each rank's
    reference is its own count (rank 0's count for every rank was the audit's bug)."""
    held = checks.assert_sharded("FSDP2", _layouts({"w": (127, 4), "b": (5,)}, 2), 2)
    assert sorted(held) == [0, 1]
    assert [float(held[r]) for r in (0, 1)] == [259.0, 254.0]
    assert [held[r].reference for r in (0, 1)] == [259, 254]
    for r in (0, 1):
        assert float(held[r]) == held[r].reference
        assert _fields(held[r]) == dict(
            check="sharding", run="FSDP2", unit="elements", relation="≈", tol=0.0, rel=False,
            reference=held[r].reference, against="torch.chunk rows of each parameter",
            value_name="", reference_name="")
        assert held[r].guard().startswith("asserted: sharding (")


def test_a_rank_that_holds_nothing_is_checked_against_zero() -> None:
    held = checks.assert_sharded("r", _layouts({"w": (2, 3)}, 3), 3)
    assert [float(held[r]) for r in range(3)] == [3.0, 3.0, 0.0]
    assert [held[r].reference for r in range(3)] == [3, 3, 0]


def test_the_sharding_counts_sum_every_parameter_of_the_rank() -> None:
    held = checks.assert_sharded("r", _layouts({"a": (4, 2), "b": (6,), "c": (2, 2, 2)}, 2), 2)
    assert [float(held[r]) for r in (0, 1)] == [4 + 3 + 4, 4 + 3 + 4]
    assert math.fsum(float(v) for v in held.values()) == 8 + 6 + 8


def test_a_reference_of_one_is_a_match_not_a_bound() -> None:
    c = checks.expect_close("m", "r", 1.05, 1.0, 0.1)
    assert (c.relation, c.reference, c.kind) == ("≈", 1.0, "asserted")
    neg = checks.expect_close("m", "r", -1.0, float("-1"), 0.1)
    assert (neg.relation, neg.reference) == ("≈", -1.0)


def test_the_defaults_add_no_unit_no_reference_name_and_keep_the_low_value() -> None:
    o = checks.expect_order("o", "r", 1.0, 2.0, low_name="a", high_name="b")
    assert (float(o), o.relation, o.unit, o.against, o.tol) == (1.0, "<", "", "", None)
    c = checks.expect_close("c", "r", 1.0, 1.5, 1.0)
    assert (c.unit, c.against, c.rel) == ("", "", False)
    s = checks.expect_close("c", "r", [1.0], [1.5], 1.0)
    assert (s.unit, s.against, s.rel) == ("", "", False)
    with pytest.raises(CheckFailed, match=r"^\[c\] r: value differs"):
        checks.expect_close("c", "r", 1.0, 9.0, 1.0)
    with pytest.raises(CheckFailed, match=r"^\[c\] r: 1 values, expected 2\.$"):
        checks.expect_close("c", "r", [1.0], [1.0, 2.0], 1.0)


def test_a_self_comparison_is_refused_naming_the_check() -> None:
    losses = [3.0, 2.0]
    with pytest.raises(Tautology, match=r"^\[loss equivalence\] DDP: compared with itself"):
        checks.assert_losses_match("DDP", losses, losses, against="one process")
    with pytest.raises(ValueError, match=r"^\[loss equivalence\] DDP: name the reference"):
        checks.assert_losses_match("DDP", losses, list(losses), against="")
    params = {"w": torch.ones(1)}
    with pytest.raises(Tautology, match=r"^\[initial weights\] FSDP2: compared with itself"):
        checks.assert_params_match("FSDP2", params, params, 0.0, check="initial weights",
                                   against="x")
    with pytest.raises(Tautology, match=r"^\[parameter equivalence\] FSDP2: compared with itself"):
        checks.assert_params_match("FSDP2", params, params, 0.0, against="x")
