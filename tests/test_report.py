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


def test_show_prints_unless_sphinx_gallery_is_executing_the_page(capsys, monkeypatch) -> None:
    """``report.show`` prints under ``python x.py`` even when sphinx_gallery was imported (a test
    session imports it): only sphinx-gallery's own stdout tee, while it runs a page, shows the
    cell's last value instead (a print there would show the table twice)."""
    import io
    import sys

    import sphinx_gallery  # noqa: F401  (imported, not executing)

    from guide import report

    t = report.table([["a", 1]], ["x", "n"])
    assert report.show(t) is t and "a" in capsys.readouterr().out

    class Tee(io.StringIO):
        pass

    Tee.__module__ = "sphinx_gallery.gen_rst"
    tee = Tee()
    monkeypatch.setattr(sys, "stdout", tee)
    assert report.show(t) is t and tee.getvalue() == ""
