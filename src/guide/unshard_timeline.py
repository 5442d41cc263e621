"""When FSDP2 all-gathers each unit, read from torch's own profiler, and how many units it holds at once.

FSDP2 labels its work with ``record_function`` names that carry the unit's name:
``FSDP::all_gather (blocks.1)`` when it starts gathering a unit's parameters (from the unit's own
pre-forward, or from another unit's prefetch), ``FSDP::post_forward (blocks.1)`` when the unit's
forward has run (where it frees them, if it reshards after forward) and
``FSDP::post_backward_reshard (blocks.1)`` when its backward has run (where it frees them). The root
unit's names carry no parentheses. :class:`UnshardTimeline` records one step under
``torch.profiler`` (CPU activity only) and keeps those events, in the order they started.

:func:`max_gathered` replays that order: a unit is *gathered* from its all-gather until the event
that frees it: its post-forward if it reshards after forward, else its post-backward. The largest
number of units gathered at one moment is what prefetching changes: every prefetched unit's
all-gather output is memory held beside the unit that is computing.

On CPU nothing runs ahead of the computation, so the order here is the order the CPU issues the
all-gathers. On a GPU the CPU also issues them ahead of the kernels (FSDP2's implicit forward
prefetch); when they *complete*, and how much overlaps, only a GPU trace shows.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = ["ROOT", "UnshardEvent", "UnshardTimeline", "max_gathered", "order_text"]

#: The name given to the root unit (FSDP2's events name it by no module).
ROOT = "root"
_EVENT = re.compile(r"^FSDP::(all_gather|post_forward|post_backward_reshard)(?: \((?P<unit>[^)]+)\))?$")
_KIND = {"all_gather": "gather", "post_forward": "forward", "post_backward_reshard": "backward"}
_SHORT = {"gather": "AG", "forward": "F", "backward": "B"}


@dataclasses.dataclass(frozen=True)
class UnshardEvent:
    """One FSDP2 event: ``kind`` is ``"gather"`` (an all-gather starts), ``"forward"`` (the unit's
    forward has run) or ``"backward"`` (its backward has run); ``unit`` names the unit
    (``"blocks.1"``, or :data:`ROOT`)."""

    kind: str
    unit: str

    def __post_init__(self) -> None:
        if self.kind not in _SHORT:
            raise ValueError(f"UnshardEvent kind {self.kind!r}: use one of {sorted(_SHORT)}.")


class UnshardTimeline:
    """Record FSDP2's gathers and frees over the steps run inside ``with UnshardTimeline() as t:``;
    ``t.events`` lists them in the order they started (torch's profiler timestamps)."""

    def __init__(self) -> None:
        self.events: list[UnshardEvent] = []
        self._prof: torch.profiler.profile | None = None

    def __enter__(self) -> UnshardTimeline:
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._prof is not None
        self._prof.__exit__(*exc)
        found = []
        for e in self._prof.events():
            m = _EVENT.match(e.name)
            if m:
                found.append((e.time_range.start, _KIND[m.group(1)], m.group("unit") or ROOT))
        self.events = [UnshardEvent(kind, unit) for _, kind, unit in sorted(found)]
        self._prof = None


def max_gathered(events: Sequence[UnshardEvent], reshards_after_forward: Mapping[str, bool],
                 phase: str | None = None, sizes: Mapping[str, int] | None = None) -> int:
    """The most units gathered at one moment: a unit counts from its ``"gather"`` event until its
    next ``"forward"`` event if ``reshards_after_forward[unit]``, and until its next
    ``"backward"`` event either way.
    ``phase="forward"`` counts only up to the last forward event, ``"backward"`` only after it
    (units still held from the forward count there too). With ``sizes`` (bytes per unit) it
    returns the most bytes gathered at one moment instead. Every unit must be in
    ``reshards_after_forward`` (and in ``sizes``, if given)."""
    if phase not in (None, "forward", "backward"):
        raise ValueError(f"phase {phase!r}: use None, 'forward' or 'backward'.")
    weight = dict(sizes) if sizes is not None else {u: 1 for u in reshards_after_forward}
    unknown = sorted({e.unit for e in events} - (set(reshards_after_forward) & set(weight)))
    if unknown:
        raise ValueError(f"max_gathered: units {unknown} have no reshard_after_forward setting "
                         "(or no size); pass one for every unit, the root included.")
    last_forward = max((i for i, e in enumerate(events) if e.kind == "forward"), default=-1)
    held: set[str] = set()
    most = 0
    for i, e in enumerate(events):
        if e.kind == "gather":
            held.add(e.unit)
        elif e.kind == "backward" or reshards_after_forward[e.unit]:
            held.discard(e.unit)  # a forward frees it if it reshards; a backward always does
        counted = (phase is None or (phase == "forward") == (i <= last_forward))
        if counted:
            most = max(most, sum(weight[u] for u in held))
    return most


def order_text(events: Iterable[UnshardEvent], short: Mapping[str, str] | None = None) -> str:
    """The events as one line: ``AG root · AG b0 · F b0 · ...`` (``AG`` an all-gather starts, ``F``
    a unit's forward has run, ``B`` its backward); ``short`` renames units (``{"blocks.0": "b0"}``)."""
    names = dict(short or {})
    return " · ".join(f"{_SHORT[e.kind]} {names.get(e.unit, e.unit)}" for e in events)
