"""The equivalence checks of guide.checks (losses, parameters, replicas, initial weights, learning)
and the one-line assertion helpers they are built from.

Each guard gets the ways it can be fooled: a gap just above its *default* tolerance must raise and a
gap just below must pass (a loosened or tightened default fails here), NaN and inf must raise, and
every message names the check. The tolerances' values are typed here on purpose: they come from
measurement (the pages print each measured gap next to its tolerance), and changing one must change
a test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from guide import checks
from guide.checks import CheckFailed

NAN, INF = math.nan, math.inf


# -- expect / expect_close / max_abs_diff ------------------------------------------------------------

def test_expect_raises_with_check_run_and_detail_and_passes_true() -> None:
    assert checks.expect("c", "r", True, "d") is None
    with pytest.raises(CheckFailed, match=r"^\[comm calls\] FSDP2 x2: 3 all_gather per step$"):
        checks.expect("comm calls", "FSDP2 x2", False, "3 all_gather per step")


@pytest.mark.parametrize("truthy", [1, np.bool_(True), torch.tensor(True), "yes", [1]])
def test_expect_refuses_what_is_not_a_bool(truthy: object) -> None:
    """A tensor or NumPy bool would let ``tensor(nan) <= tol``-style mistakes through silently."""
    with pytest.raises(TypeError, match=rf"expect\(\) takes a bool, got {type(truthy).__name__}: "
                                        "compare explicitly"):
        checks.expect("c", "r", truthy, "d")  # type: ignore[arg-type]


def test_max_abs_diff_is_the_largest_absolute_gap() -> None:
    assert checks.max_abs_diff([1.0, 2.0, 3.0], [1.0, 2.5, 1.0]) == 2.0
    assert checks.max_abs_diff([1.0, 2.0], [3.5, 2.0]) == 2.5  # a negative difference counts
    assert checks.max_abs_diff([], []) == 0.0
    with pytest.raises(CheckFailed, match=r"^length mismatch: 2 vs 3 steps\.$"):
        checks.max_abs_diff([1.0, 2.0], [1.0, 2.0, 3.0])


def test_expect_close_passes_up_to_tol_and_returns_what_it_checked() -> None:
    one = checks.expect_close("c", "r", 1.5, 1.0, tol=0.5)  # equal to tol: passes
    assert (one, one.reference, one.tol, one.relation, one.kind) == (1.5, 1.0, 0.5, "≈", "asserted")
    assert checks.expect_close("c", "r", -2e-6, 0.0, tol=1e-5) == 2e-6  # against 0: a bound
    assert checks.expect_close("c", "r", [1.0, 2.25, 3.0], [1.0, 2.0, 3.125], tol=1.0) == 0.25
    assert checks.expect_close("c", "r", [], [], tol=0.0) == 0.0


def test_expect_close_raises_above_tol_naming_check_run_and_what() -> None:
    with pytest.raises(CheckFailed, match=r"^\[peak\] FSDP2: bytes differs by 6\.00e-01 > tol 5e-01 "
                                          r"\(got \[1\.6\], expected \[1\.0\]\)\.$"):
        checks.expect_close("peak", "FSDP2", 1.6, 1.0, tol=0.5, what="bytes")
    with pytest.raises(CheckFailed, match=r"^\[c\] r: value differs by 1\.00e\+00"):  # the worst gap
        checks.expect_close("c", "r", [1.0, 3.0, 2.75], [1.0, 2.0, 3.0], tol=0.5)


def test_expect_close_shows_four_values_then_an_ellipsis() -> None:
    with pytest.raises(CheckFailed, match=r"got \[9\.0, 0, 0, 0\]\.\.\., expected "
                                          r"\[0\.0, 0, 0, 0\]\.\.\.\)"):
        checks.expect_close("c", "r", [9.0, 0, 0, 0, 0], [0.0, 0, 0, 0, 0], tol=1.0)
    with pytest.raises(CheckFailed, match=r"got \[9\.0, 0, 0, 0\], expected \[0\.0, 0, 0, 0\]\)"):
        checks.expect_close("c", "r", [9.0, 0, 0, 0], [0.0, 0, 0, 0], tol=1.0)


def test_expect_close_refuses_a_length_mismatch() -> None:
    with pytest.raises(CheckFailed, match=r"^\[c\] r: 2 steps, expected 3\.$"):
        checks.expect_close("c", "r", [1.0, 2.0], [1.0, 2.0, 3.0], tol=1.0, what="step")


@pytest.mark.parametrize("got, want", [(NAN, 1.0), (1.0, NAN), ([1.0, NAN], [1.0, 1.0]),
                                       ([NAN, 1.0], [1.0, 1.0]), (INF, 1.0), (INF, INF),
                                       ([1.0, -INF], [1.0, 1.0])])
def test_expect_close_refuses_nan_and_inf(got: object, want: object) -> None:
    with pytest.raises(CheckFailed, match=r"differs by (nan|inf) > tol"):
        checks.expect_close("c", "r", got, want, tol=1e9)  # type: ignore[arg-type]


# -- assert_learns -----------------------------------------------------------------------------------

def test_learning_check_default_needs_a_drop_of_one_millinat() -> None:
    """LEARN_MIN_DROP = 1e-3: a drop of 1.1e-3 passes, 0.9e-3 fails (a 10x looser default would pass
    a run that does not learn)."""
    assert checks.assert_learns("r", [3.0, 3.0 - 1.1e-3]) == pytest.approx(1.1e-3)
    with pytest.raises(CheckFailed, match=r"^\[training happens\] r: the loss fell by 9\.00e-04 "
                                          r"from step 0's 3\.000000 \(needs >= 1e-03\): the optimizer "
                                          r"step does not apply the gradient \(zero_grad after "
                                          r"backward\? a step that is skipped\?\)\.$"):
        checks.assert_learns("r", [3.0, 3.0 - 0.9e-3])


def test_learning_check_compares_the_best_later_step_with_step_0() -> None:
    assert checks.assert_learns("r", [3.0, 2.0, 2.9]) == 1.0   # the minimum, not the last step
    assert checks.assert_learns("r", [3.0, 3.5, 2.5]) == 0.5   # nor the second
    assert checks.assert_learns("r", [3.0, 2.999, 2.5], min_drop=0.4) == 0.5  # min_drop is used
    assert checks.assert_learns("r", [3.0, 2.5], min_drop=0.5) == 0.5  # exactly min_drop passes
    with pytest.raises(CheckFailed, match=r"fell by 0\.00e\+00"):
        checks.assert_learns("r", [3.0, 3.0, 3.0])
    with pytest.raises(CheckFailed, match=r"fell by -1\.00e\+00"):  # step 0 is not its own minimum
        checks.assert_learns("r", [2.0, 3.0, 3.0])


def test_learning_check_needs_two_steps() -> None:
    with pytest.raises(CheckFailed, match=r"^\[training happens\] r: 1 step\(s\); at least 2 are "
                                          r"needed to see the loss fall\.$"):
        checks.assert_learns("r", [3.0])


@pytest.mark.parametrize("losses", [[NAN, 2.0], [3.0, NAN], [3.0, NAN, 2.0], [3.0, 2.0, NAN],
                                    [INF, 2.0], [3.0, -INF], [3.0, 2.0, INF]])
def test_learning_check_refuses_nan_and_inf(losses: list[float]) -> None:
    """A loss that starts at inf 'falls' by inf, and min() skips a NaN that is not first: both
    would pass a drop test alone."""
    with pytest.raises(CheckFailed, match=r"\[training happens\] r: .*not finite"):
        checks.assert_learns("r", losses)


# -- assert_losses_match -----------------------------------------------------------------------------

REF = [3.0, 2.5, 2.0]


def test_loss_check_default_tolerance_is_1e_5() -> None:
    """LOSS_TOL = 1e-5: 1.2e-5 fails, 0.8e-5 passes."""
    assert checks.assert_losses_match("r", REF, [3.0, 2.5 + 0.8e-5, 2.0], against=checks.SINGLE_PROCESS) == pytest.approx(0.8e-5)
    with pytest.raises(CheckFailed, match=r"gap 1\.20e-05 > tol 1e-05"):
        checks.assert_losses_match("r", REF, [3.0, 2.5 + 1.2e-5, 2.0], against=checks.SINGLE_PROCESS)


def test_loss_check_names_the_first_divergent_step_and_its_cause() -> None:
    with pytest.raises(CheckFailed, match=r"^\[loss equivalence\] run: from step 1 on, the loss "
                                          r"differs .*\(step 1: 2\.40000000 vs 2\.50000000, gap "
                                          r"1\.00e-01 > tol 1e-05; worst gap 1\.00e\+00\); step 0 "
                                          r"matched.*averaged \(not summed\)"):
        checks.assert_losses_match("run", REF, [3.0, 2.4, 1.0], against=checks.SINGLE_PROCESS)
    with pytest.raises(CheckFailed, match=r"from step 0 on.*\); the forward pass already differs: "
                                          r"different weights or data on the ranks$"):
        checks.assert_losses_match("run", REF, [3.1, 2.5, 2.0], against=checks.SINGLE_PROCESS)
    with pytest.raises(CheckFailed, match=r"\); step 0 matched, so the update differs: are gradients "
                                          r"averaged \(not summed\) across ranks, and is every "
                                          r"rank's slice of the batch used\?$"):
        checks.assert_losses_match("run", REF, [3.0, 2.4, 2.0], against=checks.SINGLE_PROCESS)
    with pytest.raises(CheckFailed, match=r"from step 1 on"):
        checks.assert_losses_match("run", REF, [3.0, 2.4, 2.0], tol=0.05, against=checks.SINGLE_PROCESS)  # tol is used


def test_loss_check_returns_the_worst_gap() -> None:
    got = [3.0 + 1e-6, 2.5 + 3e-6, 2.0 - 2e-6]
    assert checks.assert_losses_match("r", REF, got, against=checks.SINGLE_PROCESS) == pytest.approx(3e-6)
    assert checks.assert_losses_match("r", [1.0], [1.5], tol=0.5, against=checks.SINGLE_PROCESS) == 0.5  # exactly tol passes


def test_loss_check_refuses_a_different_number_of_steps() -> None:
    with pytest.raises(CheckFailed, match=r"^\[loss equivalence\] r: 2 steps, reference has 3\.$"):
        checks.assert_losses_match("r", REF, REF[:2], against=checks.SINGLE_PROCESS)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("side", ["run", "reference"])
def test_loss_check_refuses_nan_and_inf(bad: float, side: str) -> None:
    poisoned = [3.0, bad, 2.0]
    run, ref = (poisoned, REF) if side == "run" else (REF, poisoned)
    with pytest.raises(CheckFailed, match="from step 1 on"):
        checks.assert_losses_match("r", ref, run, against=checks.SINGLE_PROCESS)


# -- assert_params_match / assert_same_init ----------------------------------------------------------

def _params(**gaps: float) -> dict[str, torch.Tensor]:
    """Float64 parameters: ``w`` (2x3) and ``b`` (3,), the named one off by ``gap`` in one place."""
    out = {"w": torch.ones(2, 3, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.float64)}
    for name, gap in gaps.items():
        out[name].view(-1)[1] += gap
    return out


@pytest.mark.parametrize("opt, tol", [("sgd", 1e-6), ("adamw", 1e-3)])
def test_param_check_default_tolerances(opt: str, tol: float) -> None:
    """PARAM_TOL: sgd 1e-6, adamw 1e-3; 1.2x fails, 0.8x passes."""
    assert checks.assert_params_match("r", _params(), _params(b=0.8 * tol),
                                      checks.PARAM_TOL[opt], against=checks.SINGLE_PROCESS) == pytest.approx(0.8 * tol)
    with pytest.raises(CheckFailed, match=rf"b differs .* by 1\.20e-0\d > tol {tol:.0e}"):
        checks.assert_params_match("r", _params(), _params(b=1.2 * tol), checks.PARAM_TOL[opt], against=checks.SINGLE_PROCESS)


def test_param_check_names_the_worst_parameter_and_returns_its_gap() -> None:
    got = _params(w=1e-7, b=5e-3)
    with pytest.raises(CheckFailed, match=r"^\[parameter equivalence\] run: b differs from the "
                                          r"single-process reference by 5\.00e-03 > tol 1e-06\.$"):
        checks.assert_params_match("run", _params(), got, 1e-6, against=checks.SINGLE_PROCESS)
    assert checks.assert_params_match("run", _params(), got, 1.0, against=checks.SINGLE_PROCESS) == pytest.approx(5e-3)
    assert checks.assert_params_match("run", _params(), _params(w=-2e-3, b=1e-3), 1.0, against=checks.SINGLE_PROCESS) == \
        pytest.approx(2e-3)  # |negative| counts; the worst over all parameters
    with pytest.raises(CheckFailed, match=r"run: w differs"):  # a tie names the first (model order)
        checks.assert_params_match("run", _params(), _params(w=1.0, b=1.0), 0.5, against=checks.SINGLE_PROCESS)


def test_param_check_uses_its_check_name_and_hint() -> None:
    with pytest.raises(CheckFailed, match=r"^\[after reload\] r: w differs .* tol 0e\+00\. "
                                          r"Was the optimizer state saved\?$"):
        checks.assert_params_match("r", _params(), _params(w=1.0), 0.0, check="after reload",
                                   hint="Was the optimizer state saved?", against=checks.SINGLE_PROCESS)


def test_param_check_refuses_missing_and_unexpected_names() -> None:
    got = {"w": _params()["w"], "extra": torch.zeros(1)}
    with pytest.raises(CheckFailed, match=r"parameter names differ; missing \['b'\], unexpected "
                                          r"\['extra'\]\.$"):
        checks.assert_params_match("r", _params(), got, 1.0, against=checks.SINGLE_PROCESS)


def test_param_check_refuses_a_different_shape() -> None:
    got = {**_params(), "w": torch.ones(3, 2, dtype=torch.float64)}
    with pytest.raises(CheckFailed, match=r"w has shape \(3, 2\), reference \(2, 3\)\."):
        checks.assert_params_match("r", _params(), got, 1.0, against=checks.SINGLE_PROCESS)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("name", ["w", "b"])  # w comes first: a later, finite gap must not hide it
@pytest.mark.parametrize("side", ["run", "reference"])
def test_param_check_refuses_nan_and_inf(bad: float, name: str, side: str) -> None:
    poisoned = _params(**{name: bad})
    ref, got = (_params(), poisoned) if side == "run" else (poisoned, _params())
    with pytest.raises(CheckFailed, match=rf"{name} differs .* by (nan|inf)"):
        checks.assert_params_match("r", ref, got, 1e9, against=checks.SINGLE_PROCESS)


def test_same_init_is_bit_for_bit_and_says_why() -> None:
    checks.assert_same_init("r", _params(), _params())
    one_ulp = _params()
    one_ulp["w"][0, 0] = torch.nextafter(one_ulp["w"][0, 0], torch.tensor(2.0, dtype=torch.float64))
    with pytest.raises(CheckFailed, match=r"^\[initial weights\] r: w differs .*tol 0e\+00\. "
                                          r"The ranks built different initial weights: fully_shard "
                                          r"does not broadcast, so every rank must build the model "
                                          r"with the same seed\.$"):
        checks.assert_same_init("r", _params(), one_ulp)
    with pytest.raises(CheckFailed, match=r"\[initial weights\] r: b differs .* by nan"):
        checks.assert_same_init("r", _params(), _params(b=NAN))


def test_same_init_names_its_reference_in_the_failure() -> None:
    with pytest.raises(CheckFailed) as err:
        checks.assert_same_init("FSDP2 x2", _params(), _params(b=0.5))
    assert str(err.value) == (
        "[initial weights] FSDP2 x2: b differs from the reference's initial weights by 5.00e-01 > "
        "tol 0e+00. The ranks built different initial weights: fully_shard does not broadcast, so "
        "every rank must build the model with the same seed.")


# -- assert_ranks_agree ------------------------------------------------------------------------------

def test_ranks_that_agree_pass() -> None:
    checks.assert_ranks_agree("r", [_params(), _params(), _params()])
    checks.assert_ranks_agree("r", [_params()])


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("name", ["w", "b"])
def test_a_replica_one_ulp_apart_is_named(rank: int, name: str) -> None:
    per_rank = [_params(), _params(), _params()]
    t = per_rank[rank][name].view(-1)
    t[1] = torch.nextafter(t[1], torch.tensor(9.0, dtype=torch.float64))
    with pytest.raises(CheckFailed, match=rf"^\[replica consistency\] r: after training, rank {rank}'s "
                                          rf"{name} differs from rank 0's by .*not synchronised"):
        checks.assert_ranks_agree("r", per_rank)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_replicas_that_all_hold_nan_or_inf_do_not_agree(bad: float) -> None:
    with pytest.raises(CheckFailed, match=r"rank 1's b differs from rank 0's by nan"):
        checks.assert_ranks_agree("r", [_params(b=bad), _params(b=bad)])


def test_replicas_with_different_parameter_names_do_not_agree() -> None:
    extra = {**_params(), "lost": torch.zeros(1)}
    with pytest.raises(CheckFailed, match=r"\[replica consistency\] r: rank 1 has parameters "
                                          r"\['b', 'lost', 'w'\], rank 0 \['b', 'w'\]"):
        checks.assert_ranks_agree("r", [_params(), extra])
    with pytest.raises(CheckFailed, match=r"rank 1 has parameters \['w'\], rank 0 \['b', 'w'\]"):
        checks.assert_ranks_agree("r", [_params(), {"w": _params()["w"]}])
