"""guide.claims field by field, in-process (issue 38: ``Claim.from_json`` dropping ``shown`` passed
every test; so would a record that lost its text, guard kind or an assumption on the way to disk).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guide import checks, claims
from guide.claims import Claim, ShownTable


def _claim(value=1.0, shown="", guard="computed", page="plot_a", name="m.x", unit="GiB",
           **assumptions) -> Claim:
    return Claim(name, value, unit, page, tuple(sorted((k, str(v)) for k, v in
                                                      assumptions.items())), guard, shown)


# -- a record on disk -------------------------------------------------------------------------------

@pytest.mark.parametrize("record", [
    _claim(7559.6, "7,560", "cited: a sheet", world_size=8, model="TinyLM"),
    _claim(0.247, "24.7%"), _claim("bf16"), _claim(217_728),
    _claim(2.0, "2.0", "asserted: peak (2 ≈ 2.1 ± 5%)"),
])
def test_a_record_survives_json_whole_its_shown_text_included(record: Claim) -> None:
    back = Claim.from_json(record.to_json())
    assert back == record and back.shown == record.shown and back.text == record.text
    assert type(back.value) is type(record.value)


def test_a_record_written_before_shown_existed_reads_as_shown_empty() -> None:
    d = json.loads(_claim(1.5, "1.50").to_json())
    assert d == {"name": "m.x", "value": 1.5, "unit": "GiB", "page": "plot_a", "assumptions": {},
                 "guard": "computed", "shown": "1.50"}
    del d["shown"]
    old = Claim.from_json(json.dumps(d))
    assert old.shown == "" and old.text == "1.5"


def test_assumptions_are_read_back_sorted() -> None:
    line = json.dumps({"name": "a", "value": 1, "unit": "", "page": "p", "guard": "computed",
                       "assumptions": {"z": "1", "a": "2"}})
    assert Claim.from_json(line).assumptions == (("a", "2"), ("z", "1"))


def test_a_ledger_directory_loads_every_page_and_skips_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_text(_claim(2.0, "2.00", page="b").to_json() + "\n\n  \n")
    (tmp_path / "a.jsonl").write_text(_claim(1.0, page="a").to_json() + "\n")
    (tmp_path / "a.tables.ndjson").write_text("")
    (tmp_path / "notes.txt").write_text("not a ledger")
    assert claims.load(tmp_path) == [_claim(1.0, page="a"), _claim(2.0, "2.00", page="b")]
    assert claims.load(tmp_path / "nothing") == []


def test_recorded_tables_load_in_file_order_and_skip_blank_lines(tmp_path: Path) -> None:
    row = {"page": "plot_b", "name": "t", "columns": ["a", "b"], "cells": [["1", "2"], ["3", "4"]]}
    (tmp_path / f"plot_b{claims.TABLES_SUFFIX}").write_text(json.dumps(row) + "\n\n")
    (tmp_path / f"plot_a{claims.TABLES_SUFFIX}").write_text(
        json.dumps({**row, "page": "plot_a", "cells": []}) + "\n")
    (tmp_path / "plot_a.jsonl").write_text("")
    assert claims.load_tables(tmp_path) == [
        ShownTable("plot_a", "t", ("a", "b"), ()),
        ShownTable("plot_b", "t", ("a", "b"), (("1", "2"), ("3", "4")))]


def test_a_page_writes_its_claims_and_tables_and_a_rerun_replaces_both(tmp_path: Path,
                                                                       monkeypatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "deep" / "ledger"))
    ledger = claims.Ledger("pages/x", world_size=2)
    assert ledger.path == tmp_path / "deep" / "ledger" / "pages__x.jsonl"
    assert ledger.tables_path == tmp_path / "deep" / "ledger" / f"pages__x{claims.TABLES_SUFFIX}"
    ledger.claim("m.a", 1.25, "GiB", fmt=".1f")
    ledger.claim("m.a", 1.25, "GiB", fmt=".1f")  # the same claim again: written once
    ledger.add_table("m.t", ["n", 2], [[1, "x"]])
    ledger.add_table("m.u", ["n"], [])
    assert claims.load(ledger.path.parent) == [
        Claim("m.a", 1.2, "GiB", "pages/x", (("world_size", "2"),), "computed", "1.2")]
    assert claims.load_tables(ledger.path.parent) == [
        ShownTable("pages/x", "m.t", ("n", "2"), (("1", "x"),)), ShownTable("pages/x", "m.u", ("n",), ())]
    again = claims.Ledger("pages/x")
    assert claims.load(again.path.parent) == [] and not again.tables_path.exists()
    assert again.records == [] and again.tables == []


def test_outside_the_build_nothing_is_written(monkeypatch) -> None:
    monkeypatch.delenv(claims.LEDGER_ENV, raising=False)
    ledger = claims.Ledger("plot_a")
    assert ledger.path is None and ledger.tables_path is None
    ledger.claim("m.a", 1, "GiB")
    ledger.add_table("m.t", ["a"], [["1"]])
    assert len(ledger.records) == 1 and ledger.tables == [ShownTable("plot_a", "m.t", ("a",),
                                                                     (("1",),))]


# -- fields derived from a record ---------------------------------------------------------------

@pytest.mark.parametrize("guard, kind, check", [
    ("asserted: peak memory (6.1 ≈ 6.16 ± 0.5)", "asserted", "peak memory"),
    ("bounded: loss equivalence (|Δ| 2e-07 ≤ 1e-05 vs x)", "bounded", "loss equivalence"),
    ("ordered: a < b (1 < 2)", "ordered", "a < b"),
    ("computed", "computed", ""),
    ("cited: NVIDIA H100 datasheet (2023): 80 GB", "cited", "NVIDIA H100 datasheet (2023): 80 GB"),
])
def test_kind_and_check_come_from_the_guard(guard: str, kind: str, check: str) -> None:
    assert (_claim(guard=guard).kind, _claim(guard=guard).check) == (kind, check)


@pytest.mark.parametrize("value, fmt, text", [
    (1314.2, None, "1,314.2"), (217_728, None, "217,728"), ("bf16", None, "bf16"),
    ("bf16", ".1f", "bf16"), (0.24694, ".1%", "24.7%"), (7559.63, ",.1f", "7,559.6"),
])
def test_shown_text(value, fmt, text: str) -> None:
    assert claims.shown_text(value, fmt) == text


def test_the_text_is_the_shown_text_or_the_value_as_recorded() -> None:
    assert _claim(1314.2).text == "1,314.2"
    assert _claim(1314.2, "1,314").text == "1,314"


@pytest.mark.parametrize("shown, value, want, kind", [
    ("24.7%", 0.24694, 0.247, float), ("1,314.2", 1314.23, 1314.2, float), ("8", 8.2, 8, int),
    ("−3", -3.2, -3, int), ("-0.5", -0.49, -0.5, float), (" 12 ", 12.4, 12, int),
    ("n/a", 1.5, 1.5, float), ("1e-05", 1.04e-5, 1e-5, float),
])
def test_a_value_is_recorded_as_the_number_it_shows(shown, value, want, kind) -> None:
    got = claims.Ledger("plot_a").claim("m.x", value, "x", shown=shown)
    assert got == want and type(got) is kind


def test_shown_wins_over_fmt_and_a_text_value_keeps_no_shown() -> None:
    ledger = claims.Ledger("plot_a")
    assert ledger.claim("m.a", 1.2345, "x", fmt=".3f", shown="1.2") == 1.2
    assert ledger.claim("m.b", "2 x 4", "", fmt=".1f") == "2 x 4"
    assert [r.shown for r in ledger.records] == ["1.2", ""]
    assert ledger.claim("m.c", 3.25, "x") == 3.25 and ledger.records[-1].shown == ""


def test_a_checked_value_claimed_as_computed_is_a_plain_float() -> None:
    c = checks.expect_close("c", "r", 2.0, 2.1, 0.5)
    value = claims.Ledger("plot_a").claim("m.a", c, "x")
    assert type(value) is float and value == 2.0


def test_record_takes_the_checks_guard_unit_and_shown_text() -> None:
    ledger = claims.Ledger("plot_a", model="m")
    c = checks.expect_close("peak", "r", 6.1234, 6.16, 0.5, unit="MiB", against="the shapes")
    assert ledger.record("m.peak", c, fmt=".2f", seq_len=8) == 6.12
    assert ledger.record("m.peak2", c, "GiB") == pytest.approx(6.1234)
    a, b = ledger.records
    assert (a.unit, a.shown, a.guard, a.assumptions) == (
        "MiB", "6.12", "asserted: peak (6.123 ≈ 6.16 ± 0.5 vs the shapes)",
        (("model", "m"), ("seq_len", "8")))
    assert (b.unit, b.shown) == ("GiB", "")
    with pytest.raises(TypeError) as err:
        ledger.record("m.x", 1.0)
    assert str(err.value) == ("record 'm.x': got float 1.0, not the value a guide.checks check "
                              "returned; use ledger.claim(...) for a computed or cited number.")


def test_a_check_that_allows_zero_is_refused_naming_value_allowance_and_check() -> None:
    c = checks.expect_close("kept", "r", 0.28, 0.3, 0.31)
    with pytest.raises(ValueError) as err:
        claims.Ledger("plot_a").record("m.x", c)
    assert str(err.value) == (
        "record 'm.x': 0.28 ± 0.31 (kept) allows 0 or the opposite sign, so the check proves no "
        "value: tighten the allowance, or record the number with ledger.claim (computed).")


def test_a_typed_checked_guard_is_refused_with_the_fix() -> None:
    for guard in ("asserted: x", "bounded: y", "ordered: a < b"):
        with pytest.raises(ValueError, match=r"^claim 'm\.x': guard .* is typed\. An asserted or "
                                              r"ordered guard comes from the check that ran"):
            claims.Ledger("plot_a").claim("m.x", 1.0, "", guard=guard)
    with pytest.raises(ValueError, match=r"must be 'computed' or 'cited: <source>'"):
        claims.Ledger("plot_a").claim("m.x", 1.0, "", guard="cited:")


# -- assumptions and scopes ---------------------------------------------------------------------

def test_scopes_nest_and_a_calls_keywords_override_them() -> None:
    ledger = claims.Ledger("plot_a", model="m", steps=1)
    with ledger.scope(steps=20, seq_len=8) as same:
        assert same is ledger
        with ledger.scope(seq_len=16):
            ledger.claim("m.a", 1, "x", step=3)
        ledger.claim("m.b", 1, "x", model="n")
    ledger.claim("m.c", 1, "x")
    assert [r.assumptions for r in ledger.records] == [
        (("model", "m"), ("seq_len", "16"), ("step", "3"), ("steps", "20")),
        (("model", "n"), ("seq_len", "8"), ("steps", "20")),
        (("model", "m"), ("steps", "1"))]


def test_a_scope_is_closed_even_when_its_block_raises() -> None:
    ledger = claims.Ledger("plot_a")
    with pytest.raises(RuntimeError):
        with ledger.scope(steps=2):
            raise RuntimeError
    ledger.claim("m.a", 1, "x")
    assert ledger.records[0].assumptions == ()


def test_an_unknown_keyword_names_the_closest_options() -> None:
    with pytest.raises(TypeError) as err:
        claims.check_assumptions({"fnt": 1, "zzzzqq": 2, "world_sise": 3}, "claim 'm.x'")
    assert str(err.value) == (
        "claim 'm.x': unknown keyword 'fnt' (did you mean 'fmt'?), 'world_sise' (did you mean "
        "'world_size' or 'world_sizes'?), 'zzzzqq': not an option and not an assumption of "
        "guide.claims.ASSUMPTIONS (add a new kind of assumption there).")
    claims.check_assumptions({"world_size": 2, "model": "m"}, "x")  # known: nothing raised
    for call in (lambda: claims.Ledger("plot_a", fnt=1),
                 lambda: claims.Ledger("plot_a").scope(fnt=1).__enter__(),
                 lambda: claims.Ledger("plot_a").claim("m.x", 1, "", fnt=1)):
        with pytest.raises(TypeError, match=r"unknown keyword 'fnt' \(did you mean 'fmt'\?\)"):
            call()


def test_a_table_name_is_recorded_once_per_page() -> None:
    ledger = claims.Ledger("plot_a")
    ledger.add_table("m.t", ["a"], [])
    with pytest.raises(ValueError) as err:
        ledger.add_table("m.t", ["b"], [])
    assert str(err.value) == "table 'm.t': this page already recorded a table of that name."
    claims.Ledger("plot_b").add_table("m.t", ["a"], [])  # another page: fine


# -- agreement ----------------------------------------------------------------------------------

def test_same_as_compares_value_unit_and_assumptions() -> None:
    a = _claim(1.0, world_size=2)
    assert a.same_as(_claim(1.0 + 5e-10, page="q", world_size=2, shown="1"))
    assert not a.same_as(_claim(1.0 + 2e-9, world_size=2))
    assert not a.same_as(_claim(1.0, unit="GB", world_size=2))
    assert not a.same_as(_claim(1.0, world_size=4))
    assert _claim("x").same_as(_claim("x")) and not _claim("x").same_as(_claim("y"))
    assert not _claim(1).same_as(_claim("1")) and not _claim("1").same_as(_claim(1))
    assert _claim(0.0).same_as(_claim(0.0)) and not _claim(0.0).same_as(_claim(1e-300))


def test_a_contradiction_says_what_differs_and_both_pages() -> None:
    a, b = _claim(1.0, page="p", world_size=2), _claim(2, page="q", world_size=2)
    assert str(claims.Contradiction(a, b)) == (
        "claim 'm.x': values differ: page 'p' says 1.0 GiB {'world_size': '2'}, page 'q' says 2 "
        "GiB {'world_size': '2'}")
    c = _claim("bf16", page="r", unit="GB")
    assert str(claims.Contradiction(a, c)) == (
        "claim 'm.x': assumptions or units differ: page 'p' says 1.0 GiB {'world_size': '2'}, "
        "page 'r' says 'bf16' GB {}")


def test_contradictions_pair_each_record_with_the_first_of_its_name() -> None:
    a, b, c = _claim(1.0, page="p"), _claim(2.0, page="q"), _claim(3.0, page="r")
    assert [(f.first.page, f.second.page) for f in claims.contradictions([a, b, c, a])] == [
        ("p", "q"), ("p", "r")]
    assert claims.contradictions([]) == []


@pytest.mark.parametrize("typo, hint", [
    ("fmtt", "'fmt'"), ("shwn", "'shown'"), ("gaurd", "'guard'"), ("unti", "'unit' or 'units'"),
    ("fromats", "'formats' or 'fmt'"), ("titel", "'title' or 'estimate'"), ("recrod", "'record'"),
    ("nmae", "'name'"), ("kyes", "'keys'")])
def test_a_typo_of_each_option_names_it(typo: str, hint: str) -> None:
    with pytest.raises(TypeError, match=rf"^x: unknown keyword '{typo}' \(did you mean {hint}\?\)"
                                        r": not an option"):
        claims.check_assumptions({typo: 1}, "x")


_UNKNOWN_FNT = ("unknown keyword 'fnt' (did you mean 'fmt'?): not an option and not an assumption "
                "of guide.claims.ASSUMPTIONS (add a new kind of assumption there).")


@pytest.mark.parametrize("call, where", [
    (lambda: claims.Ledger("plot_a", fnt=1), "Ledger('plot_a')"),
    (lambda: claims.Ledger("plot_a").assume(fnt=1), "assume"),
    (lambda: claims.Ledger("plot_a").scope(fnt=1).__enter__(), "scope"),
    (lambda: claims.Ledger("plot_a").claim("m.x", 1, "", fnt=1), "claim 'm.x'"),
    (lambda: claims.Ledger("plot_a").record("m.y", checks.expect_close("c", "r", 1.0, 1.1, 0.5),
                                            fnt=1), "claim 'm.y'"),
])
def test_an_unknown_keyword_names_the_call_it_was_given_to(call, where: str) -> None:
    with pytest.raises(TypeError) as err:
        call()
    assert str(err.value) == f"{where}: {_UNKNOWN_FNT}"


def test_assuming_another_value_names_the_assumptions_and_the_fix() -> None:
    ledger = claims.Ledger("plot_a", model="m", steps=1)
    ledger.assume(model="m", seq_len=8)  # the same value again, and a new one: fine
    with pytest.raises(ValueError) as err:
        ledger.assume(steps=2, model="n", seq_len=8)
    assert str(err.value) == ("assume: ['model', 'steps'] already assumed with other values; use "
                              "scope(...) for a part of the page.")
    ledger.claim("m.a", 1, "x")
    assert ledger.records[0].assumptions == (("model", "m"), ("seq_len", "8"), ("steps", "1"))


def test_a_typed_checked_guard_is_refused_with_the_whole_fix() -> None:
    with pytest.raises(ValueError) as err:
        claims.Ledger("plot_a").claim("m.x", 1.0, "", guard="asserted: x")
    assert str(err.value) == (
        "claim 'm.x': guard 'asserted: x' is typed. An asserted or ordered guard comes from the "
        "check that ran: `ledger.record(name, checks.expect_close(...))` (or the value another "
        "guide.checks check returned); if no check compares the number with an independent "
        "value, record it as computed.")
