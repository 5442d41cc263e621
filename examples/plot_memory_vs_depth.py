"""
Memory against depth: FSDP2 grows too, only slower
==================================================

An exercise in the seed notebook asks what happens to per-rank memory as the model gets deeper,
and answers that "FSDP2 should stay flat". It does not. FSDP2 shards every block, so each extra
block still adds its 1/N share of parameters, gradients and AdamW moments to every rank: per-rank
memory grows linearly with depth for both strategies. Per block, DDP's model state grows by five
times the block's parameter bytes, FSDP2's by four times them divided by N; the activations a block
keeps for backward come on top, the same for both. What FSDP2 adds that DDP does not, the one
block it gathers at a time, does not grow with depth at all.

This page measures it: the same model at three depths, DDP and FSDP2 at N = 2 and 4, each point in
fresh ranks. It fits a line per run, asserts the slopes against that model, and prints how much
more slowly FSDP2 grows, as measured in this build.
"""

# %%
# One point = one fresh job
# -------------------------
# Each point builds the model in fresh ranks, trains one AdamW step and reports the rank's peak
# resident memory during that step, measured from the rank's level *before* the model existed
# (:class:`guide.memory.PeakMemory`; ``prepare()`` makes freed memory leave the process), and
# what it holds afterwards (:func:`guide.memory.measure`: model state plus DDP's buckets).
# Fresh ranks per point, because an FSDP2 model is not freed by ``del model; gc.collect()`` in
# torch 2.13 (its parameter groups stay reachable), and a second model in the same process reuses
# what the first one freed: both distort the second measurement.
import math

import matplotlib.pyplot as plt
import numpy as np

import guide
from guide import checks, memory, sharding
from guide.data import synthetic_batches
from guide.memory import PeakMemory, current_bytes, prepare
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.report import table
from guide.sharding import Strategy
from guide.training import make_optimizer, train_steps

MiB = 2**20
DEPTHS = (2, 9, 16)  # evenly spaced: the middle point is where a bend would show
#: The world sizes: under torchrun, torchrun's WORLD_SIZE alone (and its points share processes).
NS = (guide.world_size(2),) if guide.under_torchrun() else (2, 4)
RUNS = [(s, n) for s in (Strategy.DDP, Strategy.FSDP2) for n in NS]
BATCHES = synthetic_batches(steps=1, batch_size=4, seq_len=16, vocab=128, seed=0)
#: The checks' tolerances: a line may miss a point by RESID_TOL of its rise (or RESID_FLOOR_MIB);
#: slopes that should agree may differ by SLOPE_TOL; FSDP2's per-block remainder beyond its model
#: state is at most REMAINDER_MAX blocks' parameter bytes; the measured growth ratio may differ from
#: the model's by RATIO_TOL.
RESID_TOL, RESID_FLOOR_MIB, SLOPE_TOL, REMAINDER_MAX, RATIO_TOL = 0.05, 0.5, 0.1, 0.6, 0.1


def config(n_layers: int) -> ModelConfig:
    return ModelConfig(vocab=128, d_model=128, n_layers=n_layers, n_heads=4, d_mlp=512)


def depth_worker(rank: guide.Rank, strategy: Strategy, n_layers: int) -> dict:
    prepare()
    start = current_bytes()
    model = sharding.wrap(build_model(config(n_layers), device=rank.device), strategy, rank)
    opt = make_optimizer("adamw", model.parameters())
    with PeakMemory(rank.device) as peak:
        train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
    return {"peak": peak.peak_level_bytes - start, "held": memory.measure(model, opt).total}


points = {(s, n): [guide.launch(depth_worker, n, s, depth) for depth in DEPTHS] for s, n in RUNS}
peak = {run: np.array([max(r["peak"] for r in pt) for pt in pts]) / MiB for run, pts in points.items()}
held = {run: np.array([max(r["held"] for r in pt) for pt in pts]) / MiB
        for run, pts in points.items()}

# %%
# What one block costs, on paper
# ------------------------------
# One block's fp32 parameters are ``b`` bytes. Per block and per rank, DDP holds parameters,
# gradients, two AdamW moments and its gradient bucket: 5 b. FSDP2 holds 1/N of the first four:
# 4 b / N, so its held state grows ``5 b / (4 b / N) = 1.25 N`` times more slowly.
# :func:`guide.memory.per_rank_state_bytes` (with DDP's buckets) predicts every point to the byte,
# and the measured state must equal it.
block = sum(math.prod(s) for s in memory.param_shapes(build_model(config(1)).blocks[0])) * 4
b = block / MiB
state_slope = {(s, n): 5 * b if s is Strategy.DDP else 4 * b / n for s, n in RUNS}  # MiB/block

for (s, n), pts in points.items():
    for depth, pt in zip(DEPTHS, pts):
        shapes = memory.param_shapes(build_model(config(depth)))
        predicted = memory.per_rank_state_bytes(shapes, s, n, "fp32", "adamw", ddp_buckets=True)
        checks.expect(max(r["held"] for r in pt) == predicted.total, "held-state prediction",
                      f"{s} x{n}, {depth} blocks", f"measured {max(r['held'] for r in pt):,} B, "
                      f"predicted {predicted.total:,} B")
print(f"one block: b = {b:.3f} MiB of fp32 parameters; the measured state equals the prediction "
      f"to the byte at all {len(RUNS) * len(DEPTHS)} points")

# %%
# Fitted slopes, and the checks that fail the build
# -------------------------------------------------
# A least-squares line per run (``numpy.polyfit``). The checks: every run is a straight line (the
# largest residual is under ``RESID_TOL`` of its rise, or ``RESID_FLOOR_MIB``); DDP's slope does not
# depend on N; FSDP2's held state grows 4 b / N per block; its peak grows by that plus a small
# per-block remainder that is not model state (activations kept for backward, autograd and Python
# bookkeeping; under ``REMAINDER_MAX * b``); and it is far from flat.
fits = {}
for run in RUNS:
    slope, intercept = np.polyfit(DEPTHS, peak[run], 1)
    resid = np.abs(peak[run] - np.polyval((slope, intercept), DEPTHS)).max()
    rise = peak[run][-1] - peak[run][0]
    checks.expect(bool(resid <= max(RESID_FLOOR_MIB, RESID_TOL * rise)), "linear in depth",
                  f"{run[0]} x{run[1]}",
                  f"a line misses a point by {resid:.2f} MiB (the peak rises {rise:.1f} MiB)")
    fits[run] = (slope, intercept, resid, np.polyfit(DEPTHS, held[run], 1)[0])

ddp = {n: fits[Strategy.DDP, n][0] for n in NS}
checks.expect(bool(max(ddp.values()) - min(ddp.values()) <= SLOPE_TOL * min(ddp.values())),
              "DDP independent of N", "DDP", f"slopes {ddp} MiB/block")
for n in NS:
    slope, _, _, held_slope = fits[Strategy.FSDP2, n]
    expected = state_slope[Strategy.FSDP2, n]
    extra = slope - expected
    checks.expect(bool(abs(held_slope - expected) <= SLOPE_TOL * expected), "FSDP2 state slope",
                  f"FSDP2 x{n}", f"held state grows {held_slope:.3f} MiB/block, 4b/N = {expected:.3f}")
    checks.expect(bool(-SLOPE_TOL * expected <= extra <= REMAINDER_MAX * b), "FSDP2 slope",
                  f"FSDP2 x{n}", f"peak grows {slope:.3f} MiB/block, {extra:+.3f} beyond 4b/N: not "
                  f"in [-{SLOPE_TOL:.0%} of it, +{REMAINDER_MAX} b]")
    checks.expect(bool(slope >= 0.5 * expected), "not flat", f"FSDP2 x{n}",
                  f"slope {slope:.3f} MiB/block")

print(table([(f"{s} x{n}", slope, hs, state_slope[s, n], intercept, resid)
             for (s, n), (slope, intercept, resid, hs) in fits.items()],
            ["run", "peak slope", "held slope", "5b or 4b/N", "intercept", "max residual"],
            formats={c: ".3f" for c in ("peak slope", "held slope", "5b or 4b/N", "max residual")}
            | {"intercept": ".1f"},
            title=f"measured, MiB per block (intercept: MiB); b = {b:.3f} MiB, tolerances: residual "
                  f"{RESID_TOL:.0%} of the rise or {RESID_FLOOR_MIB} MiB, slopes {SLOPE_TOL:.0%}, "
                  f"remainder {REMAINDER_MAX} b, ratio {RATIO_TOL:.0%}"))

# %%
# How much more slowly FSDP2 grows
# --------------------------------
# Not N times. In held state, DDP's 5 b against FSDP2's 4 b / N is ``1.25 N``. The peak adds each
# block's activations to both, the same at the same N (each rank trains on the same slice of the
# batch), so the model for the peak is ``(5 b + r) / (4 b / N + r)``, where ``r`` is what DDP's peak
# adds per block beyond its 5 b, measured at that N. The measured ratio must lie within
# ``RATIO_TOL`` of that model, and below ``1.25 N``.
ratios = {}
for n in NS:
    r = ddp[n] - 5 * b
    model_ratio = (5 * b + r) / (4 * b / n + r)
    measured_ratio = fits[Strategy.DDP, n][0] / fits[Strategy.FSDP2, n][0]
    ratios[n] = (measured_ratio, model_ratio, 1.25 * n)
    checks.expect(bool(abs(measured_ratio / model_ratio - 1) <= RATIO_TOL), "growth ratio", f"N={n}",
                  f"DDP's peak grows {measured_ratio:.2f}x faster than FSDP2's; the model says "
                  f"{model_ratio:.2f}x (r = {r:.3f} MiB/block)")
    checks.expect(bool(measured_ratio < 1.25 * n), "growth ratio below the state's", f"N={n}",
                  f"{measured_ratio:.2f}x >= 1.25 N = {1.25 * n:.2f}")
print(table([(f"N={n}", *v) for n, v in ratios.items()],
            ["world size", "peak: measured", "peak: model", "held state: 1.25 N"],
            formats={c: ".2f" for c in ("peak: measured", "peak: model", "held state: 1.25 N")},
            title="how many times faster DDP's per-rank memory grows with depth than FSDP2's"))
print("\nAdding the gathered block to FSDP2's slope would overshoot: "
      + "; ".join(f"N={n}: DDP/N + b = {ddp[n] / n + b:.3f} MiB/block against the measured "
                  f"{fits[Strategy.FSDP2, n][0]:.3f}" for n in NS)
      + ". The block FSDP2 gathers is there once, at any depth: it sits in the intercept, not in "
      "the slope.")

# %%
# The picture
# -----------
# Solid: measured per-rank peak during a training step; dashed: what the rank holds between steps.
# Both strategies are straight lines; FSDP2's are flatter, not flat.
style()
fig, ax = plt.subplots(figsize=(7.2, 4.4))
for (s, n), (slope, *_rest) in fits.items():
    marker, alpha = ("o", 1.0) if n == NS[0] else ("s", 0.6)
    ax.plot(DEPTHS, peak[s, n], marker=marker, color=s.color, alpha=alpha, lw=1.8,
            label=f"{s} x{n}: {slope:.2f} MiB/block")
    ax.plot(DEPTHS, held[s, n], marker=marker, color=s.color, alpha=alpha, lw=1, ls="--", ms=3)
ax.plot([], [], color="grey", ls="--", lw=1, label="held between steps (dashed)")
ax.set_xticks(DEPTHS)
ax.set_xlabel("transformer blocks")
ax.set_ylabel("per-rank peak above start (MiB)")
ax.set_title("Both grow with depth; FSDP2 "
             + " and ".join(f"{ratios[n][0]:.1f}x (N={n})" for n in NS) + " more slowly")
ax.legend(loc="upper left")
plt.show()
# sphinx_gallery_thumbnail_number = 1
