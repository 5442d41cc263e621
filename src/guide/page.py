"""The running page: it declares itself, and every number it checks, shows or concludes is recorded.

Each example opens with one call, before its first job::

    PAGE = guide.Page(section="Memory", order=2, key_api="fully_shard(",
                      world_size=4, supports=(2, 4, 8))
    WORLD_SIZE = PAGE.world_size  # 4 under python; torchrun's WORLD_SIZE under torchrun

The site reads the call without running it (:mod:`guide.declaration`). At run time the page is
also the page's ledger (:class:`guide.claims.Ledger`, named after the example's file), and
recording is a side effect of saying something:

* ``PAGE.show("main-example.gaps", rows, columns, formats=...)`` displays the table wherever it
  stands in a cell (:func:`guide.report.show`) and records every number cell and the table itself,
  so the build fails if the rendered page lacks it (:mod:`guide.rendered_tables`);
* ``PAGE.check(name, checked)`` records a value a :mod:`guide.checks` check returned, with its
  guard; ``PAGE.state(name, value, unit)`` a computed number; ``PAGE.cite(name)`` a cited constant;
* ``PAGE.conclude(f"...")`` prints the verdict, and refuses a number in it that the page did not
  record (the strict scan of the built site would fail later; this fails under ``python`` too).

A keyword that is neither an option nor an assumption of :data:`guide.claims.ASSUMPTIONS` is an
error naming the closest one. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from guide import constants, rendered, report
from guide.checked import Checked
from guide.claims import Ledger
from guide.declaration import Declaration
from guide.launcher.rank import world_size as _world_size
from guide.world_sizes import Contract

__all__ = ["Page", "page_name"]


def page_name(caller_globals: Mapping[str, Any]) -> str:
    """The example a page runs in, for its ledger: the stem of the running file (``__file__``
    under ``python`` and ``runpy``; ``sys.argv[0]``, which sphinx-gallery sets to the example,
    in the docs build, where ``__file__`` is not defined), else ``"notebook"``."""
    for candidate in (caller_globals.get("__file__"), sys.argv[0] if sys.argv else None):
        if candidate and str(candidate).endswith(".py"):
            return Path(candidate).stem
    return "notebook"


def _page_globals() -> Mapping[str, Any]:
    """The globals of the running example (:func:`_example_globals` of this process and of the
    frame that called this function)."""
    return _example_globals(sys.modules.get("__main__"), sys._getframe(1))


def _example_globals(main: ModuleType | None, frame: FrameType) -> Mapping[str, Any]:
    """The globals of the running example: those of ``main`` (the ``__main__`` module, if any)
    where it is a script (``python x.py``, torchrun, runpy's ``run_name="__main__"``), else those
    of ``frame`` or, if it is this package's, of the first frame above it outside the package.
    Given the frame rather than reading the stack, it is testable with any stack (a test's own
    stack holds the frames of whatever wraps the calls, mutmut's trampolines for one)."""
    main_globals = vars(main) if main is not None else {}
    file = str(main_globals.get("__file__", ""))
    if file.endswith(".py") and not Path(file).stem.startswith("_"):  # not python -m's __main__
        return main_globals
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("guide."):
        frame = frame.f_back
    return frame.f_globals


class Page:
    """The running page: its :class:`~guide.declaration.Declaration`, the world size it runs at,
    and its ledger (``PAGE.ledger``), which every ``show``, ``check``, ``state``, ``cite`` and
    ``conclude`` records into."""

    def __init__(self, *, section: str, order: int, key_api: str, world_size: int,
                 supports: Iterable[int], why: str = "") -> None:
        self.declaration = Declaration(section, order, key_api,
                                       Contract(world_size, tuple(supports), why))
        #: The default under ``python``; torchrun's ``WORLD_SIZE`` (if supported) under torchrun.
        self.world_size = _world_size(world_size, supports=tuple(supports), why=why)
        #: Every number this page states (see :class:`guide.claims.Ledger`), named for its file.
        self.ledger = Ledger(page_name(_page_globals()))

    def __repr__(self) -> str:
        d = self.declaration
        return (f"Page(section={d.section!r}, order={d.order}, key_api={d.key_api!r}, "
                f"world_size={self.world_size})")

    def assume(self, **assumptions: Any) -> None:
        """From here on, every record of the page also depends on ``assumptions`` (its model, its
        world size...): said once, not per call (:meth:`guide.claims.Ledger.assume`)."""
        self.ledger.assume(**assumptions)

    @contextlib.contextmanager
    def scope(self, **assumptions: Any) -> Iterator[Page]:
        """Within ``with PAGE.scope(steps=20):`` every record also depends on ``steps=20``."""
        with self.ledger.scope(**assumptions):
            yield self

    def show(self, name: str | None,
             rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
             columns: Sequence[str] | None = None, *, formats: Mapping[str, str] | None = None,
             title: str | None = None, keys: Sequence[str] | None = None,
             **assumptions: Any) -> None:
        """Display a table now and record it as ``name``: each number cell as
        ``<name>.<row key>.<column>`` (a :class:`~guide.checked.Checked` cell with its check's
        guard), and the table, which must then be on the rendered page. Rows given as a mapping
        ``{row key: row}`` are keyed by it (else ``keys``, else the first column's text).
        ``name=None`` shows a table without numbers (shapes, names, placements); one with a
        number cell is refused."""
        if isinstance(rows, Mapping):
            if keys is not None:
                raise ValueError(f"PAGE.show({name!r}, ...): rows keyed by a mapping take no "
                                 "keys= (the mapping's keys name the rows).")
            keys, rows = [str(k) for k in rows], list(rows.values())
        if name is None:
            numbers = [v for row in rows
                       for v in (row.values() if isinstance(row, Mapping) else row)
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                raise ValueError(f"PAGE.show(None, ...): the table has number cells "
                                 f"({numbers[:3]!r}...) or assumptions; name it, so its "
                                 "numbers are recorded.")
            if assumptions or keys is not None:
                raise ValueError("PAGE.show(None, ...): keys and assumptions need a name.")
            report.show(report.table(rows, columns, formats, title))
            return
        report.show(report.table(rows, columns, formats, title, record=self.ledger, name=name,
                                 keys=keys, **assumptions))

    def check(self, name: str, checked: Checked, unit: str | None = None, *,
              fmt: str | None = None, shown: str | None = None, **assumptions: Any) -> float:
        """Record a value a check returned, with the check's guard; return it as shown
        (:meth:`guide.claims.Ledger.record`)."""
        return self.ledger.record(name, checked, unit, fmt=fmt, shown=shown, **assumptions)

    def state(self, name: str, value: Any, unit: str, *, fmt: str | None = None,
              shown: str | None = None, **assumptions: Any) -> Any:
        """Record a computed number (no check compares it with an independent value); return it
        as shown (:meth:`guide.claims.Ledger.claim`)."""
        return self.ledger.claim(name, value, unit, fmt=fmt, shown=shown, **assumptions)

    def cite(self, name: str) -> float | int:
        """Record that this page states the cited constant ``name``; return its value
        (:func:`guide.constants.cite`)."""
        return constants.cite(self.ledger, name)

    def conclude(self, text: str) -> None:
        """Print the page's verdict (:func:`guide.report.conclusion`). Every number in it must be
        one this page recorded, at the precision shown: the verdict quotes the page's numbers, it
        does not type new ones (the rules are :mod:`guide.rendered`'s, so a number it accepts
        here the built site's scan accepts too)."""
        missing = rendered.unrecorded_numbers(self.ledger.page, " ".join(text.split()),
                                              self.ledger.records)
        if missing:
            raise ValueError(
                f"{self.ledger.page}: the conclusion states "
                f"{', '.join(repr(m.number) for m in missing)}, which the page did not record: "
                "record it (PAGE.check / PAGE.state, or a PAGE.show table) and format the value "
                "the record returns.")
        report.conclusion(text)
