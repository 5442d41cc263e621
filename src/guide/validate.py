"""Argument checks shared by every module: one wording for one mistake.

A bad argument raises ``ValueError`` naming the argument, the value received and what was expected,
so the fix is in the message (``world_size must be a positive integer, got 0.``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["positive_int"]


def positive_int(name: str, value: Any, what: str = "") -> int:
    """``value`` if it is an ``int`` >= 1 (``bool`` is not an int here); else ``ValueError``.

    ``what`` says what the number counts (``"the number of ranks"``) and is added to the message.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} must be a positive integer{extra}, got {value!r}.")
    return value
