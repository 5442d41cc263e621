"""The charts of the FSDP2-knobs pages (mixed precision, ``reshard_after_forward``, gradient
accumulation, clipping): one message per chart, in the site's style (:func:`guide.plotting.style`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from guide.plotting import COLORS, FLOOR, style

__all__ = ["accumulation_tradeoff", "clip_norms", "gap_vs_bound", "reshard_tradeoff"]

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
    ax.set_title("bf16 compute stays inside one bf16 rounding of the loss")
    ax.legend(loc="lower right", fontsize=9, ncols=2)
    smallest = min((g for gap in gaps.values() for g in gap if g > 0), default=FLOOR)
    ax.set_ylim(bottom=smallest / 3)
    return fig


def clip_norms(reference: Sequence[float], runs: Mapping[str, Sequence[float]],
               local: Mapping[str, Sequence[float]], max_norm: float) -> plt.Figure:
    """Gradient norm per step: the reference (thick grey), each distributed run's
    ``clip_grad_norm_`` result (dashed), the per-rank local-shard norms (thin, dotted) and
    ``max_norm`` (a horizontal line)."""
    style()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    steps = range(len(reference))
    ax.plot(steps, reference, color=COLORS["reference"], lw=5, alpha=0.3,
            label="1 process, unsharded gradient")
    for name, norms in runs.items():
        ax.plot(steps, norms, "--", color=COLORS.get(name.split()[0], _CYCLE[0]), lw=1.8,
                label=f"{name}: clip_grad_norm_")
    for color, (name, norms) in zip(_CYCLE[1:], local.items()):
        ax.plot(steps, norms, ":", marker=".", color=color, lw=1.2, label=name)
    ax.axhline(max_norm, color="grey", lw=1, ls="-.", label=f"max_norm = {max_norm:g}")
    ax.set_ylim(0, 1.5 * max(max(reference), max_norm))
    ax.set_xlabel("training step")
    ax.set_ylabel("gradient 2-norm (before clipping)")
    ax.set_title("clip_grad_norm_ on DTensors returns the global norm, not a shard's")
    ax.legend(loc="upper left", fontsize=9, ncols=2)
    return fig


def reshard_tradeoff(all_gathers: Mapping[str, Mapping[str, int]], kept_mib: Mapping[str, float],
                     peak_mib: Mapping[str, float], step_ms: Mapping[str, float],
                     world_size: int) -> plt.Figure:
    """Three panels over the ``reshard_after_forward`` settings: all-gathers per step (forward and
    backward stacked), memory per rank (kept after forward, step peak) and step time."""
    style()
    names = list(all_gathers)
    x = range(len(names))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(11, 3.8))
    fwd = [all_gathers[n]["forward"] for n in names]
    bwd = [all_gathers[n]["backward"] for n in names]
    ax1.bar(x, fwd, color=COLORS["FSDP2"], alpha=0.45, label="forward")
    ax1.bar(x, bwd, bottom=fwd, color=COLORS["FSDP2"], label="backward")
    ax1.set_ylabel("all-gathers per step")
    ax1.legend(loc="lower right")
    w = 0.38
    ax2.bar([i - w / 2 for i in x], [kept_mib[n] for n in names], w, color=COLORS["DDP"],
            label="kept after forward (beyond True)")
    ax2.bar([i + w / 2 for i in x], [peak_mib[n] for n in names], w, color=COLORS["DDP"],
            alpha=0.45, label="step peak (above pre-forward level)")
    ax2.set_ylabel("MiB per rank")
    ax2.legend(loc="upper left", fontsize=9)
    ax3.bar(x, [step_ms[n] for n in names], color="#7f7f7f")
    ax3.set_ylabel("step time (ms, median; noisy CPU)")
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(list(x), names, rotation=20)
        ax.set_xlabel("reshard_after_forward")
    fig.suptitle(f"Fewer all-gathers cost memory ({world_size} gloo ranks)")
    return fig


def accumulation_tradeoff(reductions: Mapping[str, int], held_mib: Mapping[str, float], k: int,
                          world_size: int) -> plt.Figure:
    """Two panels over the accumulation runs (names starting with ``DDP`` or ``FSDP2``; a name
    containing ``last``, a run that syncs on the last micro-batch only, is drawn solid): gradient
    reductions per optimizer step, and gradient memory held between micro-batches."""
    style()
    names = list(reductions)
    colors = [COLORS["DDP"] if n.startswith("DDP") else COLORS["FSDP2"] for n in names]
    alphas = [1.0 if "last" in n else 0.45 for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, values, xlabel in ((ax1, [reductions[n] for n in names],
                                "gradient reductions per optimizer step"),
                               (ax2, [held_mib[n] for n in names],
                                "gradient MiB held between micro-batches")):
        for i, (v, c, a) in enumerate(zip(values, colors, alphas)):
            ax.barh(i, v, color=c, alpha=a)
            ax.text(v, i, f" {v:.3g}", va="center", fontsize=9)
        ax.set_yticks(range(len(names)), names if ax is ax1 else [""] * len(names))
        ax.set_xlabel(xlabel)
        ax.invert_yaxis()
        ax.margins(x=0.2)
    fig.suptitle(f"Skipping the sync: {k}x fewer reductions; FSDP2 holds full gradients meanwhile "
                 f"({world_size} ranks)", fontsize=11)
    return fig
