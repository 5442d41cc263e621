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

__all__ = ["FLOOR", "REFERENCE_COLOR", "STYLE", "gap_axis", "legend_below", "style",
           "tolerance_line"]

#: The single-process reference run, on every page (strategies: ``Strategy.color``).
REFERENCE_COLOR = "#222222"

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
    # A legend is read at phone width too (a 7.5 in figure shrinks to about 45 %): never smaller
    # than the tick labels; pages put it below the axes (legend_below) rather than over the data.
    "legend.fontsize": "medium",
    "figure.constrained_layout.use": True,
}

#: Where an exact zero is drawn on a log axis (and labelled "bitwise equal").
FLOOR = 1e-10


def style() -> None:
    """Apply the site's matplotlib style (called by every chart function)."""
    plt.rcParams.update(STYLE)


def gap_axis(ax: plt.Axes, gaps: Sequence[float], color: str, marker: str = "o",
             label: str | None = None) -> None:
    """Draw ``gaps`` (``|run - reference|`` per step) on a log axis; exact zeros sit on :data:`FLOOR`,
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


def legend_below(fig: plt.Figure, ncols: int = 2, **kwargs) -> None:
    """The figure's legend under its axes, in ``ncols`` columns at the site's font size: it covers
    no data and stays readable when a phone shrinks the figure. Needs constrained layout (the
    site's style turns it on)."""
    fig.legend(loc="outside lower center", ncols=ncols, **kwargs)


def tolerance_line(ax: plt.Axes, tol: float, text: str = "tolerance (build fails above)") -> None:
    """The tolerance the build asserts, as a dashed line on a gap axis."""
    ax.axhline(tol, color="black", lw=1, ls="--")
    ax.set_ylim(top=max(ax.get_ylim()[1], 10 * tol))
    ax.text(ax.get_xlim()[1], tol * 1.5, text, ha="right", fontsize=9)
