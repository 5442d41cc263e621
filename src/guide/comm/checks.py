"""Communication checks: measured collectives and wire bytes against :mod:`guide.comm.expected`.

Re-exported by :mod:`guide.checks` (one place to import every check from).
"""

from __future__ import annotations

from collections.abc import Sequence

from guide.checked import CheckFailed, Checked
from guide.comm.expected import Collective, summarize

__all__ = ["ELEMENT_TOL", "WIRE_TOL", "check_volume", "check_wire"]

# -- communication: measured collectives against guide.comm.expected ---------------------------------

#: How far measured element counts may sit from the communication model (relative) before a page
#: fails (the communication example prints each run's gap).
ELEMENT_TOL = 0.02

#: How far a rank's measured wire bytes (``wchar``) may sit from the gloo model (relative): the gap
#: is gloo's message headers; the communication example prints both for every run.
WIRE_TOL = 0.02


def check_volume(run: str, measured: Sequence[Collective], expected: Sequence[Collective],
                 steps: int, tol: float = ELEMENT_TOL,
                 exact_calls: Sequence[str] = ("all_gather", "reduce_scatter", "broadcast"),
                 ) -> dict[tuple[str, str], tuple[float, int, float]]:
    """Compare ``measured`` (all records of ``steps`` steps, :class:`guide.comm.CollectiveLog`) with
    one step of ``expected`` (:mod:`guide.comm.expected`).

    For each ``(kind, dtype)`` the measured elements per step must sit within ``tol`` (relative) of
    the model, and for the kinds in ``exact_calls`` the calls per step must match exactly (DDP's
    all-reduce is left out by default: how many buckets it uses is DDP's choice). Raises
    :class:`CheckFailed` naming the run, kind and dtype; returns
    ``{(kind, dtype): (measured elements/step as Checked, model elements/step, relative gap)}``.
    """
    got, want = summarize(measured, steps), summarize(expected)
    if set(got) != set(want):
        raise CheckFailed(
            f"[comm volume] {run}: issued {sorted(got)} (kind, dtype) per step, the model says "
            f"{sorted(want)}.")
    out = {}
    for key, row in want.items():
        m, e = got[key]["numel"], row["numel"]
        gap = abs(m - e) / e if e else float(m != 0)
        if not gap <= tol:
            raise CheckFailed(
                f"[comm volume] {run}: {key[0]} in {key[1]} moved {m:,.0f} elements per step, the "
                f"model says {e:,} (gap {gap:.2%} > {tol:.0%}).")
        if key[0] in exact_calls and got[key]["calls"] != row["calls"]:
            raise CheckFailed(
                f"[comm calls] {run}: {got[key]['calls']:g} {key[0]} calls in {key[1]} per step, "
                f"the model says {row['calls']}.")
        out[key] = (Checked(m, check="comm volume", run=run, unit="elements/step", relation="≈",
                            tol=tol, rel=True, reference=e, against="guide.comm.expected"), e, gap)
    return out


def check_wire(run: str, wire_bytes_per_rank: Sequence[int | None], expected_per_rank: float,
               steps: int, tol: float = WIRE_TOL) -> list[float]:
    """Each rank's measured wire bytes per step must sit within ``tol`` of ``expected_per_rank``
    (e.g. the sum of :func:`guide.comm.gloo_bytes` over one step's model). Raises
    :class:`CheckFailed` naming the run and rank; returns the bytes per step per rank
    (:class:`Checked` against the model)."""
    if any(w is None for w in wire_bytes_per_rank):
        raise CheckFailed(f"[comm wire] {run}: /proc/self/io is not readable here; no wire bytes.")
    per_step = [w / steps for w in wire_bytes_per_rank]
    for rank, w in enumerate(per_step):
        gap = abs(w - expected_per_rank) / expected_per_rank
        if not gap <= tol:
            raise CheckFailed(
                f"[comm wire] {run}: rank {rank} wrote {w:,.0f} B per step, the gloo model says "
                f"{expected_per_rank:,.0f} B (gap {gap:.2%} > {tol:.0%}).")
    return [Checked(w, check="comm wire", run=run, unit="B/step", relation="≈", tol=tol, rel=True,
                    reference=expected_per_rank, against="the gloo model") for w in per_step]
