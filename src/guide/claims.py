"""The ledger of claims: every number a page states, recorded with what it depends on.

A page states a number (in prose, a table or a figure title) through :meth:`Ledger.claim`, which
returns the value so the page prints what it recorded. Each record carries a stable name, the value,
its unit, the assumptions it depends on (model, precision, optimizer, DDP buckets counted or not,
N, sequence length, hardware) and how it is guarded: ``"asserted: <check>"`` (a build check fails if
it is wrong), ``"computed"`` (the shipped code computed it, nothing compares it to an independent
value) or ``"cited: <source>"`` (a constant from a paper, a datasheet, a release).

During the docs build (``GUIDE_LEDGER_DIR`` set by ``docs/conf.py``) each page's records go to one
JSON-lines file in that directory, rewritten whenever the page runs. :func:`contradictions` reads all
pages' records: two records of one name with different values or assumptions are a contradiction,
and the build fails naming both pages. Outside the build (``python example.py``, a notebook)
records stay in memory: the page still checks itself for contradictions, nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Claim", "Contradiction", "Ledger", "LEDGER_ENV", "by_name", "contradictions", "load",
           "missing_pages", "raise_on_contradictions"]

#: The environment variable naming the directory the build's ledger is written to.
LEDGER_ENV = "GUIDE_LEDGER_DIR"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-/]*$")
_PAGE = re.compile(r"^[a-z0-9][a-z0-9_\-/]*$")
_GUARD = re.compile(r"^(asserted: .+|computed|cited: .+)$")
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
                   tuple(sorted(d["assumptions"].items())), d["guard"])


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


class Ledger:
    """The claims of one page. Create one per page: ``ledger = claims.Ledger("plot_memory")``.

    In the docs build the page's previous records are replaced by this run's.
    """

    def __init__(self, page: str) -> None:
        if not _PAGE.match(page):
            raise ValueError(f"page {page!r}: use the page's file name without extension, e.g. "
                             "'plot_ddp_vs_fsdp2' or 'pages/memory_calculator'.")
        self.page = page
        self.records: list[Claim] = []
        directory = os.environ.get(LEDGER_ENV)
        self.path = Path(directory) / (page.replace("/", "__") + ".jsonl") if directory else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def claim(self, name: str, value: Any, unit: str, *, guard: str = "computed",
              **assumptions: Any) -> Any:
        """Record that this page states ``value`` (in ``unit``) under ``name``; return ``value``.

        ``guard`` says how a wrong value would be caught (see the module docstring);
        ``assumptions`` are what the number depends on (``model="Llama-3-70B"``, ``buckets=True``,
        ``world_size=8``...). A name this page already stated with another value raises at once.
        """
        if not _NAME.match(name):
            raise ValueError(f"claim name {name!r}: lower case, digits and . _ - / only.")
        if not _GUARD.match(guard):
            raise ValueError(f"claim {name!r}: guard {guard!r} must be 'asserted: <check>', "
                             "'computed' or 'cited: <source>'.")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"claim {name!r}: value must be a number or a string, got {value!r}.")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"claim {name!r}: value {value} is not finite.")
        record = Claim(name, value, unit, self.page,
                       tuple(sorted((k, str(v)) for k, v in assumptions.items())), guard)
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
