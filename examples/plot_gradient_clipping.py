"""
Gradient clipping over sharded gradients
========================================

.. admonition:: Verdict
   :class: tip

   With FSDP2, clip as in one process: ``torch.nn.utils.clip_grad_norm_(model.parameters(),
   max_norm)`` between ``backward()`` and ``optimizer.step()``. On FSDP2's ``DTensor`` gradients it
   computes the global norm (the single-process norm to :claim:`gradient_clipping.fsdp2.norm_gap`);
   never clip each rank's local shards by hand, whose norm is only that rank's part. Read the
   returned norm with ``full_tensor()`` to log it.
   Measured on CPU gloo processes (tiny models, two shared cores); this page predicts nothing.

``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` rescales the gradients so that their
*global* 2-norm is at most ``max_norm``. Under FSDP2 no rank holds the whole gradient: each holds one
``Shard(0)`` slice of every gradient, as a ``DTensor``. The norm a rank could compute from its own
slices is the wrong number; the right one needs every rank's contribution.

This page shows that ``clip_grad_norm_`` on FSDP2's ``DTensor`` gradients computes the true norm, the
one a single process gets from the unsharded gradient, and that clipped FSDP2 training is the clipped
single-process training, step for step. A disagreement **fails the docs build**.
"""

# %%
# The clip to copy
# ----------------
# The clip goes between ``backward()`` and ``optimizer.step()``, as in one process: the same call on
# plain and on FSDP2's ``DTensor`` gradients. It returns the norm *before* clipping; on DTensor
# gradients it is a ``DTensor`` itself, replicated on every rank (torch 2.13; torch 2.9 returns a
# partial norm, pytorch #170862, whose ``full_tensor()`` is the norm: read it that way on both).
# The page's loop below calls these very functions.
import torch
from torch.distributed.tensor import DTensor


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Scale every gradient so that their global 2-norm is at most ``max_norm``; return the
    norm before clipping (a ``DTensor`` under FSDP2)."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def norm_to_log(norm: torch.Tensor) -> float:
    """The global norm as a number, on every rank: ``full_tensor()`` for a ``DTensor``."""
    return (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()


# %%
# One loop for both runs
# ----------------------
# The page writes the loop itself (:func:`guide.training.train_steps` with the clip added). The
# same function trains the single-process reference (one rank, the whole batch) and runs inside
# each FSDP2 rank.
import dataclasses

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checks, plotting, report, sharding
from guide.data import rank_slice, synthetic_batches
from guide.layout import full_state, local_tensor
from guide.model import ModelConfig, build_model
from guide.sharding import Strategy
from guide.training import make_optimizer, mean_over_ranks, next_token_loss

PAGE = guide.Page(section="Configure FSDP2", order=6, key_api="clip_grad_norm_(", world_size=2,
                  supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
STEPS = 20
MAX_NORM = 0.9
CFG = ModelConfig()
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab,
                            seed=0)


def local_grad_norm(model: torch.nn.Module) -> float:
    """The 2-norm of the gradients *this rank holds*: for FSDP2, the norm of its
    shards only. The shards partition every gradient, so the squares of the ranks'
    local norms add up to the square of the true norm; a rank clipping with its local
    norm would scale by the wrong factor."""
    return sum(float(local_tensor(p.grad).double().pow(2).sum())
               for p in model.parameters() if p.grad is not None) ** 0.5


@dataclasses.dataclass
class ClippedRun:
    """One run's losses, the norms clip_grad_norm_ returned, this rank's local norms, the
    placements of the returned norm (a DTensor's; empty for plain tensors), and its final full
    parameters (a worker's)."""

    losses: list[float] = dataclasses.field(default_factory=list)
    norms: list[float] = dataclasses.field(default_factory=list)
    local_norms: list[float] = dataclasses.field(default_factory=list)
    norm_placements: str = ""
    params: dict | None = None


def clipped_steps(model, opt, batches, rank: guide.Rank | None = None,
                  max_norm=MAX_NORM) -> ClippedRun:
    out = ClippedRun()
    where = (0, 1) if rank is None else (rank.rank, rank.world_size)
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model, rank_slice(batch, *where))
        loss.backward()
        out.local_norms.append(local_grad_norm(model))  # this rank's shards only
        norm = clip_gradients(model, max_norm)
        if isinstance(norm, DTensor):  # checked below: replicated (or partial on torch 2.9)
            out.norm_placements = str(tuple(norm.placements))
        out.norms.append(norm_to_log(norm))
        opt.step()
        out.losses.append(loss.item())
    return out


# %%
# The reference, clipped and not
# ------------------------------
# One process, the full global batch, SGD. Training without the clip as well shows that the clip is
# not a no-op here: ``MAX_NORM`` lies within the range of the gradient norms, so it clips some steps
# (counted below) and moves the final parameters far beyond the tolerance of the checks.
def reference(max_norm: float) -> tuple[ClippedRun, dict]:
    model = build_model(CFG)
    run = clipped_steps(model, make_optimizer("sgd", model.parameters()), BATCHES,
                        max_norm=max_norm)
    return run, full_state(model)


REF, REF_PARAMS = reference(MAX_NORM)
_, UNCLIPPED_PARAMS = reference(float("inf"))
clipped = sum(n > MAX_NORM for n in REF.norms)
effect = max((REF_PARAMS[k] - UNCLIPPED_PARAMS[k]).abs().max().item()
             for k in REF_PARAMS)
checks.assert_learns("clipped reference", REF.losses)
checks.expect("clipping is active", "reference",
              clipped > 0 and effect > 100 * checks.PARAM_TOL["sgd"],
              f"{clipped} clipped steps, effect {effect:.1e}; lower MAX_NORM.")
setting = dict(model="tinylm-main", optimizer="sgd", steps=STEPS, max_norm=MAX_NORM)
PAGE.state("gradient_clipping.max_norm", MAX_NORM, "gradient 2-norm")
PAGE.check("gradient_clipping.reference.clipped_steps", checks.expect_order(
    "clipping is active", "reference", 0, clipped, low_name="0", high_name="clipped steps",
    keep="high"), "steps", fmt=".0f", **setting)
effect = PAGE.check("gradient_clipping.reference.param_shift", checks.expect_order(
    "clipping is active", "reference", 100 * checks.PARAM_TOL["sgd"], effect,
    low_name="100 x the parameter tolerance", high_name="clipping's effect", keep="high"),
    "max |Δparam|", fmt=".1e", **setting)
print(f"reference: {clipped} of {STEPS} steps had a gradient norm above "
      f"max_norm={MAX_NORM}; clipping moved the final parameters by up to {effect:.1e}")

# %%
# The FSDP2 worker
# ----------------
# ``fully_shard`` on every block and the root, as everywhere on this site; then the same loop, on
# this rank's slice of every batch.


def fsdp2_worker(rank: guide.Rank) -> ClippedRun:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = sharding.apply_fsdp2(build_model(CFG, device=rank.device), mesh)
    opt = make_optimizer("sgd", model.parameters())
    run = clipped_steps(model, opt, BATCHES, rank)
    run.params = full_state(model)
    return run


results = guide.launch(fsdp2_worker, WORLD_SIZE)

# %%
# The checks
# ----------
# Every rank must report the *same* norm, equal to the reference's unsharded norm at that step, and
# the clipped run must match the clipped reference in losses and parameters. The ranks' local norms
# are not the norm: their squares add up to its square.
run = f"FSDP2 x{WORLD_SIZE}, SGD, clip {MAX_NORM}"
for r, res in enumerate(results):  # torch 2.9 returns a partial norm (pytorch #170862)
    checks.expect("clip norm", run,
                  res.norm_placements == "(Replicate(),)"
                  or res.norm_placements.startswith("(_NormPartial("),
                  f"rank {r}'s norm has placements {res.norm_placements}, neither "
                  "(Replicate(),) nor a partial norm.")
norm_gap = max(checks.expect_close("clip norm", run, res.norms, REF.norms,
                                   checks.LOSS_TOL, what=f"rank {r}'s clip_grad_norm_")
               for r, res in enumerate(results))
loss_gap = checks.assert_losses_match(run, REF.losses,
                                      mean_over_ranks([r.losses for r in results]),
                                      against=checks.SINGLE_PROCESS)
param_gap = checks.assert_params_match(run, REF_PARAMS, results[0].params,
                                       checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
combined = [sum(r.local_norms[s] ** 2 for r in results) ** 0.5 for s in range(STEPS)]
pythagoras = checks.expect_close("clip norm", run, combined, REF.norms,
                                 checks.LOSS_TOL, what="sqrt(sum of local norms²)")
print("norm returned by clip_grad_norm_: a DTensor with "
      f"{results[0].norm_placements}")
fsdp2 = dict(model="tinylm-main", optimizer="sgd", world_size=WORLD_SIZE,
             max_norm=MAX_NORM)
norms = ["reference", *(f"rank {r}" for r in range(WORLD_SIZE)),
         *(f"local r{r}" for r in range(WORLD_SIZE))]
SHOWN_STEPS = range(0, STEPS, 5)
PAGE.show("gradient_clipping.norms", [[s, REF.norms[s], *(r.norms[s] for r in results),
                       *(r.local_norms[s] for r in results)] for s in SHOWN_STEPS],
                     ["step", *norms], formats=dict.fromkeys(norms, ".6f"),
                     keys=[f"step_{s}" for s in SHOWN_STEPS], **fsdp2)

# %%
# Each gap against its tolerance (the checks above bound them):
LOSS_TOL = PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats")
SGD_TOL = PAGE.state("tolerance.param.sgd", checks.PARAM_TOL["sgd"], "absolute")
gaps = [  # (row, claim, measured gap, tolerance, the check that bounds it)
    ("max |norm − reference norm|", "norm_gap", norm_gap, LOSS_TOL, "clip norm"),
    ("max |Δloss|", "loss_gap", loss_gap, LOSS_TOL, "loss equivalence"),
    ("max |Δparam|", "param_gap", param_gap, SGD_TOL, "parameter equivalence"),
    ("max |sqrt(Σ local²) − norm|", "local_norms_gap", pythagoras, LOSS_TOL,
     "clip norm"),
]
report.show(report.table(
    [[row, PAGE.check(f"gradient_clipping.fsdp2.{name}", gap, "absolute", fmt=".1e",
                      **fsdp2), tol]
     for row, name, gap, tol, check in gaps],
    ["gap", "measured", "tol"], formats={"measured": ".1e", "tol": ".0e"}))
print(f"\nAll checks passed: on {WORLD_SIZE} ranks, clip_grad_norm_ returned the "
      f"unsharded norm to {gaps[0][2]:.1e} and clipped FSDP2 trained the clipped "
      "single process.")

# %%
# The true norm and the local ones
# --------------------------------
# Per step: the reference's norm, the norm FSDP2's ``clip_grad_norm_`` returned, and what each rank
# would have computed from its own shards. Below the ``max_norm`` line (dash-dot) nothing is
# clipped.
plotting.style()
fig, ax = plt.subplots(figsize=(7.5, 5.0))
ax.plot(REF.norms, color=plotting.REFERENCE_COLOR, lw=5, alpha=0.3,
        label="1 process, unsharded gradient")
ax.plot(results[0].norms, "--", color=Strategy.FSDP2.color, lw=1.8,
        label=f"FSDP2 x{WORLD_SIZE}: clip_grad_norm_")
for r, res in enumerate(results):
    ax.plot(res.local_norms, ":", marker=".", lw=1.2,
            color=("#9467bd", "#ff7f0e")[r % 2], label=f"rank {r}, own shards")
ax.axhline(MAX_NORM, color="grey", lw=1, ls="-.", label=f"max_norm = {MAX_NORM:g}")
ax.set(ylim=(0, 1.5 * max(max(REF.norms), MAX_NORM)), xlabel="training step",
       ylabel="gradient 2-norm (before clipping)",
       title="clip_grad_norm_ on DTensors returns the global norm, not a shard's")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
plotting.legend_below(fig)
plt.show()
# sphinx_gallery_thumbnail_number = 1
