"""Tables a page prints: one helper, so no page pads columns by hand.

:func:`table` takes rows of values and renders them as an aligned plain-text table (what a script,
a notebook cell and a gallery page all show the same way). Floats are formatted by a per-column
format or ``{:.3g}``; ints with thousands separators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["table"]


def _cell(value: Any, fmt: str | None) -> str:
    if fmt is not None and value is not None and not isinstance(value, str):
        return format(value, fmt)
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def table(rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]],
          columns: Sequence[str] | None = None,
          formats: Mapping[str, str] | None = None, title: str | None = None) -> str:
    """Render ``rows`` (sequences in ``columns`` order, or dicts keyed by column) as a table.

    The first column is left-aligned, the others right-aligned. ``formats`` maps a column name to a
    format spec (``".1e"``, ``",.1f"``). Returns the text; pages ``print`` it.
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
    cells = []
    for row in rows:
        values = [row[c] for c in columns] if isinstance(row, Mapping) else list(row)
        if len(values) != len(columns):
            raise ValueError(f"table: a row has {len(values)} values for {len(columns)} columns: "
                             f"{values!r}.")
        cells.append([_cell(v, formats.get(c)) for c, v in zip(columns, values)])
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [title] if title else []
    out += [line(list(columns)), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    return "\n".join(out)
