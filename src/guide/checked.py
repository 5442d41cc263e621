"""What a check checked: the value it passed, carrying the check that passed it.

Every check of :mod:`guide.checks` that compares numbers returns a :class:`Checked`: a ``float``
(so a page computes with it as before) that also says which check ran, on which run, against which
independent value and with which allowance. :meth:`guide.claims.Ledger.record` takes its guard from
it, so an ``asserted`` guard in the ledger always names a check that ran; it cannot be typed.

Three relations, one per way a number can be checked:

* ``"≤"`` / ``"≥"`` (a bound): ``value`` (a gap, an error) is at most (at least) ``tol``; the
  guard reads ``bounded: loss equivalence (|Δ| 2.1e-07 ≤ 1e-05 vs the single-process
  reference)``. A bound holds a value to one side; it is not counted as asserted.
* ``"≈"`` (a match): ``value`` sits within ``tol`` of ``reference``, an independent value (a
  formula, torch's own instrument, a single-process run). Recording it as asserted is refused when the
  allowance reaches 0 or the opposite sign (``0.28 ± 0.31``): the check would pass a zero.
* ``"<"`` / ``"≤ ordered"`` (an ordering): ``value`` is below ``reference``; the ledger records
  ``ordered: a < b``, never ``asserted``, because an ordering says nothing of either value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["CheckFailed", "Checked", "Derived", "Tautology", "derived", "ratio", "refuse_derived",
           "refuse_self_comparison"]


class CheckFailed(AssertionError):
    """A claim of the site did not hold. The message names the check."""


class Tautology(ValueError):
    """A check compared a value with itself (or with a reference derived from it)."""


class Derived(float):
    """A reference computed from the very value it is compared with (see :func:`derived`)."""


def derived(value: float) -> Derived:
    """Flag ``value`` as derived from the quantity a check compares it with.

    A check given a :class:`Derived` reference refuses to run (:class:`Tautology`): comparing a
    product with the same product of the same constants proves nothing. Record such a number with
    ``ledger.claim(..., guard="computed")`` instead, or compare it with an independent value.
    """
    return Derived(value)


def refuse_derived(check: str, run: str, got: object, want: object) -> None:
    """Raise :class:`Tautology` if ``want`` is ``got`` itself or flagged :func:`derived` (alone
    or inside a sequence): the reference of a check must be independent of what it checks."""
    same = got is want and not isinstance(got, int)  # small ints are one object in CPython
    if same or isinstance(want, Derived) or (
            isinstance(want, Sequence) and any(isinstance(w, Derived) for w in want)):
        raise Tautology(f"[{check}] {run}: the reference is the checked value itself (the same "
                        "object, or flagged guide.checked.derived): such a check proves nothing. "
                        "Compare with an independent value (a formula from other inputs, torch's "
                        "own instrument, a reference run), or record the number as computed.")


def refuse_self_comparison(check: str, run: str, against: str, same_object: bool) -> None:
    """A run compared with itself proves nothing: the same object, or a reference named as the
    run itself, raises :class:`Tautology` (before anything is recorded as asserted)."""
    if not isinstance(against, str) or not against.strip():
        raise ValueError(f"[{check}] {run}: name the reference in against=... (e.g. "
                         f"checks.SINGLE_PROCESS, 'the uninterrupted run'); the guard prints it.")
    if same_object or " ".join(against.split()).lower() == " ".join(run.split()).lower():
        how = "the same object" if same_object else "the reference is named as the run"
        raise Tautology(f"[{check}] {run}: compared with itself ({how}): such a check proves "
                        "nothing. Compare with an independent run (e.g. one process on the full "
                        "batch), or show the value without a check.")


def ratio(check: str, numerator: float, denominator: float, *, of: str, over: str) -> float:
    """``numerator / denominator``: the quantity of run ``of`` over the same quantity of run ``over``,
    refused (:class:`Tautology`) when both are one run: the same name (DDP's bytes over DDP's
    bytes) or the same object. Such a ratio is 1 by construction and a check of it against a
    predicted 1 proves nothing; show that row as the reference instead. A zero denominator is a
    :class:`CheckFailed` naming both runs."""
    if not (isinstance(of, str) and of.strip() and isinstance(over, str) and over.strip()):
        raise ValueError(f"[{check}] ratio: name both runs (of=..., over=...).")
    same_name = " ".join(of.split()).lower() == " ".join(over.split()).lower()
    if same_name or (numerator is denominator and not isinstance(numerator, int)):
        raise Tautology(f"[{check}] {of} over {over}: a ratio of a quantity by itself is 1 by "
                        "construction; show that row as the reference, not as a checked ratio.")
    if denominator == 0:
        raise CheckFailed(f"[{check}] {of} over {over}: the denominator is 0.")
    return numerator / denominator


_RELATIONS = ("≤", "≥", "≈", "<", "<=", ">", ">=")


class Checked(float):
    """A number a check passed. Behaves as the float ``value``; immutable.

    Only the checks of :mod:`guide.checks` (and its helpers) build one: a page that constructed
    its own would be typing "asserted" by another name.

    Attributes: ``check`` (the check's name, e.g. ``"loss equivalence"``), ``run`` (what ran),
    ``unit``, ``relation`` (``"≤"``/``"≥"`` a bound, ``"≈"`` a match, ``"<"``/``"<="``/``">"``/
    ``">="`` an ordering), ``tol`` (the allowance:
    absolute, or relative to ``reference`` if ``rel``), ``reference`` (the independent value, or
    ``None`` for a bound), ``against`` (what the reference is, in words), ``value_name`` and
    ``reference_name`` (for orderings).
    """

    __slots__ = ("check", "run", "unit", "relation", "tol", "rel", "reference", "against",
                 "value_name", "reference_name")

    def __new__(cls, value: float, *, check: str, run: str = "", unit: str = "",
                relation: str = "≤", tol: float | None = None, rel: bool = False,
                reference: float | None = None, against: str = "",
                value_name: str = "", reference_name: str = "") -> Checked:
        if relation not in _RELATIONS:
            raise ValueError(f"Checked: relation {relation!r} is one of {_RELATIONS}.")
        self = super().__new__(cls, value)
        for k, v in dict(check=check, run=run, unit=unit, relation=relation, tol=tol, rel=rel,
                         reference=reference, against=against, value_name=value_name,
                         reference_name=reference_name).items():
            object.__setattr__(self, k, v)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Checked is immutable: {name!r} cannot be set.")

    def __reduce__(self):  # pickles across guide.launch's process boundary
        return (_rebuild, (float(self), {k: getattr(self, k) for k in self.__slots__}))

    @property
    def value(self) -> float:
        return float(self)

    @property
    def kind(self) -> str:
        """``"asserted"`` (a match with an independent reference), ``"bounded"`` (a value at most,
        or at least, an allowance: the check holds the value to a side, it does not pin it) or
        ``"ordered"``."""
        if self.relation in ("<", "<=", ">", ">="):
            return "ordered"
        return "asserted" if self.relation == "≈" else "bounded"

    def allowance(self) -> float | None:
        """The absolute allowance around ``reference`` (``None`` for a bound or an ordering)."""
        if self.relation != "≈" or self.tol is None or self.reference is None:
            return None
        return self.tol * abs(self.reference) if self.rel else self.tol

    def reaches_zero(self) -> bool:
        """Whether the allowance of a match contains 0 or the opposite sign (around the reference
        or around the value): such a check would pass a zero, so it proves no non-zero value."""
        a = self.allowance()
        if a is None:
            return False
        return any(abs(centre) <= a for centre in (self.reference, float(self)))

    def guard(self, fmt: str = ".4g") -> str:
        """The ledger guard this check earns, e.g. ``bounded: loss equivalence (|Δ| 2.1e-07 ≤
        1e-05 vs the single-process reference)`` or ``ordered: async save < blocking save``."""
        v = format(float(self), fmt)
        if self.kind == "ordered":
            a, b = self.value_name or "value", self.reference_name or "reference"
            return f"ordered: {a} {self.relation} {b} ({v} {self.relation} " \
                   f"{format(self.reference, fmt)})"
        against = f" vs {self.against}" if self.against else ""
        if self.relation == "≤":
            return f"bounded: {self.check} (|Δ| {v} ≤ {self.tol:.2g}{against})"
        if self.relation == "≥":
            return f"bounded: {self.check} ({v} ≥ {self.tol:.2g}{against})"
        tol = (f"{self.tol:.2g}" if not self.rel else f"{self.tol:.0%}" if self.tol >= 0.01
               else f"{self.tol:.1g} relative")
        return (f"asserted: {self.check} ({v} ≈ {format(self.reference, fmt)} ± {tol}"
                f"{against})")

    def scaled(self, factor: float, unit: str) -> Checked:
        """The same check in another unit (``checked.scaled(1 / 2**20, "MiB")``): value,
        reference and an absolute allowance scale together, so the check still holds."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"Checked.scaled: factor {factor} must be positive and finite.")
        attrs = {k: getattr(self, k) for k in self.__slots__}
        if self.reference is not None:
            attrs["reference"] = self.reference * factor
        if self.tol is not None and not self.rel and self.relation in ("≈", "≤", "≥"):
            attrs["tol"] = self.tol * factor
        attrs["unit"] = unit
        return Checked(float(self) * factor, **attrs)

    def __repr__(self) -> str:
        return f"Checked({float(self)!r}, {self.guard()!r})"


def _rebuild(value: float, attrs: dict) -> Checked:
    return Checked(value, **attrs)
