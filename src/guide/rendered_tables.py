"""Nothing a page records can vanish: every table a page records is on its rendered page.

The strict scan (:mod:`guide.rendered`) fails a page that shows a number its ledger lacks; it
cannot see a number that never rendered. This is the reverse check: after the build,
:func:`missing_tables` reads every HTML ``<table>`` of each page and reports each table the page
recorded (:meth:`guide.claims.Ledger.add_table`: its header and the text of every cell) that no
table of the rendered page equals, header and cells, in order. A table printed as plain text does
not count: a table renders as a table. ``docs/ledger_ext.py`` fails the build naming page and
table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

from guide.claims import ShownTable

__all__ = ["MissingTable", "html_tables", "html_path", "missing_tables"]


@dataclasses.dataclass(frozen=True)
class MissingTable:
    """A table a page recorded that its rendered HTML lacks."""

    page: str
    table: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}: table {self.table!r} {self.why}"


class _Tables(HTMLParser):
    """Every ``<table>`` of a page as rows of cell texts (``th`` and ``td``, whitespace folded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self._open: list[list[list[str]]] = []  # tables being read (nested ones too)
        self._cells: list[list[str] | None] = []  # the cell being read in each open table

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._open.append([])
            self._cells.append(None)
        elif tag == "tr" and self._open:
            self._open[-1].append([])
        elif tag in ("td", "th") and self._open and self._open[-1]:
            self._cells[-1] = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cells and self._cells[-1] is not None:
            self._open[-1][-1].append(" ".join("".join(self._cells[-1]).split()))
            self._cells[-1] = None
        elif tag == "table" and self._open:
            self.tables.append(self._open.pop())
            self._cells.pop()

    def handle_data(self, data: str) -> None:
        for cell in self._cells:  # a nested table's text is also its outer cell's
            if cell is not None:
                cell.append(data)


def html_tables(html: str) -> list[list[list[str]]]:
    """The tables of ``html``: each a list of rows, each row a list of cell texts."""
    parser = _Tables()
    parser.feed(html)
    return parser.tables


def html_path(html_dir: str | Path, page: str) -> Path:
    """Where a ledger page is rendered: ``plot_x`` -> ``auto_examples/plot_x.html``,
    ``pages/install`` -> ``pages/install.html`` (the inverse of :func:`guide.rendered.page_of`)."""
    rel = f"auto_examples/{page}" if page.startswith("plot_") else page
    return Path(html_dir) / f"{rel}.html"


def _fold(row: Iterable[str]) -> list[str]:
    return [" ".join(str(c).split()) for c in row]


def missing_tables(html_dir: str | Path, tables: Iterable[ShownTable]) -> list[MissingTable]:
    """Each recorded table that is not, header and cells, one of its page's HTML tables."""
    out, rendered = [], {}
    for t in tables:
        path = html_path(html_dir, t.page)
        if t.page not in rendered:
            rendered[t.page] = html_tables(path.read_text(errors="replace")) \
                if path.exists() else None
        found = rendered[t.page]
        if found is None:
            out.append(MissingTable(t.page, t.name, f"is recorded but {path} was not built"))
            continue
        want = [_fold(t.columns), *(_fold(r) for r in t.cells)]
        if want not in found:
            headers = [tab[0] for tab in found if tab]
            why = ("is recorded but not on the rendered page (shown with report.show? a table "
                   "printed as text does not count)")
            if _fold(t.columns) in headers:
                why = "is on the rendered page with other cells than the ones recorded"
            out.append(MissingTable(t.page, t.name, why))
    return out
