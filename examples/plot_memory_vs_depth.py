"""
Memory against depth: FSDP2 grows too, only slower
==================================================

.. admonition:: Verdict
   :class: tip

   Do not expect FSDP2 to keep per-rank memory flat as you add blocks: it grows linearly too, only
   more slowly. Use FSDP2 when depth is what stops DDP fitting: per block, DDP's first-step peak
   grows :claim:`depth.ddp_over_fsdp2.n4.peak_growth_measured <unit>` faster than FSDP2's at
   N = 4, close to, but under, the ``1.25 N`` of the held state (model state + DDP's buckets).

Measured on CPU gloo processes (tiny models, two shared cores); this page predicts no GPU numbers.

An exercise in the seed notebook asks what happens to per-rank memory as the model gets deeper,
and answers that "FSDP2 should stay flat". It does not. FSDP2 shards every block, so each extra
block still adds its 1/N share of parameters, gradients and AdamW moments to every rank. Per
block, DDP's **held state** (model state + DDP's buckets) grows by five times the block's
parameter bytes (four of model state, one of buckets), FSDP2's by four times them divided by N.
What FSDP2 adds that DDP does not, its transient buffers (the root, kept gathered from forward to
backward, and two blocks gathered during backward: the current one and the prefetched next one,
with one block's gradients), does not grow with depth.

This page measures it: the same model at three depths, DDP and FSDP2 at each N, each point in
fresh ranks, the first training step in two phases (forward and backward; ``optimizer.step()``).
It fits a line per run and phase, asserts the slopes against that model, shows which phase holds
the peak and why, and prints how much more slowly FSDP2 grows: in held state ``1.25 N`` times,
not ``N``; in the peak slightly less.
"""

# %%
# The code to copy
# ----------------
# The two wraps whose per-rank memory this page follows as blocks are added. DDP keeps every
# block whole on every rank (plus its gradient buckets); ``fully_shard`` on each block and then on
# the root keeps 1/N of every block per rank; during the step it gathers the root and, in backward,
# the current block and the next one (prefetched), a fixed number at any depth.
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap(model: torch.nn.Module, strategy: str, device_type: str = "cpu") -> torch.nn.Module:
    """``"ddp"``: a full replica per rank. ``"fsdp2"``: each block one unit, then the root."""
    if strategy == "ddp":
        return DDP(model)  # on GPU: DDP(model.cuda(rank), device_ids=[rank])
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# %%
# One point = one fresh job
# -------------------------
# Each point builds the model in fresh ranks and runs one AdamW step in two measured phases: the
# forward and backward, then ``optimizer.step()``. Each phase reports the rank's peak resident
# memory, measured from the rank's level *before* the model existed
# (:class:`guide.memory.PeakMemory`; ``prepare()`` makes freed memory leave the process); the
# point also reports what the rank holds afterwards, its held state (:func:`guide.memory.measure`:
# model state plus DDP's buckets).
# Fresh ranks per point, because an FSDP2 model is not freed by ``del model; gc.collect()`` in
# torch 2.13 (its parameter groups stay reachable), and a second model in the same process reuses
# what the first one freed: both distort the second measurement.
# Under torchrun there are no fresh ranks: a run's points share torchrun's processes, and a
# discarded first point takes the one-time costs (``run_points`` below), and each point first
# hands the heap's free pages back to the kernel (:func:`guide.memory.release_freed_heap`).
import dataclasses
import math

import matplotlib.pyplot as plt
import numpy as np

import guide
from guide import checks, memory
from guide.data import rank_slice, synthetic_batches
from guide.memory import PeakMemory, current_bytes, prepare, release_freed_heap
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.report import show, table
from guide.sharding import Strategy
from guide.training import make_optimizer, next_token_loss

MiB = 2**20
DEPTHS = (2, 9, 16)  # evenly spaced: the middle point is where a bend would show
#: The world sizes: under torchrun, torchrun's WORLD_SIZE alone (its points share
#: processes).
PAGE = guide.Page(section="Memory", order=3, key_api="fully_shard(", world_size=2, supports=(2, 4),
                  why="its batch of 4 sequences splits over at most 4")
NS = (PAGE.world_size,) if guide.under_torchrun() else (2, 4)
RUNS = [(s, n) for s in (Strategy.DDP, Strategy.FSDP2) for n in NS]
PHASES = ("backward", "step")  # forward + backward; optimizer.step()
BATCHES = synthetic_batches(steps=1, batch_size=4, seq_len=16, vocab=128, seed=0)
#: The checks' tolerances: a line may miss a point by RESID_TOL of its rise (or
#: RESID_FLOOR_MIB); slopes that should agree may differ by SLOPE_TOL; the step's
#: per-block remainder beyond the model state is at most REMAINDER_MAX blocks'
#: parameter bytes; the measured growth ratio may differ from 1.25 N by RATIO_TOL.
RESID_TOL, RESID_FLOOR_MIB, SLOPE_TOL = 0.05, 0.5, 0.1
REMAINDER_MAX, RATIO_TOL = 0.6, 0.1


def config(n_layers: int) -> ModelConfig:
    # Blocks of 3 MiB. With 0.75 MiB blocks, what a block adds beyond its model state (a
    # little more under FSDP2 than under DDP) moved the growth ratio 10.5 % off the model.
    return ModelConfig(vocab=128, d_model=256, n_layers=n_layers, n_heads=4, d_mlp=1024)


@dataclasses.dataclass(frozen=True)
class DepthResult:
    """One rank's peaks above its start (backward, the first step) and the state it holds."""

    backward: int
    step: int
    held: int


def depth_worker(rank: guide.Rank, strategy: Strategy, n_layers: int) -> DepthResult:
    prepare()
    release_freed_heap()
    start = current_bytes()
    model = build_model(config(n_layers), device=rank.device)
    model = wrap(model, strategy.value, rank.device.type)  # the code to copy, above
    opt = make_optimizer("adamw", model.parameters())
    tokens = rank_slice(BATCHES[0], rank.rank, rank.world_size).to(rank.device)
    with PeakMemory(rank.device) as backward:
        next_token_loss(model, tokens).backward()
    with PeakMemory(rank.device) as step:
        opt.step()  # the first step: AdamW creates its two moments here
    return DepthResult(backward.peak_level_bytes - start, step.peak_level_bytes - start,
                       memory.measure(model, opt).total)


def run_points(strategy: Strategy, n: int) -> list[list[DepthResult]]:
    """One run's points, one job per depth. Under torchrun the jobs share torchrun's processes, so
    a first, discarded point pays the one-time costs (lazy imports, gloo's and DDP's first buffers,
    the autograd engine's and AdamW's first use) that fresh ranks pay at every point. Without it
    they landed on the first depth alone: DDP x2's step line missed it by 13.9 MiB."""
    if guide.under_torchrun():
        guide.launch(depth_worker, n, strategy, DEPTHS[0])
    return [guide.launch(depth_worker, n, strategy, depth) for depth in DEPTHS]


points = {(s, n): run_points(s, n) for s, n in RUNS}


def per_point(key: str) -> dict:
    """The largest value over the ranks at each depth, per run, in MiB."""
    return {run: np.array([max(getattr(r, key) for r in pt) for pt in pts]) / MiB
            for run, pts in points.items()}


peak = {phase: per_point(phase) for phase in PHASES}
held = per_point("held")

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
        got = max(r.held for r in pt)
        checks.expect("held-state prediction", f"{s} x{n}, {depth} blocks",
                      got == predicted,
                      f"measured {got:,} B, predicted {predicted:,} B")
n_points = PAGE.state("depth.held_state.points_checked", len(RUNS) * len(DEPTHS), "points",
                      **MODEL)  # each checked above: measured == predicted, to the byte
b_mib = PAGE.state("tinylm.depth.block_params_fp32", round(b, 3), "MiB", **MODEL)
print(f"one block: b = {b_mib:.3f} MiB of fp32 parameters; the measured state equals "
      f"the prediction to the byte at all {n_points} points")

# %%
# Fitted slopes, and the checks that fail the build
# -------------------------------------------------
# A least-squares line per run and phase (``numpy.polyfit``). The checks: every phase of every run
# is a straight line (the largest residual is under ``RESID_TOL`` of its rise, or
# ``RESID_FLOOR_MIB``); DDP's step slope does not depend on N; the held state grows 5 b or 4 b / N
# per block; the step's peak grows by that plus a small per-block remainder (the step's
# temporaries, autograd and Python bookkeeping; under ``REMAINDER_MAX * b``); FSDP2 is far from
# flat.
def line(run: tuple, phase: str) -> tuple[float, float, float]:
    """Slope, intercept and largest residual of one phase's peaks, asserted straight."""
    slope, intercept = np.polyfit(DEPTHS, peak[phase][run], 1)
    resid = np.abs(peak[phase][run] - np.polyval((slope, intercept), DEPTHS)).max()
    rise = peak[phase][run][-1] - peak[phase][run][0]
    resid = checks.expect_close(  # a bound: the largest miss of the line, in MiB
        "linear in depth", f"{run[0]} x{run[1]}, {phase}", float(resid), 0.0,
        max(RESID_FLOOR_MIB, RESID_TOL * rise), f"largest residual (the peak rises {rise:.1f} MiB)")
    return slope, intercept, resid


fits = {run: (*line(run, "step"), np.polyfit(DEPTHS, held[run], 1)[0],
              line(run, "backward")[0]) for run in RUNS}
ddp = {n: fits[Strategy.DDP, n][0] for n in NS}
spread = max(ddp.values()) - min(ddp.values())
checks.expect("DDP independent of N", "DDP",
              bool(spread <= SLOPE_TOL * min(ddp.values())),
              f"step slopes {ddp} MiB/block")
held_checked = {}
for (s, n), (slope, _, _, held_slope, _) in fits.items():
    expected = state_slope[s, n]
    extra = slope - expected
    held_checked[s, n] = checks.expect_close(
        "state slope", f"{s} x{n}", float(held_slope), expected, SLOPE_TOL,
        "held state growth (MiB/block)", rel=True, against="the model's 5 b or 4 b / N")
    checks.expect("step slope", f"{s} x{n}",
                  bool(-SLOPE_TOL * expected <= extra <= REMAINDER_MAX * b),
                  f"the step's peak grows {slope:.3f} MiB/block, "
                  f"{extra:+.3f} beyond the state's {expected:.3f}: not in "
                  f"[-{SLOPE_TOL:.0%} of it, +{REMAINDER_MAX} b]")
    checks.expect("not flat", f"{s} x{n}", bool(slope >= 0.5 * expected),
                  f"slope {slope:.3f} MiB/block")


def slope_claim(s: Strategy, n: int, what: str, value: float,
                check: str | None) -> float:
    """Record one fitted or predicted number of the table below, as it prints: with the check
    that returned it, else computed (a band checked by checks.expect is not a checked value)."""
    fmt = ".1f" if what.endswith("intercept") else ".3f"
    unit = "MiB" if what.endswith(("intercept", "max_residual")) else "MiB per block"
    at = dict(world_size=n, depths=DEPTHS, ddp_buckets=True, **MODEL)
    name = f"depth.{s.value}.n{n}.{what}"
    if isinstance(value, checks.Checked):
        return PAGE.check(name, value, unit, fmt=fmt, **at)
    return PAGE.state(name, float(value), unit, fmt=fmt, **at)


rows = [(f"{s} x{n}",
         slope_claim(s, n, "step_slope", slope, "step slope"),
         slope_claim(s, n, "held_slope", held_checked[s, n], "state slope"),
         slope_claim(s, n, "state_slope_model", state_slope[s, n], None),
         slope_claim(s, n, "step_intercept", intercept, None),
         slope_claim(s, n, "step_max_residual", resid, "linear in depth"))
        for (s, n), (slope, intercept, resid, hs, _) in fits.items()]
tols = {name: PAGE.state(f"tolerance.depth.{name}", v, unit) for name, v, unit in (
    ("residual", RESID_TOL, "fraction of the rise"),
    ("residual_floor", RESID_FLOOR_MIB, "MiB"), ("slope", SLOPE_TOL, "fraction"),
    ("remainder", REMAINDER_MAX, "b"), ("ratio", RATIO_TOL, "fraction"))}
COLS = ["run", "step slope", "held slope", "5b or 4b/N", "intercept", "max residual"]
show(table(rows, COLS, formats={c: ".3f" for c in COLS[1:]} | {"intercept": ".1f"},
            title=f"measured, MiB per block (intercept: MiB); b = {b_mib:.3f} MiB, "
                  f"tolerances: residual {tols['residual']:.0%} of the rise or "
                  f"{tols['residual_floor']} MiB, slopes {tols['slope']:.0%}, "
                  f"remainder {tols['remainder']} b, ratio {tols['ratio']:.0%}"))

# %%
# Where the peak is: in ``optimizer.step()``
# ------------------------------------------
# During the first backward a rank holds parameters and gradients (and DDP its bucket): 3 b per
# block for DDP, 2 b / N for FSDP2, plus what backward keeps per block (activations, autograd
# bookkeeping). AdamW creates its two moments only in the first ``optimizer.step()``, after
# backward has freed the activations: 2 b more per block for DDP, 2 b / N for FSDP2. So the step
# grows faster than backward whenever a block's activations are smaller than its moments, as at
# this page's short sequences, and then it holds the first step's peak past a few blocks: that is
# why the slopes above are the model state's, with no activations in them. Activations are not
# sharded and FSDP2's moments shrink with N, so at long sequences or large N backward holds the
# peak instead; and from the second step on the moments exist before the forward starts, so the
# activations come on top of the full state (the activation page measures them). The checks:
# backward grows by its state plus at most ``REMAINDER_MAX * b``; the step grows faster than
# backward; at the deepest point the step's peak is the higher.
backward_state = {(s, n): 3 * b if s is Strategy.DDP else 2 * b / n for s, n in RUNS}
phase_rows = []
for (s, n), (step_slope, _, _, _, backward_slope) in fits.items():
    state = backward_state[s, n]
    checks.expect("backward slope", f"{s} x{n}",
                  bool(-SLOPE_TOL * state <= backward_slope - state <= REMAINDER_MAX * b),
                  f"backward's peak grows "
                  f"{backward_slope:.3f} MiB/block, its state {state:.3f}")
    checks.expect("step grows faster", f"{s} x{n}", bool(step_slope > backward_slope),
                  f"step {step_slope:.3f} <= backward {backward_slope:.3f} MiB/block")
    deepest = {phase: peak[phase][s, n][-1] for phase in PHASES}
    checks.expect("step holds the peak", f"{s} x{n}, {DEPTHS[-1]} blocks",
                  bool(deepest["step"] > deepest["backward"]),
                  f"step {deepest['step']:.1f} MiB <= "
                  f"backward {deepest['backward']:.1f} MiB")
    phase_rows.append((f"{s} x{n}", *(
        slope_claim(s, n, what, value, check) for what, value, check in (
            ("backward_slope", backward_slope, "backward slope"),
            ("backward_state_model", state, None),
            ("backward_remainder", backward_slope - state, "backward slope"),
            ("step_slope", step_slope, "step slope")))))
PHASE_COLS = ["run", "backward slope", "3b or 2b/N", "the rest", "step slope"]
show(table(phase_rows, PHASE_COLS, formats={c: ".3f" for c in PHASE_COLS[1:]},
            title="the first step's two phases, measured, MiB per block"))

# %%
# How much more slowly FSDP2 grows
# --------------------------------
# Not N times. In held state (model state + DDP's buckets), DDP's 5 b against FSDP2's 4 b / N per
# block is ``5 N / 4``; in model state alone it would be N (the fifth b is DDP's bucket). The step's
# peak adds a small remainder ``r`` per block that is not sharded (the step slope less the state
# slope in the first table, about the same for both strategies), so the model for the peak is ``(5 b
# + r) / (4 b / N + r)``, slightly under ``5 N / 4``, with ``r`` what DDP's step adds per block
# beyond its 5 b, measured at that N. The measured ratio of the step slopes must lie within
# ``RATIO_TOL`` of that model.
ratios = {}
for n in NS:
    r = ddp[n] - 5 * b
    model_ratio = (5 * b + r) / (4 * b / n + r)
    measured_ratio = fits[Strategy.DDP, n][0] / fits[Strategy.FSDP2, n][0]
    measured_ratio = checks.expect_close(
        "growth ratio", f"N={n}", measured_ratio, model_ratio, RATIO_TOL,
        f"DDP's peak growth over FSDP2's (r = {r:.3f} MiB/block)", rel=True,
        against="the model's ratio")
    at_n = dict(world_size=n, depths=DEPTHS, **MODEL)
    ratios[n] = (
        PAGE.check(f"depth.ddp_over_fsdp2.n{n}.peak_growth_measured", measured_ratio, "x",
                   fmt=".2f", **at_n),
        *(PAGE.state(f"depth.ddp_over_fsdp2.n{n}.{what}", v, "x", fmt=".2f", **at_n)
          for what, v in (("peak_growth_model", model_ratio),
                          ("held_state_growth_model", 1.25 * n), ("folklore", float(n)))))
RATIO_COLS = ["world size", "peak: measured", "peak: model", "held: 5b/(4b/N)",
              "folklore: N"]
show(table([(f"N={n}", *v) for n, v in ratios.items()], RATIO_COLS,
            formats={c: ".2f" for c in RATIO_COLS[1:]},
            title="how many times faster DDP's per-rank peak grows with depth than "
                  "FSDP2's, first step"))
overshoot = {n: PAGE.state(f"depth.fsdp2.n{n}.ddp_over_n_plus_block",
                           round(ddp[n] / n + b, 3), "MiB per block", world_size=n,
                           depths=DEPTHS, **MODEL) for n in NS}
fsdp2_step = dict(zip(NS, (row[1] for row in rows[len(NS):])))  # the recorded slopes
print("\nAdding the gathered block to FSDP2's slope would overshoot: "
      + "; ".join(f"N={n}: DDP/N + b = {overshoot[n]:.3f} MiB/block against the "
                  f"measured {fsdp2_step[n]:.3f}" for n in NS)
      + ". The blocks FSDP2 gathers (two in backward, with the root) are there at any "
      "depth: they sit in the intercept, not in the slope.")

# %%
# The picture
# -----------
# Solid: measured per-rank peak in the first ``optimizer.step()``; dashed: what the rank holds
# between steps. Both strategies are straight lines; FSDP2's are flatter, not flat.
style()
fig, ax = plt.subplots(figsize=(7.2, 4.4))
for (s, n), row in zip(fits, rows):
    marker, alpha = ("o", 1.0) if n == NS[0] else ("s", 0.6)
    ax.plot(DEPTHS, peak["step"][s, n], marker=marker, color=s.color, alpha=alpha, lw=1.8,
            label=f"{s} x{n}: {row[1]:.3f} MiB/block")
    ax.plot(DEPTHS, held[s, n], marker=marker, color=s.color, alpha=alpha, lw=1,
            ls="--", ms=3)
ax.set_xticks(DEPTHS)
ax.set_xlabel("transformer blocks")
ax.set_ylabel("per-rank memory above start (MiB)")
ax.set_title("Both grow with depth; FSDP2 "
             + " and ".join(f"{ratios[n][0]:.2f}x (N={n})" for n in NS)
             + " more slowly")
ax.legend(loc="upper left", title="solid: peak in step 1; dashed: held",
          title_fontsize="small", fontsize="small")
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
