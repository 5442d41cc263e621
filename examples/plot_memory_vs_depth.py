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
from guide import checks, claims, memory, sharding
from guide.data import synthetic_batches
from guide.memory import PeakMemory, current_bytes, prepare
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.report import table
from guide.sharding import Strategy
from guide.training import make_optimizer, train_steps

MiB = 2**20
DEPTHS = (2, 9, 16)  # evenly spaced: the middle point is where a bend would show
#: The world sizes: under torchrun, torchrun's WORLD_SIZE alone (its points share
#: processes).
NS = (guide.world_size(2),) if guide.under_torchrun() else (2, 4)
RUNS = [(s, n) for s in (Strategy.DDP, Strategy.FSDP2) for n in NS]
BATCHES = synthetic_batches(steps=1, batch_size=4, seq_len=16, vocab=128, seed=0)
#: The checks' tolerances: a line may miss a point by RESID_TOL of its rise (or
#: RESID_FLOOR_MIB); slopes that should agree may differ by SLOPE_TOL; FSDP2's
#: per-block remainder beyond its model state is at most REMAINDER_MAX blocks'
#: parameter bytes; the measured growth ratio may differ from the model's by RATIO_TOL.
RESID_TOL, RESID_FLOOR_MIB, SLOPE_TOL = 0.05, 0.5, 0.1
REMAINDER_MAX, RATIO_TOL = 0.6, 0.1
ledger = claims.Ledger("plot_memory_vs_depth")  # every number this page states


def config(n_layers: int) -> ModelConfig:
    # Blocks of 3 MiB. With 0.75 MiB blocks, what a block adds beyond its model state (a
    # little more under FSDP2 than under DDP) moved the growth ratio 10.5 % off the model.
    return ModelConfig(vocab=128, d_model=256, n_layers=n_layers, n_heads=4, d_mlp=1024)


def depth_worker(rank: guide.Rank, strategy: Strategy, n_layers: int) -> dict:
    prepare()
    start = current_bytes()
    model = build_model(config(n_layers), device=rank.device)
    model = sharding.wrap(model, strategy, rank)  # DDP(model), or fully_shard
    opt = make_optimizer("adamw", model.parameters())
    with PeakMemory(rank.device) as peak:
        train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
    return {"peak": peak.peak_level_bytes - start,
            "held": memory.measure(model, opt).total}


points = {(s, n): [guide.launch(depth_worker, n, s, depth) for depth in DEPTHS]
          for s, n in RUNS}
peak = {run: np.array([max(r["peak"] for r in pt) for pt in pts]) / MiB
        for run, pts in points.items()}
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
block_shapes = memory.param_shapes(build_model(config(1)).blocks[0])
b = sum(math.prod(s) for s in block_shapes) * 4 / MiB
MODEL = dict(model=f"{config(1)} at n_layers = depth", optimizer="adamw",
             precision="fp32")
state_slope = {(s, n): 5 * b if s is Strategy.DDP else 4 * b / n for s, n in RUNS}

shapes = {depth: memory.param_shapes(build_model(config(depth))) for depth in DEPTHS}
for (s, n), pts in points.items():
    for depth, pt in zip(DEPTHS, pts):
        predicted = memory.per_rank_state_bytes(shapes[depth], s, n, "fp32", "adamw",
                                                ddp_buckets=True).total
        got = max(r["held"] for r in pt)
        checks.expect(got == predicted, "held-state prediction",
                      f"{s} x{n}, {depth} blocks",
                      f"measured {got:,} B, predicted {predicted:,} B")
b_mib = ledger.claim("tinylm.depth.block_params_fp32", round(b, 3), "MiB", **MODEL)
print(f"one block: b = {b_mib:.3f} MiB of fp32 parameters; the measured state equals "
      f"the prediction to the byte at all {len(RUNS) * len(DEPTHS)} points")

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
    checks.expect(bool(resid <= max(RESID_FLOOR_MIB, RESID_TOL * rise)),
                  "linear in depth", f"{run[0]} x{run[1]}",
                  f"a line misses a point by {resid:.2f} MiB (the peak rises "
                  f"{rise:.1f} MiB)")
    fits[run] = (slope, intercept, resid, np.polyfit(DEPTHS, held[run], 1)[0])

ddp = {n: fits[Strategy.DDP, n][0] for n in NS}
spread = max(ddp.values()) - min(ddp.values())
checks.expect(bool(spread <= SLOPE_TOL * min(ddp.values())), "DDP independent of N",
              "DDP", f"slopes {ddp} MiB/block")
for n in NS:
    slope, _, _, held_slope = fits[Strategy.FSDP2, n]
    expected = state_slope[Strategy.FSDP2, n]
    extra = slope - expected
    checks.expect(bool(abs(held_slope - expected) <= SLOPE_TOL * expected),
                  "FSDP2 state slope", f"FSDP2 x{n}", f"held state grows "
                  f"{held_slope:.3f} MiB/block, 4b/N = {expected:.3f}")
    checks.expect(bool(-SLOPE_TOL * expected <= extra <= REMAINDER_MAX * b),
                  "FSDP2 slope", f"FSDP2 x{n}", f"peak grows {slope:.3f} MiB/block, "
                  f"{extra:+.3f} beyond 4b/N: not in [-{SLOPE_TOL:.0%} of it, "
                  f"+{REMAINDER_MAX} b]")
    checks.expect(bool(slope >= 0.5 * expected), "not flat", f"FSDP2 x{n}",
                  f"slope {slope:.3f} MiB/block")


def slope_claim(s: Strategy, n: int, what: str, value: float,
                check: str | None) -> float:
    """Record one fitted or predicted number of the table below, as it prints."""
    digits = 1 if what == "intercept" else 3
    unit = "MiB" if what in ("intercept", "max_residual") else "MiB per block"
    return ledger.claim(f"depth.{s.value}.n{n}.{what}", round(float(value), digits),
                        unit, guard=f"asserted: {check}" if check else "computed",
                        world_size=n, depths=DEPTHS, ddp_buckets=True, **MODEL)


FSDP2_ = Strategy.FSDP2
rows = [(f"{s} x{n}",
         slope_claim(s, n, "peak_slope", slope, "FSDP2 slope" if s is FSDP2_ else
                     "DDP independent of N"),
         slope_claim(s, n, "held_slope", hs, "FSDP2 state slope" if s is FSDP2_ else
                     "held-state prediction"),
         slope_claim(s, n, "state_slope_model", state_slope[s, n], None),
         slope_claim(s, n, "intercept", intercept, None),
         slope_claim(s, n, "max_residual", resid, "linear in depth"))
        for (s, n), (slope, intercept, resid, hs) in fits.items()]
tols = {name: ledger.claim(f"tolerance.depth.{name}", v, unit) for name, v, unit in (
    ("residual", RESID_TOL, "fraction of the rise"),
    ("residual_floor", RESID_FLOOR_MIB, "MiB"), ("slope", SLOPE_TOL, "fraction"),
    ("remainder", REMAINDER_MAX, "b"), ("ratio", RATIO_TOL, "fraction"))}
COLS = ["run", "peak slope", "held slope", "5b or 4b/N", "intercept", "max residual"]
print(table(rows, COLS, formats={c: ".3f" for c in COLS[1:]} | {"intercept": ".1f"},
            title=f"measured, MiB per block (intercept: MiB); b = {b_mib:.3f} MiB, "
                  f"tolerances: residual {tols['residual']:.0%} of the rise or "
                  f"{tols['residual_floor']} MiB, slopes {tols['slope']:.0%}, "
                  f"remainder {tols['remainder']} b, ratio {tols['ratio']:.0%}"))

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
    checks.expect(bool(abs(measured_ratio / model_ratio - 1) <= RATIO_TOL),
                  "growth ratio", f"N={n}", f"DDP's peak grows {measured_ratio:.2f}x "
                  f"faster than FSDP2's; the model says {model_ratio:.2f}x "
                  f"(r = {r:.3f} MiB/block)")
    checks.expect(bool(measured_ratio < 1.25 * n), "growth ratio below the state's",
                  f"N={n}", f"{measured_ratio:.2f}x >= 1.25 N = {1.25 * n:.2f}")
    ratios[n] = tuple(
        ledger.claim(f"depth.ddp_over_fsdp2.n{n}.{what}", round(v, 2), "x", guard=guard,
                     world_size=n, depths=DEPTHS, **MODEL)
        for what, v, guard in (
            ("peak_growth_measured", measured_ratio, "asserted: growth ratio"),
            ("peak_growth_model", model_ratio, "computed"),
            ("state_growth_model", 1.25 * n, "computed")))
RATIO_COLS = ["world size", "peak: measured", "peak: model", "held state: 1.25 N"]
print(table([(f"N={n}", *v) for n, v in ratios.items()], RATIO_COLS,
            formats={c: ".2f" for c in RATIO_COLS[1:]},
            title="how many times faster DDP's per-rank memory grows with depth than "
                  "FSDP2's"))
overshoot = {n: ledger.claim(f"depth.fsdp2.n{n}.ddp_over_n_plus_block",
                             round(ddp[n] / n + b, 3), "MiB per block", world_size=n,
                             depths=DEPTHS, **MODEL) for n in NS}
fsdp2_peak = dict(zip(NS, (row[1] for row in rows[len(NS):])))  # the recorded slopes
print("\nAdding the gathered block to FSDP2's slope would overshoot: "
      + "; ".join(f"N={n}: DDP/N + b = {overshoot[n]:.3f} MiB/block against the "
                  f"measured {fsdp2_peak[n]:.3f}" for n in NS)
      + ". The block FSDP2 gathers is there once, at any depth: it sits in the "
      "intercept, not in the slope.")

# %%
# The picture
# -----------
# Solid: measured per-rank peak during a training step; dashed: what the rank holds between steps.
# Both strategies are straight lines; FSDP2's are flatter, not flat.
style()
fig, ax = plt.subplots(figsize=(7.2, 4.4))
for (s, n), row in zip(fits, rows):
    marker, alpha = ("o", 1.0) if n == NS[0] else ("s", 0.6)
    ax.plot(DEPTHS, peak[s, n], marker=marker, color=s.color, alpha=alpha, lw=1.8,
            label=f"{s} x{n}: {row[1]:.3f} MiB/block")
    ax.plot(DEPTHS, held[s, n], marker=marker, color=s.color, alpha=alpha, lw=1,
            ls="--", ms=3)
ax.plot([], [], color="grey", ls="--", lw=1, label="held between steps (dashed)")
ax.set_xticks(DEPTHS)
ax.set_xlabel("transformer blocks")
ax.set_ylabel("per-rank peak above start (MiB)")
ax.set_title("Both grow with depth; FSDP2 "
             + " and ".join(f"{ratios[n][0]:.2f}x (N={n})" for n in NS)
             + " more slowly")
ax.legend(loc="upper left")
plt.show()
# sphinx_gallery_thumbnail_number = 1
