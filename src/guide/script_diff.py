"""Two versions of a script, side by side: which lines a migration keeps, changes, drops and adds.

A page that teaches a migration (DDP to FSDP2) shows the script before and after and says how much
of it changed. :func:`diff_lines` aligns the two with :mod:`difflib` (line by line, blank lines and
comment-only lines ignored, as they change nothing that runs), :func:`counts` totals the result,
and :func:`side_by_side` renders only the lines that differ as a two-column table whose cells are
code (``<code class="literal">``: the rendered-number scan reads code as code, not as claims).

``rename`` maps one script's identifiers to the other's before comparing (``{"ddp_": "fsdp2_"}``:
``ddp_train`` and ``fsdp2_train`` are the same function of two scripts), so a renamed ``def`` line
is not counted as a change of the program.
"""

from __future__ import annotations

import dataclasses
import difflib
import html
import inspect
from collections.abc import Callable, Mapping, Sequence

from guide.fault_points import without_tags
from guide.report import Table

__all__ = ["DiffLine", "code_lines", "counts", "diff_lines", "side_by_side", "source"]

#: The kinds of aligned line: kept as is, changed in place, only before, only after.
KINDS = ("same", "changed", "removed", "added")


@dataclasses.dataclass(frozen=True)
class DiffLine:
    """One aligned row: ``kind`` (one of :data:`KINDS`), the line before and after (``""`` where
    that side has none)."""

    kind: str
    before: str
    after: str


def source(*functions: Callable) -> str:
    """The source of ``functions`` as the page defines them, one after another, without the tags
    its tests inject faults at (:mod:`guide.fault_points`): the script a reader would copy."""
    return "\n".join(without_tags(inspect.getsource(f)) for f in functions)


def code_lines(source: str) -> list[str]:
    """The lines of ``source`` that run: blank and comment-only lines dropped, trailing space and
    end-of-line comments kept (a comment on a changed line is part of what a reader copies)."""
    return [line.rstrip() for line in source.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _renamed(line: str, rename: Mapping[str, str]) -> str:
    for old, new in rename.items():
        line = line.replace(old, new)
    return line


def _code(line: str) -> str:
    """A line without its end-of-line comment, for comparing (naive: a ``#`` inside a string
    ends the code, which only makes a line look changed, never unchanged)."""
    return line.split("  #", 1)[0].rstrip()


def diff_lines(before: str, after: str, rename: Mapping[str, str] | None = None) -> list[DiffLine]:
    """Align the running lines of ``before`` and ``after`` (:func:`code_lines`). Lines are equal
    when their code is (end-of-line comments and ``rename`` ignored); a replaced block pairs its
    lines in order, the longer side's extra lines counting as removed or added."""
    rename = dict(rename or {})
    old, new = code_lines(before), code_lines(after)
    if not old or not new:
        raise ValueError("diff_lines needs two scripts with code in them; got "
                         f"{len(old)} and {len(new)} running lines.")
    key_old = [_code(_renamed(line, rename)) for line in old]
    key_new = [_code(line) for line in new]
    out: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=key_old, b=key_new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += [DiffLine("same", a, b) for a, b in zip(old[i1:i2], new[j1:j2])]
            continue
        a, b = old[i1:i2], new[j1:j2]
        pairs = min(len(a), len(b))
        out += [DiffLine("changed", x, y) for x, y in zip(a[:pairs], b[:pairs])]
        out += [DiffLine("removed", x, "") for x in a[pairs:]]
        out += [DiffLine("added", "", y) for y in b[pairs:]]
    return out


def counts(lines: Sequence[DiffLine]) -> dict[str, int]:
    """How many aligned lines of each kind, plus ``before`` and ``after``: each script's running
    lines (``same + changed + removed`` and ``same + changed + added``)."""
    out = {kind: sum(line.kind == kind for line in lines) for kind in KINDS}
    unknown = [line.kind for line in lines if line.kind not in KINDS]
    if unknown:
        raise ValueError(f"counts: unknown kinds {sorted(set(unknown))}; kinds are {KINDS}.")
    out["before"] = out["same"] + out["changed"] + out["removed"]
    out["after"] = out["same"] + out["changed"] + out["added"]
    return out


class CodeTable(Table):
    """A :class:`~guide.report.Table` whose cells render as inline code."""

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f'<td><code class="docutils literal notranslate">{e(v)}</code></td>'
                             if v else "<td></td>" for v in row) + "</tr>"
            for row in self.cells)
        caption = f"<caption>{e(self.title)}</caption>" if self.title else ""
        return (f'<table class="guide-table guide-code-table docutils">{caption}<thead><tr>{head}'
                f"</tr></thead><tbody>{body}</tbody></table>")


def side_by_side(lines: Sequence[DiffLine], columns: tuple[str, str] = ("before", "after"),
                 title: str | None = None) -> CodeTable:
    """The lines that differ (changed, removed, added) as a two-column :class:`CodeTable`, in
    script order; leading indentation kept (non-breaking spaces, so HTML does not collapse it)."""
    rows = [(line.before, line.after) for line in lines if line.kind != "same"]
    if not rows:
        raise ValueError("side_by_side: the two scripts run the same lines; nothing to show.")
    width = max(len(c) for c in columns[:1] + tuple(r[0] for r in rows))
    text = [f"{columns[0].ljust(width)} | {columns[1]}"]
    text += [f"{a.ljust(width)} | {b}" for a, b in rows]
    nbsp = [tuple("\u00a0" * (len(v) - len(v.lstrip(" "))) + v.lstrip(" ") for v in row)
            for row in rows]
    return CodeTable("\n".join(([title] if title else []) + text), columns, nbsp, title)
