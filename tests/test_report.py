"""guide.report.table: one helper renders every printed table."""

from __future__ import annotations

import pytest

from guide.report import table


def test_columns_align_and_numbers_format() -> None:
    text = table([["DDP x2", 1.25e-7, 217_728], ["FSDP2 x2", 0.5, 3]], ["run", "gap", "params"],
                 formats={"gap": ".1e"})
    lines = text.splitlines()
    assert lines[0].split() == ["run", "gap", "params"]
    assert lines[2].split() == ["DDP", "x2", "1.2e-07", "217,728"]
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule have the same width
    assert lines[3].endswith("      3")  # numbers right-aligned


def test_rows_as_dicts_and_a_title() -> None:
    text = table([{"a": "x", "b": None}], title="T")
    assert text.splitlines()[0] == "T" and text.splitlines()[-1].split() == ["x", "-"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(rows=[[1, 2]], columns=["a"]), "a row has 2 values for 1 columns"),
    (dict(rows=[[1]], columns=["a"], formats={"b": ".1f"}), "formats for unknown columns"),
    (dict(rows=[[1]]), "give columns"),
])
def test_mistakes_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        table(**kwargs)


def test_show_prints_under_python_even_with_sphinx_gallery_imported(capsys) -> None:
    """Under ``python x.py`` the table is printed, once, even when sphinx_gallery was imported
    (a test session imports it), and show returns None (a cell's last line shows nothing twice)."""
    import sphinx_gallery  # noqa: F401  (imported, not executing)

    from guide import report

    t = report.table([["a", 1]], ["x", "n"])
    assert report.show(t) is None
    assert capsys.readouterr().out == str(t) + "\n"


def _gallery_stdout(monkeypatch):
    import io
    import sys

    class Tee(io.StringIO):
        pass

    Tee.__module__ = "sphinx_gallery.gen_rst"
    tee = Tee()
    monkeypatch.setattr(sys, "stdout", tee)
    return tee


def test_a_table_shown_mid_cell_on_a_gallery_page_is_on_the_page(monkeypatch) -> None:
    """Under sphinx-gallery a table shown anywhere in a block (not only as the cell's last value)
    comes out of the block's scraper as an HTML table, in the order shown, and only once."""
    from guide import report

    tee = _gallery_stdout(monkeypatch)
    first, second = report.table([["a", 1]], ["x", "n"]), report.table([["b", 2]], ["y", "m"])
    report.show(first)
    print("text between")
    report.show(second)
    assert tee.getvalue() == "text between\n"  # not printed as text too
    rst = report.gallery_scraper(None, {}, {})
    assert rst.count(".. raw:: html") == 2
    assert rst.index(first._repr_html_()) < rst.index(second._repr_html_())
    assert report.gallery_scraper(None, {}, {}) == ""  # the next block shows nothing of these


def test_a_table_shown_in_a_notebook_is_displayed(monkeypatch) -> None:
    from guide import report

    shown = []
    monkeypatch.setattr(report, "_rich_display", lambda: True)
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", shown.append)
    t = report.table([["a", 1]], ["x", "n"])
    assert report.show(t) is None and shown == [t]


def test_show_refuses_what_is_not_a_table() -> None:
    from guide import report

    with pytest.raises(TypeError, match="give a report.table"):
        report.show("a string")
