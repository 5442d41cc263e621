"""One figure style for the site: readable at thumbnail size, labelled axes with units, one message
per chart. Figures live in their pages; what several pages draw the same way lives here: the style,
the reference run's colour (strategies have theirs: :attr:`guide.sharding.Strategy.color`) and the
log-scale "gap to the reference" axis with its tolerance line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
    # Headless docs builds and `python example.py` on a server: draw to files, never to a window.
    import os

    if not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

__all__ = ["FLOOR", "REFERENCE_COLOR", "STYLE", "gap_axis", "style", "tolerance_line"]

#: The single-process reference run, on every page (strategies: ``Strategy.color``).
REFERENCE_COLOR = "#222222"
#: Deprecated: label-keyed colours, kept until the last page moves to ``Strategy.color``.
COLORS = {"reference": REFERENCE_COLOR, "DDP": "#1f77b4", "FSDP2": "#d62728", "ZeRO-1": "#2ca02c"}

STYLE = {
    "figure.dpi": 110,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "figure.constrained_layout.use": True,
}

#: Where an exact zero is drawn on a log axis (and labelled "bitwise equal").
FLOOR = 1e-10


def style() -> None:
    """Apply the site's matplotlib style (called by every chart function)."""
    plt.rcParams.update(STYLE)


def gap_axis(ax: plt.Axes, gaps: Sequence[float], color: str, marker: str = "o",
             label: str | None = None) -> None:
    """Draw ``gaps`` (|run - reference| per step) on a log axis; exact zeros sit on :data:`FLOOR`,
    marked "bitwise equal"."""
    ax.plot(range(len(gaps)), [max(g, FLOOR) for g in gaps], marker=marker, color=color, ms=4,
            lw=1, alpha=0.8, label=label)
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(FLOOR / 3, max(high, 1e-4))
    if not any(t.get_text() == "bitwise equal" for t in ax.texts):
        ax.axhline(FLOOR, color="grey", lw=0.8, ls=":")
        ax.text(0, FLOOR * 1.6, "bitwise equal", color="grey", fontsize=9)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def tolerance_line(ax: plt.Axes, tol: float, text: str = "tolerance (build fails above)") -> None:
    """The tolerance the build asserts, as a dashed line on a gap axis."""
    ax.axhline(tol, color="black", lw=1, ls="--")
    ax.set_ylim(top=max(ax.get_ylim()[1], 10 * tol))
    ax.text(ax.get_xlim()[1], tol * 1.5, text, ha="right", fontsize=9)


def loss_comparison(reference: Mapping[str, Sequence[float]],
                    runs: Mapping[str, Mapping[str, Sequence[float]]],
                    world_size: int, tol: float | None = None) -> plt.Figure:
    """Top row: loss per step for the reference and each distributed run, one column per optimizer.
    Bottom row: ``|loss - reference|`` on a log scale, zeros drawn at :data:`FLOOR`, and the
    tolerance the build asserts (``tol``) as a line."""
    style()
    cols = list(reference)
    fig, axes = plt.subplots(2, len(cols), figsize=(5.2 * len(cols), 6.4), sharex=True,
                             squeeze=False, height_ratios=[3, 2])
    for j, opt in enumerate(cols):
        top, bottom = axes[0, j], axes[1, j]
        steps = range(len(reference[opt]))
        top.plot(steps, reference[opt], color=COLORS["reference"], lw=4, alpha=0.35,
                 label="1 process, full batch")
        for k, (name, losses) in enumerate(runs[opt].items()):
            top.plot(steps, losses, color=COLORS[name], lw=1.6, ls=("-", "--")[k % 2],
                     label=f"{name}, {world_size} ranks")
            gaps = [max(abs(a - b), FLOOR) for a, b in zip(losses, reference[opt])]
            bottom.plot(steps, gaps, "o-" if k == 0 else "s--", color=COLORS[name], ms=4,
                        lw=1, label=name, alpha=0.8)
        top.set_title(f"{opt.upper() if opt == 'sgd' else 'AdamW'}")
        top.set_ylabel("training loss (nats/token)")
        top.legend(loc="upper right")
        bottom.set_yscale("log")
        bottom.set_ylim(FLOOR / 3, max(1e-4, 10 * (tol or 0)))
        if tol is not None:
            bottom.axhline(tol, color="black", lw=1, ls="--")
            bottom.text(len(reference[opt]) - 1, tol * 1.5, "tolerance (build fails above)",
                        ha="right", fontsize=9)
        bottom.axhline(FLOOR, color="grey", lw=0.8, ls=":")
        bottom.text(0, FLOOR * 1.6, "bitwise equal", color="grey", fontsize=9)
        bottom.set_ylabel("|loss − reference| (nats)")
        bottom.set_xlabel("training step")
        bottom.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        bottom.legend(loc="upper left", ncols=2)
    return fig
