"""What a page prints: tables and conclusions, one helper each, so no page pads columns by hand.

* :func:`table` renders rows as a :class:`Table`: a ``str`` (the aligned plain-text table that
  ``print`` shows) with ``_repr_html_`` (an HTML table). ``record=ledger, name="main-example.gaps"``
  records every number cell in the page's ledger as it is shown (``<name>.<row>.<column>``) and
  the table itself (:meth:`guide.claims.Ledger.add_table`), so a table never prints a number the
  ledger lacks, and the build fails if a recorded table is not on the rendered page
  (:mod:`guide.rendered_tables`).
* :func:`show` displays a table wherever it stands in a cell, and returns nothing: an HTML table
  in a notebook (``IPython.display``) and on a gallery page (:func:`gallery_scraper`, which
  sphinx-gallery calls after every code block: a cell's last value is the only thing
  sphinx-gallery itself would show), the plain text under ``python example.py``.
* :func:`conclusion` prints a sentence wrapped to :data:`WIDTH` columns: never one 300-character
  line in a ``<pre>``.

Floats are formatted by a per-column format or ``{:.3g}``; ints with thousands separators.
"""

from __future__ import annotations

import html
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from guide.checked import Checked
from guide.claims import check_assumptions

__all__ = ["Link", "Table", "WIDTH", "conclusion", "gallery_scraper", "show", "table"]

#: Columns a printed conclusion wraps at (fits the content column of a page at 1440 px).
WIDTH = 88
_SLUG = re.compile(r"[^a-z0-9_.\-]+")


class Link(str):
    """A table cell that links to ``href`` in HTML (e.g. ``"#a-section"``); plain text elsewhere."""

    href: str

    def __new__(cls, text: str, href: str) -> Link:
        self = super().__new__(cls, text)
        self.href = href
        return self


def _cell(value: Any, fmt: str | None) -> str:
    if isinstance(value, Link):
        return value
    if fmt is not None and value is not None and not isinstance(value, str):
        return format(value, fmt)
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _slug(text: object) -> str:
    return _SLUG.sub("_", str(text).lower()).strip("_.-") or "_"


class Table(str):
    """A rendered table: the plain text (it *is* the ``str``), plus ``_repr_html_``.

    ``columns`` and ``cells`` (the shown text of every cell) and ``title`` stay available.
    """

    columns: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    title: str | None

    def __new__(cls, text: str, columns: Sequence[str], cells: Sequence[Sequence[str]],
                title: str | None) -> Table:
        self = super().__new__(cls, text)
        self.columns, self.title = tuple(columns), title
        self.cells = tuple(tuple(r) for r in cells)
        return self

    def _repr_html_(self) -> str:
        e = html.escape
        right = ' style="text-align:right"'
        head = "".join(f"<th{'' if i == 0 else right}>{e(c)}</th>"
                       for i, c in enumerate(self.columns))
        def cell(v: str) -> str:
            if isinstance(v, Link):
                return f'<a class="reference internal" href="{e(v.href)}">{e(v)}</a>'
            return e(v)

        body = "".join("<tr>" + "".join(f"<td{'' if i == 0 else right}>{cell(v)}</td>"
                                        for i, v in enumerate(row)) + "</tr>"
                       for row in self.cells)
        caption = f"<caption>{e(self.title)}</caption>" if self.title else ""
        return (f'<table class="guide-table docutils">{caption}<thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table>")

    def __repr__(self) -> str:  # a bare `table` at a prompt reads as the table, not a str literal
        return str(self)


def _in_gallery() -> bool:
    """Whether sphinx-gallery is executing a page now (stdout is its tee)."""
    return type(sys.stdout).__module__.startswith("sphinx_gallery")


def _rich_display() -> bool:
    """Whether something shows a cell's last value: sphinx-gallery executing an example (its
    stdout is then sphinx-gallery's tee; merely importing sphinx_gallery, as a test run may, does
    not count) or an IPython kernel."""
    if _in_gallery():
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


#: Tables shown in the code block sphinx-gallery is executing, for :func:`gallery_scraper`.
_GALLERY_QUEUE: list[Table] = []


def show(obj: Table) -> None:
    """Display ``obj`` now, wherever it stands in a cell: on a gallery page (queued for
    :func:`gallery_scraper`), in a notebook (``IPython.display.display``), else printed. Returns
    ``None``, so a ``show(...)`` that ends a cell is not displayed a second time."""
    if not isinstance(obj, Table):
        raise TypeError(f"show: got {type(obj).__name__}; give a report.table(...) (print other "
                        "values).")
    if _in_gallery():
        _GALLERY_QUEUE.append(obj)
    elif _rich_display():
        from IPython.display import display

        display(obj)
    else:
        print(obj)


def gallery_scraper(block: Any, block_vars: Any, gallery_conf: Any) -> str:
    """sphinx-gallery's hook after each code block (``image_scrapers`` in ``docs/conf.py``): the
    reST of the tables :func:`show` displayed in that block, as HTML, in the order shown."""
    shown, _GALLERY_QUEUE[:] = list(_GALLERY_QUEUE), []
    html_blocks = [f'.. raw:: html\n\n    <div class="output_subarea output_html rendered_html '
                   f'output_result guide-shown-table">\n    {t._repr_html_()}\n    </div>\n'
                   for t in shown]
    return "\n" + "\n".join(html_blocks) + "\n" if shown else ""


def conclusion(text: str) -> None:
    """Print ``text`` (a page's verdict) wrapped to :data:`WIDTH` columns, blank line before."""
    print("\n" + textwrap.fill(" ".join(text.split()), WIDTH))


def table(rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]],
          columns: Sequence[str] | None = None,
          formats: Mapping[str, str] | None = None, title: str | None = None, *,
          record: Any = None, name: str | None = None, keys: Sequence[str] | None = None,
          **assumptions: Any) -> Table:
    """Render ``rows`` (sequences in ``columns`` order, or dicts keyed by column) as a table.

    The first column is left-aligned, the others right-aligned. ``formats`` maps a column name to a
    format spec (``".1e"``, ``",.1f"``). With ``record=ledger, name="table"`` every number cell is
    recorded in ``ledger`` (a :class:`guide.claims.Ledger`) as ``<name>.<row key>.<column>``,
    its value as shown: a :class:`~guide.checked.Checked` cell with its check's guard, any other
    number as computed; ``keys`` names the rows (default: the first column's text, slugged);
    ``assumptions`` add to the ledger's. Returns the :class:`Table`; pages ``print`` it or make it
    a cell's last expression (an HTML table on the built page).
    """
    rows = list(rows)
    if columns is None:
        if not rows or not isinstance(rows[0], Mapping):
            raise ValueError("table: give columns, or rows as dicts keyed by column name.")
        columns = list(rows[0])
    formats = dict(formats or {})
    unknown = set(formats) - set(columns)
    if unknown:
        raise ValueError(f"table: formats for unknown columns {sorted(unknown)}; columns are "
                         f"{list(columns)}.")
    if assumptions and record is None:
        raise TypeError(f"table: unknown keyword(s) {sorted(assumptions)} (assumptions are only "
                        "taken with record=ledger; options are formats, title, record, name, "
                        "keys).")
    if record is not None:
        check_assumptions(assumptions, f"table {name!r}")
    if (record is None) != (name is None):
        raise ValueError("table: give both record=ledger and name='<table name>', or neither.")
    if keys is not None and len(keys) != len(rows):
        raise ValueError(f"table: {len(keys)} keys for {len(rows)} rows.")
    values_by_row, cells = [], []
    for row in rows:
        values = [row[c] for c in columns] if isinstance(row, Mapping) else list(row)
        if len(values) != len(columns):
            raise ValueError(f"table: a row has {len(values)} values for {len(columns)} columns: "
                             f"{values!r}.")
        values_by_row.append(values)
        cells.append([_cell(v, formats.get(c)) for c, v in zip(columns, values)])
    if record is not None:
        _record(record, name, columns, values_by_row, cells, keys, assumptions)
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [title] if title else []
    out += [line(list(columns)), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    return Table("\n".join(out), [str(c) for c in columns], cells, title)


def _record(ledger: Any, name: str, columns: Sequence[str], values_by_row: list[list[Any]],
            cells: list[list[str]], keys: Sequence[str] | None,
            assumptions: Mapping[str, Any]) -> None:
    row_keys = [_slug(k) for k in keys] if keys is not None else [_slug(r[0]) for r in cells]
    seen = {k for k in row_keys if row_keys.count(k) > 1}
    if seen:
        raise ValueError(f"table {name!r}: rows {sorted(seen)} share a key; give keys=[...] "
                         "naming each row.")
    for key, values, shown in zip(row_keys, values_by_row, cells):
        for column, value, text in zip(columns, values, shown):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            claim = f"{name}.{key}.{_slug(column)}"
            unit = ""
            if isinstance(value, Checked):
                ledger.record(claim, value, shown=text, **assumptions)
            else:
                ledger.claim(claim, value, unit, shown=text, **assumptions)
    ledger.add_table(name, columns, cells)
