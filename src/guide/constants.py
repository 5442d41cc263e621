"""Cited constants: the only numbers on the site that no code of the site computes.

Hardware specifications, paper figures and published measurements enter the site here, each with
its source, and nowhere else: a page that needs one reads it from :data:`CONSTANTS` (and records
it in its ledger with :func:`cite`), so the "Every number on this site" page lists every constant
with its source in one table. A module may keep a named alias (``NVLINK = CONSTANTS[...].value``)
but not a second literal.
"""

from __future__ import annotations

import dataclasses

from guide.claims import Ledger

__all__ = ["CONSTANTS", "Constant", "cite", "value"]


@dataclasses.dataclass(frozen=True)
class Constant:
    """A number from outside the site: its value, unit and where it comes from."""

    name: str
    value: float | int
    unit: str
    source: str


_ALL = (
    Constant("h100.memory_total", 81_559, "MiB",
             "nvidia-smi on an H100 80GB HBM3 (total, not usable: the CUDA context takes part)"),
    Constant("h200.memory_total", 143_771, "MiB",
             "nvidia-smi on an H200 141GB HBM3e (total, not usable)"),
)

#: Every cited constant, by name.
CONSTANTS: dict[str, Constant] = {c.name: c for c in _ALL}


def value(name: str) -> float | int:
    """The value of the cited constant ``name`` (a clear error for an unknown name)."""
    try:
        return CONSTANTS[name].value
    except KeyError:
        raise KeyError(f"no cited constant {name!r}; known: {sorted(CONSTANTS)}. Add it to "
                       "guide.constants with its source.") from None


def cite(ledger: Ledger, name: str) -> float | int:
    """Record in ``ledger`` that its page states the constant ``name``; return its value."""
    c = CONSTANTS.get(name)
    if c is None:
        value(name)  # raises the clear error
    return ledger.claim(f"constant.{c.name}", c.value, c.unit, guard=f"cited: {c.source}")
