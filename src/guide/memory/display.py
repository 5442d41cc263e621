"""How the calculator writes numbers and assumptions, the same in the command and the widget.

One rounding rule: a byte count in a unit (KiB, MiB, GiB, TiB) is rounded to two decimals
**half to even**, exactly (integer arithmetic on the bytes, no float): 2.125 GiB reads 2.12 and
2.375 GiB reads 2.38, whatever a float would have landed on. ``docs/_static/memory_widget.js``
ports :func:`fixed`, :func:`format_bytes`, :func:`smallest_text` and :func:`assumptions` line by
line (BigInt there), and the tests compare both sides on ties.
"""

from __future__ import annotations

__all__ = ["UNITS", "assumptions", "fixed", "format_bytes", "smallest_text"]

#: Binary units, by name: what ``--unit`` accepts besides ``auto``.
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def fixed(n: int, scale: int, digits: int = 2) -> str:
    """``n / scale`` with ``digits`` decimals and thousands separators, rounded half to even on
    the exact quotient: ``fixed(9, 4, 1) == "2.2"``, ``fixed(11, 4, 1) == "2.8"``."""
    sign, n = ("-" if n < 0 else ""), abs(n)
    q, r = divmod(n * 10**digits, scale)
    if 2 * r > scale or (2 * r == scale and q % 2):
        q += 1
    whole, frac = divmod(q, 10**digits)
    if q == 0:
        sign = ""
    return f"{sign}{whole:,}" + (f".{frac:0{digits}d}" if digits else "")


def format_bytes(n: int, unit: str = "auto") -> str:
    """``n`` bytes for a person: ``"512 B"``, ``"850.50 KiB"``, ``"1.23 GiB"``.

    ``unit="auto"`` picks the largest unit in which the value is at least 1, so a 217,728-parameter
    model reads in KiB and MiB, not as ``0.00`` GiB; a named unit (a key of :data:`UNITS`) prints
    the number alone, for columns that share one unit. Two decimals, half to even (:func:`fixed`).
    """
    if unit == "auto":
        unit = next((u for u in reversed(UNITS) if abs(n) >= UNITS[u]), "B")
        return f"{n:,} B" if unit == "B" else f"{fixed(n, UNITS[unit])} {unit}"
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; choose auto or one of {', '.join(UNITS)}.")
    return f"{n:,}" if unit == "B" else fixed(n, UNITS[unit])


def smallest_text(n: int | None, largest: int) -> str:
    """The smallest fitting N as written: ``"16"``, or ``"no N ≤ 4,096 GPUs"`` when the search
    up to ``largest`` found none."""
    return f"no N ≤ {largest:,} GPUs" if n is None else f"{n:,}"


def assumptions(model: str, n_params: int, precision: tuple[str, str], optimizer: str,
                activations: dict | None) -> str:
    """The line above every answer: the model, its parameters, the precision (``(label, key)``),
    the optimizer's label and, when priced, what the activations assume (``seq_len``,
    ``micro_batch``, ``attention``, ``checkpointing``)."""
    line = f"{model}: {n_params:,} parameters; {precision[0]} ({precision[1]}), {optimizer}"
    if activations is not None:
        line += (f"; activations of {activations['micro_batch']:,} x "
                 f"{activations['seq_len']:,} tokens, {activations['attention']} attention, "
                 f"{activations['checkpointing']} checkpointing (estimate)")
    return line
