"""The pitfalls page (``examples/plot_pitfalls.py``) and :mod:`guide.pitfalls`: every check that
decides "the wrong way still goes wrong" or "the right way is right" bites.

The page runs once, in this process (as sphinx-gallery runs it), and its own results (its one
``RESULT`` object, through ``conftest.page``) are then fed crosswise to its checks: each wrong-way
check must reject the fixed run's data, and each right-way check the wrong run's. Edge cases (NaN, a gap exactly at the tolerance, a message torch stopped
printing) go to the page's check functions directly.
"""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
from conftest import EXAMPLES
from torch.distributed.fsdp._fully_shard import _fsdp_state

from guide import checks, pitfalls
from guide.checks import CheckFailed

PAGE = EXAMPLES / "plot_pitfalls.py"
REPRODUCES = r"\[pitfall reproduces\]"

#: FSDP2's own checks and warnings (``_fsdp_state.py``): newer than the 2.9 floor, so the page
#: requires them only where this torch has them, and shows what an older one does instead.
_FSDP_STATE = inspect.getsource(_fsdp_state)
_TIES_CHECKED = "already managed by another FSDP group" in _FSDP_STATE
_VIEWS_WARNED = "returned a view tensor" in _FSDP_STATE

#: What this torch prints (torch 2.13's words), as the page must show it, so a search for the
#: error lands there.
SYMPTOMS = [
    ("ValueError: Parameter 'tok_emb.weight' is shared with a parameter already managed by "
     "another FSDP group. For shared/tied parameters, use fully_shard([module_a, module_b]) to "
     "place them in the same FSDP group." if _TIES_CHECKED else
     f"torch {torch.__version__} says nothing; head.weight is no longer tok_emb.weight"),
    *(["UserWarning: FSDP2-wrapped module (FSDPViewOut) returned a view tensor. An in-place op "
       "on this view (e.g., `x += y`) will silently drop the pre-backward hook and skip the "
       "all-gather"] if _VIEWS_WARNED else []),
    "RuntimeError: setStorage: sizes [8, 8], strides [8, 1], storage offset 0, and itemsize 4 "
    "requiring a storage size of 256 are out of bounds for storage of size 0",
    "AttributeError: 'FSDPTinyLM' object has no attribute 'no_sync'",
    ("RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor, need to convert "
     "all torch.Tensor to DTensor before calling distributed operators!"
     if torch.__version__ >= "2.13" else "got mixed torch.Tensor and DTensor"),
]


def _per_rank(page: dict, key: str) -> list:
    return [res[key] for res in page["RESULT"]["results"]]


# -- the page as a reader sees it -----------------------------------------------------------------

@pytest.mark.parametrize("symptom", SYMPTOMS, ids=lambda s: s.split(":")[0])
def test_page_prints_each_symptom_verbatim(page: dict, symptom: str) -> None:
    assert symptom in page["OUTPUT"]


def test_symptom_table_comes_first_and_links_every_section(page: dict) -> None:
    """The symptom -> fix table is printed before any run, one row per pitfall, and each row's
    link names a label the page defines (a section heading)."""
    source = PAGE.read_text()
    assert len(page["RESULT"]["SYMPTOMS"]) == 10
    for label, *_ in page["RESULT"]["SYMPTOMS"]:
        assert f"# .. _pitfalls-{label}:" in source, label
    assert page["OUTPUT"].index("symptom") < page["OUTPUT"].index("torch ")
    assert "register_fsdp_forward_method(model, name)" in page["OUTPUT"]


def test_symptom_links_render_as_anchors_and_text() -> None:
    """A :class:`guide.report.Link` cell is an anchor in HTML and its plain text elsewhere."""
    from guide import report

    t = report.table([[report.Link("no root fully_shard", "#pitfalls-no-root"), "drift"]],
                     ["pitfall", "symptom"])
    assert '<a class="reference internal" href="#pitfalls-no-root">no root fully_shard</a>' \
        in t._repr_html_()
    assert "no root fully_shard" in t and "drift" in t and "href" not in t


# -- wrong-way checks reject the fixed runs -------------------------------------------------------

def test_frozen_check_rejects_a_run_that_trained(page: dict) -> None:
    right = page["RESULT"]["R"]["1 right"]
    with pytest.raises(CheckFailed, match=REPRODUCES + r" 1\.: .*parameters moved by"):
        pitfalls.assert_frozen("1.", right["before"], right["after"], right["losses"],
                              right["messages"])


def test_reproduces_check_rejects_runs_without_the_error(page: dict) -> None:
    out_of_place = page["RESULT"]["R"]["3"]["out of place"]["messages"]
    # warned (where this torch warns), but did not fail
    assert any("returned a view tensor" in m for m in out_of_place) == _VIEWS_WARNED
    with pytest.raises(CheckFailed, match=REPRODUCES + r" 3\.: .*no longer says 'RuntimeError'"):
        pitfalls.assert_reproduces("3.", out_of_place, "RuntimeError")
    with pytest.raises(CheckFailed, match=REPRODUCES):
        pitfalls.assert_reproduces("10.", page["RESULT"]["R"]["10 right"]["messages"],
                                   "got mixed")


def test_differs_check_rejects_fixed_runs(page: dict) -> None:
    initial = page["RESULT"]["initial"]
    with pytest.raises(CheckFailed, match=REPRODUCES + r" 6\.: .*now matches the right one"):
        pitfalls.assert_differs("6.", initial, page["RESULT"]["R"]["6 right"], 0.0)
    rank0, rank1 = (r["params"] for r in _per_rank(page, "7 right")[:2])
    with pytest.raises(CheckFailed, match=REPRODUCES + r" 7\.:"):
        pitfalls.assert_differs("7.", rank0, rank1, 0.0)


def test_partial_norm_check_rejects_full_norms(page: dict) -> None:
    full = page["RESULT"]["R"]["4"]["full"]["head.weight"]
    with pytest.raises(CheckFailed, match=REPRODUCES + r" 4\.: .*every rank's local norm"):
        pitfalls.assert_partial("4.", [r["full"]["head.weight"] for r in _per_rank(page, "4")],
                               full, checks.LOSS_TOL)


# -- right-way checks reject the wrong runs -------------------------------------------------------

def test_training_checks_reject_the_optimizer_built_first(page: dict) -> None:
    frozen = page["RESULT"]["curves"]["optimizer first"]
    with pytest.raises(CheckFailed, match=r"\[training happens\]"):
        checks.assert_learns("1.", frozen)
    with pytest.raises(CheckFailed, match=r"\[loss equivalence\] 1\.: from step 1 on"):
        checks.assert_losses_match("1.", page["RESULT"]["curves"]["1 process"], frozen,
                                   against=checks.SINGLE_PROCESS)


def test_tied_reference_check_rejects_an_untied_model(page: dict) -> None:
    """A tie broken by sharding or ``to_empty`` shows up as a separate ``head.weight``."""
    with pytest.raises(CheckFailed, match=r"parameter names differ.*unexpected \['head.weight'\]"):
        checks.assert_params_match("2.", page["RESULT"]["TIED_REFERENCE"][1],
                                   page["RESULT"]["REFERENCE"][1], 1e-6,
                                   against=checks.SINGLE_PROCESS)


def test_init_check_rejects_the_patchwork_of_seeds(page: dict) -> None:
    initial = page["RESULT"]["initial"]
    with pytest.raises(CheckFailed, match=r"\[initial weights\] 6\..*same seed"):
        checks.assert_same_init("6.", initial, page["RESULT"]["R"]["6 wrong"])


def test_root_checks_reject_the_model_without_its_root_call(page: dict) -> None:
    wrong = _per_rank(page, "7 wrong")
    with pytest.raises(CheckFailed, match=r"\[replica consistency\] 7\."):
        checks.assert_ranks_agree("7.", [r["params"] for r in wrong])
    with pytest.raises(CheckFailed, match=r"\[sharding\] 7\.: \S+ on rank 0 is a plain tensor"):
        checks.assert_sharded("7.", [lay for r in wrong for lay in r["layouts"]],
                              page["RESULT"]["WORLD_SIZE"])
    with pytest.raises(CheckFailed, match=r"\[parameter equivalence\] 7\."):
        checks.assert_params_match("7.", page["RESULT"]["REFERENCE"][1], wrong[0]["params"],
                                   checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)


def test_norm_check_rejects_the_local_reading(page: dict) -> None:
    local = [r["local"]["head.weight"] for r in _per_rank(page, "4")]
    with pytest.raises(CheckFailed, match=r"\[gradient norm\]"):
        checks.expect_close("gradient norm", "4.", local,
                            [page["RESULT"]["NORM_REFERENCE"]["head.weight"]] * len(local),
                            checks.LOSS_TOL)


def test_counts_tell_the_ways_apart(page: dict) -> None:
    """The inline count checks compare numbers that differ between the wrong and the right way."""
    r = page["RESULT"]["R"]
    assert r["5 wrong"]["reduce_scatters"] == page["RESULT"]["K"] * r["5 right"]["reduce_scatters"]
    assert r["9"][True]["all_gathers"] == r["9"][None]["all_gathers"] + 1
    assert r["7 wrong"]["all_gathers"] != r["7 right"]["all_gathers"]


# -- guide.pitfalls, edge cases (no page needed) -------------------------------------------------------

def test_reproduces_needs_the_exact_words() -> None:
    check = pitfalls.assert_reproduces
    assert check("p", ["UserWarning: x", "ValueError: it is shared"], "is shared") == \
        "ValueError: it is shared"
    for messages in ([], ["ValueError: it is Shared"], ["something else"]):
        with pytest.raises(CheckFailed, match=REPRODUCES + " p: .*update this section"):
            check("p", messages, "is shared")


def test_differs_needs_a_gap_above_the_tolerance() -> None:
    check = pitfalls.assert_differs
    ref = {"w": torch.zeros(3), "b": torch.ones(2)}
    for gap in (0.0, 1e-6):  # equal, and exactly at the tolerance (float64: exact): not "different"
        with pytest.raises(CheckFailed, match=REPRODUCES):
            check("p", ref, {"w": torch.full((3,), gap, dtype=torch.float64), "b": torch.ones(2)},
                  1e-6)
    assert check("p", ref, {"w": torch.tensor([0.0, 3e-6, 0.0]), "b": torch.ones(2)}, 1e-6) == \
        pytest.approx(3e-6)
    assert math.isnan(check("p", ref, {"w": torch.tensor([0.0, math.nan, 0.0]),
                                       "b": torch.ones(2)}, 1e-6))


def test_frozen_needs_bitwise_rest_and_silence() -> None:
    check = pitfalls.assert_frozen
    before = {"w": torch.ones(4)}
    check("p", before, {"w": torch.ones(4)}, [5.0, 5.0, 5.0], [])
    cases = [({"w": torch.ones(4) + 1e-7}, [5.0, 5.0], []),  # moved a little
             ({"w": torch.full((4,), math.nan)}, [5.0, 5.0], []),  # NaN
             ({"w": torch.ones(4)}, [5.0, 4.9], []),  # the loss moved
             ({"w": torch.ones(4)}, None, ["RuntimeError: boom"]),  # it raised
             ({"w": torch.ones(4)}, [5.0, 5.0], ["UserWarning: optimizer holds no DTensor"])]
    for after, losses, messages in cases:
        with pytest.raises(CheckFailed, match=REPRODUCES):
            check("p", before, after, losses, messages)


def test_partial_needs_rank_dependent_parts_of_the_norm() -> None:
    check = pitfalls.assert_partial
    check("p", [0.6, 0.8], 1.0, 1e-5)
    check("p", [1.0, 0.0], 1.0, 1e-5)  # one rank holds all of it (pos_emb rows no token reaches)
    with pytest.raises(CheckFailed, match=REPRODUCES):
        check("p", [1.0, 1.0 + 1e-6], 1.0, 1e-5)  # every rank reads the norm
    for local in ([0.5, 0.5], [0.6, 0.8 + 1e-4], [math.nan, 0.8]):
        with pytest.raises(CheckFailed, match=r"\[partial norm\]"):
            check("p", local, 1.0, 1e-5)


def test_caught_keeps_errors_and_warnings_as_text() -> None:
    caught = pitfalls.caught

    def noisy(x: int) -> int:
        warnings.warn("careful", UserWarning)
        return x + 1

    def failing() -> None:
        raise ValueError("boom")

    assert caught(noisy, 1) == (2, ["UserWarning: careful"])
    assert caught(failing) == (None, ["ValueError: boom"])
