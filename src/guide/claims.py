"""The ledger of claims: every number a page states, recorded with what it depends on.

A page states a number (in prose, a table or a figure title) through the ledger, which returns the
value so the page prints what it recorded. Each record carries a stable name, the value, the text
the page shows for it (``shown``), its unit, the assumptions it depends on (model, precision,
optimizer, DDP buckets counted or not, N, sequence length, hardware) and its guard, of four kinds:

* ``asserted: <check> (...)``: a check of :mod:`guide.checks` compared the number with an
  independent value and would have failed the build. Only :meth:`Ledger.record` writes it, from the
  :class:`guide.checked.Checked` the check returned; it cannot be typed.
* ``bounded: <check> (...)``: a check held the number below (or above) an allowance, e.g. a gap
  ``≤`` a tolerance: it bounds the number, it does not pin it. Also only through
  :meth:`Ledger.record`.
* ``ordered: a < b``: a check ordered two quantities (:func:`guide.checks.expect_order`); also
  only through :meth:`Ledger.record`.
* ``computed``: the shipped code computed it; nothing independent compares it
  (:meth:`Ledger.claim`, the default).
* ``cited: <source>``: a constant from a paper, a datasheet, a release, a file
  (:meth:`Ledger.claim` with ``guard="cited: <source>"``).

Assumptions shared by a page's numbers are given once: ``Ledger(page, model=..., world_size=2)``
and ``with ledger.scope(steps=20):``; a call's own keywords add to (or override) them.

A page, in short::

    ledger = claims.Ledger("plot_x", model=repr(CFG), world_size=WORLD_SIZE)
    gap = checks.assert_losses_match(run, ref_losses, losses, against=checks.SINGLE_PROCESS)
    ledger.record("x.loss_gap", gap, fmt=".1e")                 # asserted: loss equivalence (...)
    kept = checks.expect_close("memory", run, got, want, tol, unit="B", against="the shapes")
    ledger.record("x.kept", kept.scaled(1 / 2**20, "MiB"), fmt=".2f")
    ledger.record("x.async_ms", checks.expect_order("save", run, a, b, low_name="async",
                                                    high_name="blocking"))  # ordered: a < b
    ledger.claim("x.ratio", ratio, "x", fmt=".2f")              # computed
    report.table(rows, cols, record=ledger, name="x.table")    # every number cell recorded

Prose states a recorded number with the ``claim`` role (``docs/ledger_ext.py``):
``:claim:`x.loss_gap``` in a gallery text cell, ``{claim}`x.kept <unit>``` in a MyST page.
After the build, :mod:`guide.rendered` reports every printed number the page's ledger lacks.

During the docs build (``GUIDE_LEDGER_DIR`` set by ``docs/conf.py``) each page's records go to one
JSON-lines file in that directory, rewritten whenever the page runs. :func:`contradictions` reads all
pages' records: two records of one name with different values or assumptions are a contradiction,
and the build fails naming both pages. Outside the build (``python example.py``, a notebook)
records stay in memory: the page still checks itself for contradictions, nothing is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from guide.checked import Checked

__all__ = ["Claim", "Contradiction", "GUARD_KINDS", "Ledger", "LEDGER_ENV", "ShownTable",
           "ASSUMPTIONS", "TABLES_SUFFIX", "check_assumptions", "by_name", "contradictions", "load", "load_tables", "missing_pages",
           "raise_on_contradictions", "shown_text"]

#: The environment variable naming the directory the build's ledger is written to.
LEDGER_ENV = "GUIDE_LEDGER_DIR"
#: Beside a page's ``<page>.jsonl`` of claims, the tables it recorded (one JSON object a line).
TABLES_SUFFIX = ".tables.ndjson"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-/]*$")
_PAGE = re.compile(r"^[a-z0-9][a-z0-9_\-/]*$")
_GUARD = re.compile(r"^(asserted: .+|bounded: .+|ordered: .+|computed|cited: .+)$")
#: Every assumption a claim may depend on, by name: a keyword that is not one of these is a
#: typo (``fnt=".1f"`` for ``fmt``), refused naming the closest, never recorded as an
#: assumption. A new kind of assumption is added here, once.
ASSUMPTIONS = frozenset({
    "activations", "algorithm", "attention", "backend", "baseline", "batch", "batch_tokens",
    "budget_mib", "cast_forward_inputs", "checkpointing", "checks", "counts", "date",
    "ddp_buckets", "depths", "device", "dp", "ep", "estimate", "formula", "global_batch", "gpu",
    "gpus", "hardware", "headroom_p", "integer_setting", "k", "load_bytes", "local_experts",
    "lora_rank", "max_norm", "mfu", "micro_batch", "micro_batches", "model", "model_sources",
    "n_experts", "nodes", "norm", "optimizer", "output_dtype", "param_dtype", "params",
    "per_rank_micro_batch", "precision", "rank", "reduce_dtype", "replicas",
    "reshard_after_forward", "seq_len", "sequence_parallel", "shape", "shapes", "shards",
    "source", "step", "steps", "steps_counted", "steps_timed", "tokens_per_rank", "top_k", "tp",
    "units", "vocab", "world_size", "world_sizes",
})
#: The kinds of guard, strongest first.
GUARD_KINDS = ("asserted", "bounded", "ordered", "computed", "cited")
#: The kinds only a check's :class:`~guide.checked.Checked` earns (:meth:`Ledger.record`).
CHECKED_KINDS = ("asserted", "bounded", "ordered")
#: Two float values of one claim agree if they are equal to this relative precision (they are
#: printed to at most 4 significant digits; a real disagreement is far larger).
REL_TOL = 1e-9


@dataclasses.dataclass(frozen=True)
class Claim:
    """One number one page states."""

    name: str
    value: float | int | str
    unit: str
    page: str
    assumptions: tuple[tuple[str, str], ...]
    guard: str
    #: The value as the page shows it (``"7,559.6"``, ``"24.7%"``); ``""``: as :func:`shown_text`.
    shown: str = ""

    @property
    def kind(self) -> str:
        """The guard's kind: one of :data:`GUARD_KINDS`."""
        return self.guard.split(":")[0]

    @property
    def check(self) -> str:
        """The guard without its kind and figures: the check's name, or the source cited."""
        rest = self.guard.partition(": ")[2]
        return rest.split(" (")[0] if self.kind in CHECKED_KINDS else rest

    @property
    def text(self) -> str:
        """The value exactly as the page states it."""
        return self.shown or shown_text(self.value)

    def same_as(self, other: Claim) -> bool:
        """Same value (to :data:`REL_TOL` for floats), unit and assumptions."""
        if (self.unit, self.assumptions) != (other.unit, other.assumptions):
            return False
        a, b = self.value, other.value
        if isinstance(a, str) or isinstance(b, str):
            return a == b
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "assumptions": dict(self.assumptions)})

    @classmethod
    def from_json(cls, line: str) -> Claim:
        d = json.loads(line)
        return cls(d["name"], d["value"], d["unit"], d["page"],
                   tuple(sorted(d["assumptions"].items())), d["guard"], d.get("shown", ""))


@dataclasses.dataclass(frozen=True)
class ShownTable:
    """A table a page recorded: its header and the text of every cell, as shown."""

    page: str
    name: str
    columns: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]


def load_tables(directory: str | os.PathLike) -> list[ShownTable]:
    """Every table recorded in a ledger directory (the build's ``*.tables.ndjson``)."""
    out = []
    for path in sorted(Path(directory).glob(f"*{TABLES_SUFFIX}")):
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out.append(ShownTable(d["page"], d["name"], tuple(d["columns"]),
                                      tuple(tuple(r) for r in d["cells"])))
    return out


@dataclasses.dataclass(frozen=True)
class Contradiction:
    """Two records of one claim that disagree."""

    first: Claim
    second: Claim

    def __str__(self) -> str:
        a, b = self.first, self.second
        what = ("values" if (a.unit, a.assumptions) == (b.unit, b.assumptions)
                else "assumptions or units")
        return (f"claim {a.name!r}: {what} differ: page {a.page!r} says {a.value!r} {a.unit} "
                f"{dict(a.assumptions)}, page {b.page!r} says {b.value!r} {b.unit} "
                f"{dict(b.assumptions)}")


def check_assumptions(assumptions: Mapping[str, Any], where: str) -> None:
    """Refuse a keyword that is not an assumption of :data:`ASSUMPTIONS` (a typo of an option,
    or a new assumption not yet named there), naming the closest option or assumption."""
    unknown = sorted(set(assumptions) - ASSUMPTIONS)
    if unknown:
        options = ["fmt", "shown", "guard", "unit", "formats", "title", "record", "name", "keys"]
        hints = []
        for u in unknown:
            close = difflib.get_close_matches(u, [*options, *sorted(ASSUMPTIONS)], n=2)
            hints.append(f"{u!r} (did you mean {' or '.join(map(repr, close))}?)" if close
                         else repr(u))
        raise TypeError(f"{where}: unknown keyword {', '.join(hints)}: not an option and not an "
                        "assumption of guide.claims.ASSUMPTIONS (add a new kind of assumption "
                        "there).")


def shown_text(value: float | int | str, fmt: str | None = None) -> str:
    """How a value reads on a page: ``format(value, fmt)``, else the number as recorded with
    thousands separators (``1,356.7``, ``217,728``): pages record numbers rounded as they print
    them, or give ``fmt``/``shown``."""
    if isinstance(value, str):
        return value
    if fmt is not None:
        return format(value, fmt)
    return f"{value:,}"


def _rounded(value: float, text: str) -> float:
    """``value`` as the number ``text`` shows (``"24.7%"`` -> 0.247, ``"1,314.2"`` -> 1314.2,
    ``"8"`` -> 8, an int)."""
    t = text.replace(",", "").replace("−", "-").strip()
    if t.endswith("%"):
        return float(t[:-1]) / 100
    try:
        return int(t) if re.fullmatch(r"-?\d+", t) else float(t)
    except ValueError:
        return value


class Ledger:
    """The claims of one page: ``ledger = claims.Ledger("plot_memory", model="TinyLM")``.

    Keyword arguments (and :meth:`assume`) are assumptions every claim of the page shares;
    :meth:`scope` adds more for a block. A docs build replaces the page's previous records.
    """

    def __init__(self, page: str, **assumptions: Any) -> None:
        if not _PAGE.match(page):
            raise ValueError(f"page {page!r}: use the page's file name without extension, e.g. "
                             "'plot_ddp_vs_fsdp2' or 'pages/memory_calculator'.")
        check_assumptions(assumptions, f"Ledger({page!r})")
        self.page = page
        self.records: list[Claim] = []
        self.tables: list[ShownTable] = []
        self._scopes: list[dict[str, Any]] = [dict(assumptions)]
        directory = os.environ.get(LEDGER_ENV)
        stem = page.replace("/", "__")
        self.path = Path(directory) / f"{stem}.jsonl" if directory else None
        self.tables_path = Path(directory) / f"{stem}{TABLES_SUFFIX}" if directory else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self.tables_path.unlink(missing_ok=True)  # written with the page's first table

    def add_table(self, name: str, columns: Sequence[str],
                  cells: Sequence[Sequence[str]]) -> None:
        """Note that this page shows table ``name`` (its header and every cell's text): after the
        build, :mod:`guide.rendered_tables` fails it if the rendered page lacks the table.
        :func:`guide.report.table` calls it for every table it records."""
        if any(t.name == name for t in self.tables):
            raise ValueError(f"table {name!r}: this page already recorded a table of that name.")
        table = ShownTable(self.page, name, tuple(map(str, columns)),
                           tuple(tuple(map(str, row)) for row in cells))
        self.tables.append(table)
        if self.tables_path is not None:
            with self.tables_path.open("a") as f:
                f.write(json.dumps(dataclasses.asdict(table), ensure_ascii=False) + "\n")

    def assume(self, **assumptions: Any) -> None:
        """From here on, every claim of the page also depends on ``assumptions`` (as if given to
        the constructor). A page assumes a thing once: another value for a name is refused."""
        check_assumptions(assumptions, "assume")
        changed = sorted(k for k, v in assumptions.items() if self._scopes[0].get(k, v) != v)
        if changed:
            raise ValueError(f"assume: {changed} already assumed with other values; use "
                             "scope(...) for a part of the page.")
        self._scopes[0].update(assumptions)

    @contextlib.contextmanager
    def scope(self, **assumptions: Any) -> Iterator[Ledger]:
        """Within ``with ledger.scope(steps=20):`` every claim also depends on ``steps=20``."""
        check_assumptions(assumptions, "scope")
        self._scopes.append(dict(assumptions))
        try:
            yield self
        finally:
            self._scopes.pop()

    def claim(self, name: str, value: Any, unit: str, *, guard: str = "computed",
              fmt: str | None = None, shown: str | None = None, **assumptions: Any) -> Any:
        """Record that this page states ``value`` (in ``unit``) under ``name``; return it.

        ``guard`` is ``"computed"`` (the default) or ``"cited: <source>"``; an ``asserted`` or
        ``ordered`` guard comes only from a check (:meth:`record`). ``fmt`` is how the page shows
        the number (``",.1f"``, ``".1%"``), or ``shown`` the text itself: the ledger keeps that
        text, and the value returned and recorded is the number it shows (so a page prints what
        it recorded, and the ledger page states it the same way).
        ``assumptions`` add to the page's and the scope's (``buckets=True``, ``world_size=8``...).
        A name this page already stated with another value raises at once.
        """
        if guard.startswith(CHECKED_KINDS):
            raise ValueError(
                f"claim {name!r}: guard {guard!r} is typed. An asserted or ordered guard comes "
                "from the check that ran: `ledger.record(name, checks.expect_close(...))` (or "
                "the value another guide.checks check returned); if no check compares the number "
                "with an independent value, record it as computed.")
        return self._add(name, value, unit, guard, fmt, shown, assumptions)

    def record(self, name: str, checked: Checked, unit: str | None = None, *,
               fmt: str | None = None, shown: str | None = None, **assumptions: Any) -> float:
        """Record a value a check returned (:class:`guide.checked.Checked`); return it as shown.

        The guard is the check's (``checked.guard()``): ``asserted: <check> (...)`` for a bound or
        a match, ``ordered: a < b`` for an ordering. ``unit`` defaults to the check's. A match
        whose allowance reaches 0 or the opposite sign is refused: tighten the check, or record
        the number as computed. ``fmt``, ``shown`` and ``assumptions`` as in :meth:`claim`.
        """
        if not isinstance(checked, Checked):
            raise TypeError(f"record {name!r}: got {type(checked).__name__} {checked!r}, not the "
                            "value a guide.checks check returned; use ledger.claim(...) for a "
                            "computed or cited number.")
        if checked.reaches_zero():
            raise ValueError(
                f"record {name!r}: {float(checked):.4g} ± {checked.allowance():.2g} "
                f"({checked.check}) allows 0 or the opposite sign, so the check proves no value: "
                "tighten the allowance, or record the number with ledger.claim (computed).")
        unit = checked.unit if unit is None else unit
        return self._add(name, float(checked), unit, checked.guard(), fmt, shown, assumptions)

    def _add(self, name: str, value: Any, unit: str, guard: str, fmt: str | None,
             shown: str | None, assumptions: Mapping[str, Any]) -> Any:
        if not _NAME.match(name):
            raise ValueError(f"claim name {name!r}: lower case, digits and . _ - / only.")
        if not _GUARD.match(guard):
            raise ValueError(f"claim {name!r}: guard {guard!r} must be 'computed' or "
                             "'cited: <source>' (asserted/ordered come from ledger.record).")
        if isinstance(value, Checked):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"claim {name!r}: value must be a number or a string, got {value!r}.")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"claim {name!r}: value {value} is not finite.")
        if shown is None and fmt is not None and not isinstance(value, str):
            shown = shown_text(value, fmt)
        if shown and not isinstance(value, str):
            value = _rounded(value, shown)
        check_assumptions(assumptions, f"claim {name!r}")
        merged: dict[str, Any] = {}
        for scope in self._scopes:
            merged.update(scope)
        merged.update(assumptions)
        record = Claim(name, value, unit, self.page,
                       tuple(sorted((k, str(v)) for k, v in merged.items())), guard,
                       shown or "")
        raise_on_contradictions([*self.records, record])
        if not any(r.name == name for r in self.records):
            self.records.append(record)
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(record.to_json() + "\n")
        return value


def load(directory: str | os.PathLike) -> list[Claim]:
    """Every record in a ledger directory."""
    out = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        out += [Claim.from_json(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def contradictions(records: Iterable[Claim]) -> list[Contradiction]:
    """Pairs of records of one name that disagree (value, unit or assumptions)."""
    first: dict[str, Claim] = {}
    found = []
    for record in records:
        seen = first.setdefault(record.name, record)
        if seen is not record and not seen.same_as(record):
            found.append(Contradiction(seen, record))
    return found


def raise_on_contradictions(records: Iterable[Claim]) -> None:
    """Raise ``AssertionError`` listing every contradiction among ``records``."""
    found = contradictions(records)
    if found:
        raise AssertionError("[ledger] the site contradicts itself:\n" +
                             "\n".join(f"- {c}" for c in found))


def missing_pages(records: Iterable[Claim], pages: Iterable[str]) -> list[str]:
    """The pages among ``pages`` that have no record in ``records``, in the order given.

    Every page of the gallery states numbers, so a page without a record means the ledger is
    incomplete: the page did not run in this build (sphinx-gallery reuses an unchanged example's
    output without running it, so its records are gone if the ledger directory was deleted), or it
    states its numbers without recording them.
    """
    recorded = {r.page for r in records}
    return [page for page in pages if page not in recorded]


def by_name(records: Iterable[Claim]) -> Mapping[str, list[Claim]]:
    """Records grouped by claim name, in name order."""
    out: dict[str, list[Claim]] = {}
    for r in sorted(records, key=lambda r: (r.name, r.page)):
        out.setdefault(r.name, []).append(r)
    return out
