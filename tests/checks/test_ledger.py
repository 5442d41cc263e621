"""The ledger check (guide.claims) on hand-made records: what it must call a contradiction, what it
must not, and the exact refusals of bad records. (tests/test_claims.py runs the ledger inside real
Sphinx builds.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from guide import claims
from guide.claims import Claim


def _claim(name: str = "x", value: float | int | str = 1.0, unit: str = "GiB", page: str = "p",
           **assumptions: str) -> Claim:
    return Claim(name, value, unit, page, tuple(sorted(assumptions.items())), "computed")


def test_records_of_different_names_never_contradict() -> None:
    assert claims.contradictions([_claim("a", 1.0), _claim("b", 2.0), _claim("a", 1.0, page="q")]) \
        == []


def test_equal_strings_agree_and_a_string_never_equals_a_number() -> None:
    assert claims.contradictions([_claim(value="bf16"), _claim(value="bf16", page="q")]) == []
    (found,) = claims.contradictions([_claim(value="1.0"), _claim(value=1.0, page="q")])
    assert (found.first.value, found.second.value) == ("1.0", 1.0)
    (found,) = claims.contradictions([_claim(value=1.0), _claim(value="1.0", page="q")])


def test_floats_agree_to_one_part_in_a_billion_and_no_further() -> None:
    base = 1e-12  # tiny values: a relative tolerance, no absolute one
    assert claims.contradictions([_claim(value=base), _claim(value=base * (1 + 5e-10))]) == []
    assert len(claims.contradictions([_claim(value=base), _claim(value=base * (1 + 2e-9))])) == 1
    assert len(claims.contradictions([_claim(value=0.0), _claim(value=1e-300)])) == 1


def test_the_ledger_error_lists_every_contradiction_one_per_line() -> None:
    records = [_claim("a", 1.0, page="p"), _claim("a", 2.0, page="q"),
               _claim("b", 1.0, page="p"), _claim("b", 1.0, "GB", page="r")]
    with pytest.raises(AssertionError) as err:
        claims.raise_on_contradictions(records)
    assert str(err.value) == (
        "[ledger] the site contradicts itself:\n"
        "- claim 'a': values differ: page 'p' says 1.0 GiB {}, page 'q' says 2.0 GiB {}\n"
        "- claim 'b': assumptions or units differ: page 'p' says 1.0 GiB {}, page 'r' says 1.0 GB {}")
    claims.raise_on_contradictions(records[:1] + records[2:3])  # no contradiction: no error


def test_a_record_survives_its_json_round_trip_whole() -> None:
    record = Claim("70b.ddp", 1051.3, "GiB", "pages/memory_calculator",
                   (("ddp_buckets", "True"), ("world_size", "8")), "asserted: memory model")
    assert Claim.from_json(record.to_json()) == record


def test_by_name_groups_records_in_name_then_page_order() -> None:
    records = [_claim("b", page="q"), _claim("a", page="z"), _claim("b", page="p"),
               _claim("a", page="y")]
    grouped = claims.by_name(records)
    assert list(grouped) == ["a", "b"]
    assert [[r.page for r in group] for group in grouped.values()] == [["y", "z"], ["p", "q"]]
    assert claims.by_name([]) == {}


def test_ledgers_of_several_pages_load_together(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "build" / "ledger"))  # made with parents
    claims.Ledger("plot_a").claim("x", 1.0, "GiB", ddp_buckets=True)
    claims.Ledger("pages/memory_calculator").claim("y", 2, "ranks", guard="cited: a paper")
    assert sorted(p.name for p in (tmp_path / "build" / "ledger").iterdir()) == [
        "pages__memory_calculator.jsonl", "plot_a.jsonl"]
    loaded = claims.load(tmp_path / "build" / "ledger")
    assert loaded == [Claim("y", 2, "ranks", "pages/memory_calculator", (), "cited: a paper"),
                      Claim("x", 1.0, "GiB", "plot_a", (("ddp_buckets", "True"),), "computed")]


def test_a_claim_records_every_field() -> None:
    ledger = claims.Ledger("plot_a")
    assert ledger.claim("m.params", 217_728, "parameters", guard="cited: x", k=2) == 217_728
    assert ledger.records == [Claim("m.params", 217_728, "parameters", "plot_a", (("k", "2"),),
                                    "cited: x")]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(name="Bad Name", value=1), ValueError,
     "claim name 'Bad Name': lower case, digits and . _ - / only."),
    (dict(name="ok", value=1, guard="checked"), ValueError,
     "claim 'ok': guard 'checked' must be 'computed' or 'cited: <source>' (asserted/ordered "
     "come from ledger.record)."),
    (dict(name="ok", value=True), TypeError, "claim 'ok': value must be a number or a string, got True."),
    (dict(name="ok", value=[1]), TypeError, "claim 'ok': value must be a number or a string, got [1]."),
    (dict(name="ok", value=float("inf")), ValueError, "claim 'ok': value inf is not finite."),
])
def test_bad_claims_are_refused_with_the_fix(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error) as err:
        claims.Ledger("plot_a").claim(unit="x", **kwargs)
    assert str(err.value) == message


def test_a_bad_page_name_is_refused_with_an_example() -> None:
    with pytest.raises(ValueError) as err:
        claims.Ledger("plot_a.py")
    assert str(err.value) == ("page 'plot_a.py': use the page's file name without extension, e.g. "
                              "'plot_ddp_vs_fsdp2' or 'pages/memory_calculator'.")
