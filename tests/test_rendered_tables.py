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


# -- the HTML reader and the report, exactly (issue 38: the scan's modules under mutation) --------

def test_nested_tables_are_read_each_whole_and_the_inner_first() -> None:
    html = ("<table><tr><th>outer</th></tr><tr><td>a <table><tr><td>in</td></tr></table></td>"
            "<td>b</td></tr></table>")
    assert html_tables(html) == [[["in"]], [["outer"], ["a in", "b"]]]


def test_cells_outside_a_row_or_a_table_are_not_read() -> None:
    assert html_tables("<td>x</td><tr><td>y</td></tr><p>z</p>") == []
    assert html_tables("<table><td>x</td><tr><td>y</td></tr></table>") == [[["y"]]]
    assert html_tables("<table></table><tr></tr>") == [[]]
    assert html_tables("</td></table><table><tr><th> a \n b </th><td></td></tr></table>") == [
        [["a b", ""]]]


def test_text_between_cells_and_a_cell_closed_twice_add_no_cell() -> None:
    html = "<table>\n<tr> <td>a</td>\n <td>b</td></td> </tr>\n</table>"
    assert html_tables(html) == [[["a", "b"]]]


def test_an_unclosed_table_is_not_reported() -> None:
    assert html_tables("<table><tr><td>x</td></tr>") == []


def test_the_missing_table_names_page_table_and_why() -> None:
    from guide.rendered_tables import MissingTable

    m = MissingTable("plot_x", "x.gaps", "is recorded but gone")
    assert str(m) == "plot_x: table 'x.gaps' is recorded but gone"


def test_each_reason_is_given_in_full(tmp_path: Path) -> None:
    tables = [claims.ShownTable("plot_x", "t", ("a", "b"), (("1", "2"),)),
              claims.ShownTable("plot_x", "u", ("c",), (("3",),)),
              claims.ShownTable("pages/gone", "v", ("c",), ())]
    _page(tmp_path, "plot_x", "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>9</td></tr>"
                              "</table>")
    got = missing_tables(tmp_path, tables)
    assert [(m.page, m.table, m.why) for m in got] == [
        ("plot_x", "t", "is on the rendered page with other cells than the ones recorded"),
        ("plot_x", "u", "is recorded but not on the rendered page (shown with report.show? a "
                        "table printed as text does not count)"),
        ("pages/gone", "v", f"is recorded but {tmp_path / 'pages' / 'gone.html'} was not built")]


def test_cells_match_with_whitespace_folded_and_in_order(tmp_path: Path) -> None:
    t = claims.ShownTable("plot_x", "t", ("a  b",), (("1\n 2",), ("3",)))
    _page(tmp_path, "plot_x", "<table><tr><th>a b</th></tr><tr><td> 1 2 </td></tr>"
                              "<tr><td>3</td></tr></table>")
    assert missing_tables(tmp_path, [t]) == []
    swapped = claims.ShownTable("plot_x", "s", ("a b",), (("3",), ("1 2",)))
    assert [m.table for m in missing_tables(tmp_path, [swapped])] == ["s"]
    assert missing_tables(tmp_path, []) == []


def test_a_page_is_read_once_for_all_its_tables(tmp_path: Path, monkeypatch) -> None:
    from guide import rendered_tables

    reads = []
    real = rendered_tables.html_tables
    monkeypatch.setattr(rendered_tables, "html_tables", lambda html: reads.append(1) or real(html))
    _page(tmp_path, "plot_x", "<table><tr><th>a</th></tr></table>")
    tables = [claims.ShownTable("plot_x", n, ("a",), ()) for n in ("t", "u", "v")]
    tables.append(claims.ShownTable("plot_gone", "w", ("a",), ()))
    tables.append(claims.ShownTable("plot_gone", "z", ("a",), ()))
    got = missing_tables(tmp_path, tables)
    assert len(reads) == 1 and [m.table for m in got] == ["w", "z"]
    assert all("was not built" in m.why for m in got)


def test_an_undecodable_byte_does_not_stop_the_check(tmp_path: Path) -> None:
    path = html_path(tmp_path, "plot_x")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"<table><tr><th>a\xff</th></tr></table>")
    t = claims.ShownTable("plot_x", "t", ("a\ufffd",), ())
    assert missing_tables(tmp_path, [t]) == []


def test_html_path_of_each_kind_of_page(tmp_path: Path) -> None:
    assert html_path(tmp_path, "plot_x") == tmp_path / "auto_examples" / "plot_x.html"
    assert html_path("out", "pages/install") == Path("out") / "pages" / "install.html"
    assert html_path("out", "index") == Path("out") / "index.html"
