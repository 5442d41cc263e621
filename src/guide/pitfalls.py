"""Checks that a pitfall still goes wrong, for the pitfalls page (``examples/plot_pitfalls.py``).

A page that reproduces a mistake on purpose must fail its build when a torch release fixes or
changes the mistake: otherwise it would go on showing a symptom nobody sees any more. Each check
here raises :class:`guide.checks.CheckFailed` tagged ``[pitfall reproduces]`` and naming the
section to update. The right ways are checked with :mod:`guide.checks` as on every page.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from guide import checks

__all__ = ["assert_differs", "assert_frozen", "assert_partial", "assert_reproduces", "caught",
           "torch_source_says"]


def assert_reproduces(pitfall: str, messages: Sequence[str], expected: str) -> str:
    """One of ``messages`` (errors or warnings torch gave) contains ``expected``; returns it."""
    hit = next((m for m in messages if expected in m), None)
    checks.expect("pitfall reproduces", pitfall, hit is not None,
                  f"torch {torch.__version__} no longer says {expected!r} (it said "
                  f"{list(messages)!r}); the pitfall changed: update this section of the page.")
    return hit


def assert_differs(pitfall: str, reference: Mapping[str, torch.Tensor],
                   got: Mapping[str, torch.Tensor], tol: float) -> float:
    """The wrong way's tensors are off: some entry differs from ``reference`` by more than ``tol``
    (NaN counts as off). Returns the worst gap."""
    gaps = [(got[k].double() - ref.double()).abs().max().item() for k, ref in reference.items()]
    worst = next((g for g in gaps if g != g), max(gaps))
    checks.expect("pitfall reproduces", pitfall, any(not g <= tol for g in gaps),
                  f"the wrong way now matches the right one (worst gap {worst:.1e} <= "
                  f"{tol:.0e}) on torch {torch.__version__}: update this section of the page.")
    return worst


def assert_frozen(pitfall: str, before: Mapping[str, torch.Tensor],
                  after: Mapping[str, torch.Tensor], losses: Sequence[float] | None,
                  warned: Sequence[str]) -> None:
    """Training silently did nothing: every parameter bitwise unchanged, the loss of the repeated
    batch the same every step, and no warning."""
    moved = max((after[k] - before[k]).abs().max().item() for k in before)
    frozen = moved == 0.0 and losses is not None and len(set(losses)) == 1
    checks.expect("pitfall reproduces", pitfall, frozen and not warned,
                  f"parameters moved by {moved:.1e}, losses {losses}, warnings {list(warned)} "
                  f"on torch {torch.__version__}: update this section of the page.")


def assert_partial(pitfall: str, local_per_rank: Sequence[float], full: float,
                   tol: float) -> None:
    """What a rank reads depends on the rank (some rank's local norm is not the norm), and the
    local norms are the norm's parts: the square root of the sum of their squares is the norm."""
    whole = math.sqrt(sum(x * x for x in local_per_rank))
    checks.expect("pitfall reproduces", pitfall,
                  any(not abs(x - full) <= tol for x in local_per_rank),
                  f"every rank's local norm {list(local_per_rank)} equals the full norm {full}: "
                  f"update this section of the page (torch {torch.__version__}).")
    checks.expect("partial norm", pitfall, abs(whole - full) <= tol,
                  f"sqrt(sum of local norms squared) = {whole} but the norm is {full}.")


def torch_source_says(text: str) -> bool:
    """Whether this torch's FSDP2 state (``_fsdp_state.py``) has ``text`` in its source. A check or
    warning that arrived in some release must then fire; an older torch (the 2.9 floor) is held
    to what it does instead."""
    from torch.distributed.fsdp._fully_shard import _fsdp_state
    return text in inspect.getsource(_fsdp_state)


def caught(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)``'s result (or ``None``) and every error and warning it raised, as text: the
    symptom is the point, so it is kept, not raised."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            result, errors = fn(*args), []
        except Exception as exc:  # noqa: BLE001 - any error is a symptom to show
            result, errors = None, [f"{type(exc).__name__}: {exc}"]
    return result, errors + [f"{w.category.__name__}: {w.message}" for w in record]
