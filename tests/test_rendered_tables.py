"""guide.rendered_tables: a table a page records and does not render fails the build by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from guide import claims, report
from guide.rendered_tables import html_path, html_tables, missing_tables


def _page(tmp_path: Path, page: str, body: str) -> None:
    path = html_path(tmp_path, page)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<html><body><article>{body}</article></body></html>")


def _recorded(page: str = "plot_x", name: str = "x.gaps"):
    ledger = claims.Ledger(page)
    table = report.table([["DDP", 0.5], ["FSDP2", 1234]], ["run", "gap"],
                         formats={"gap": ".2f"}, record=ledger, name=name)
    return ledger, table


def test_a_recorded_table_on_its_page_passes(tmp_path: Path) -> None:
    ledger, table = _recorded()
    _page(tmp_path, "plot_x", "<p>text</p>" + table._repr_html_())
    assert missing_tables(tmp_path, ledger.tables) == []


def test_a_recorded_table_missing_from_its_page_is_named(tmp_path: Path) -> None:
    ledger, table = _recorded()
    _page(tmp_path, "plot_x", f"<pre>{table}</pre>")  # printed as text: not a table
    (missing,) = missing_tables(tmp_path, ledger.tables)
    assert (missing.page, missing.table) == ("plot_x", "x.gaps")
    assert "not on the rendered page" in str(missing) and "plot_x" in str(missing)


def test_another_pages_table_does_not_count(tmp_path: Path) -> None:
    ledger, table = _recorded()
    _page(tmp_path, "plot_x", "<p>nothing</p>")
    _page(tmp_path, "plot_y", table._repr_html_())
    assert [m.table for m in missing_tables(tmp_path, ledger.tables)] == ["x.gaps"]


def test_a_table_with_other_cells_is_named_as_such(tmp_path: Path) -> None:
    ledger, _ = _recorded()
    other = report.table([["DDP", 0.5], ["FSDP2", 999]], ["run", "gap"], formats={"gap": ".2f"})
    _page(tmp_path, "plot_x", other._repr_html_())
    (missing,) = missing_tables(tmp_path, ledger.tables)
    assert "other cells" in missing.why


def test_a_page_that_was_not_built_is_named(tmp_path: Path) -> None:
    ledger, _ = _recorded("pages/install", "install.t")
    (missing,) = missing_tables(tmp_path, ledger.tables)
    assert "was not built" in missing.why and missing.page == "pages/install"


def test_html_tables_reads_header_and_cells_with_links_and_entities() -> None:
    html = ('<table><thead><tr><th>a &amp; b</th><th>n</th></tr></thead><tbody><tr><td>'
            '<a href="#s">x\n y</a></td><td>1,234</td></tr></tbody></table>')
    assert html_tables(html) == [[["a & b", "n"], ["x y", "1,234"]]]


def test_the_build_records_tables_in_the_ledger_directory(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    ledger, table = _recorded()
    (loaded,) = claims.load_tables(tmp_path)
    assert loaded == ledger.tables[0] and loaded.cells == (("DDP", "0.50"), ("FSDP2", "1234.00"))
    assert claims.load(tmp_path)  # the cells' claims are still read as claims
    with pytest.raises(ValueError, match="already recorded a table"):
        ledger.add_table("x.gaps", ["a"], [["1"]])


def test_html_path_inverts_page_of() -> None:
    from guide.rendered import page_of

    for page in ("plot_x", "pages/install", "index"):
        assert page_of(html_path("", page).as_posix()) == page
