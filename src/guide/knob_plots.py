"""The charts of the FSDP2-knobs pages (mixed precision, ``reshard_after_forward``, gradient
accumulation, clipping): one message per chart, in the site's style (:func:`guide.plotting.style`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from guide.plotting import COLORS, FLOOR, style

__all__ = ["gap_vs_bound"]

_CYCLE = ("#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def gap_vs_bound(gaps: Mapping[str, Sequence[float]],
                 bounds: Mapping[str, Sequence[float]]) -> plt.Figure:
    """``|loss - fp32 reference|`` per step for each low-precision run (solid, log scale), with that
    run's allowed gap (dashed, same colour). Zeros are drawn at :data:`guide.plotting.FLOOR`."""
    if set(gaps) != set(bounds) or not gaps:
        raise ValueError("gap_vs_bound needs one bound sequence per run, for at least one run.")
    style()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for color, (name, gap) in zip(_CYCLE, gaps.items()):
        steps = range(len(gap))
        ax.plot(steps, [max(g, FLOOR) for g in gap], "o-", color=color, ms=4, lw=1.4,
                label=f"{name}: |gap|")
        ax.plot(steps, bounds[name], "--", color=color, lw=1.2, alpha=0.8,
                label=f"{name}: bound u·L")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("|loss − fp32 loss| (nats/token)")
    ax.set_title("bf16 compute stays far inside one bf16 rounding of the loss")
    ax.legend(loc="lower right", fontsize=9, ncols=2)
    ax.axhline(FLOOR, color=COLORS["reference"], lw=0.6, ls=":")
    return fig
