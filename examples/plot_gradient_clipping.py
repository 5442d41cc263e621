"""
Gradient clipping over sharded gradients
========================================

``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` rescales the gradients so that their
*global* 2-norm is at most ``max_norm``. Under FSDP2 no rank holds the whole gradient: each holds one
``Shard(0)`` slice of every gradient, as a ``DTensor``. The norm a rank could compute from its own
slices is the wrong number; the right one needs every rank's contribution.

This page shows that ``clip_grad_norm_`` on FSDP2's ``DTensor`` gradients computes the true norm, the
one a single process gets from the unsharded gradient, and that clipped FSDP2 training is the clipped
single-process training, step for step. A disagreement **fails the docs build**.
"""

# %%
# One loop for both runs
# ----------------------
# The clip goes between ``backward()`` and ``optimizer.step()``, so this page writes the loop itself
# (from :mod:`guide.steps`). The same function trains the single-process reference (one rank, the
# whole batch) and runs inside each FSDP2 rank. ``clip_grad_norm_`` returns the norm *before*
# clipping; on DTensor gradients it is a ``DTensor`` itself, replicated on every rank.
import matplotlib.pyplot as plt
import torch
from torch.distributed.tensor import DTensor

import guide
from guide import checks, knob_plots, sharding
from guide.data import rank_slice, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.steps import local_grad_norm, next_token_loss
from guide.dtensor import full_state
from guide.training import make_optimizer, mean_over_ranks

WORLD_SIZE = guide.world_size(2)
STEPS = 20
MAX_NORM = 0.9
CFG = ModelConfig()
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)


def clipped_steps(model, opt, batches, rank=0, world_size=1, max_norm=MAX_NORM) -> dict:
    out = {"losses": [], "norms": [], "local_norms": []}
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model, rank_slice(batch, rank, world_size))
        loss.backward()
        out["local_norms"].append(local_grad_norm(model))  # this rank's shards only
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if isinstance(norm, DTensor):
            out["norm_placements"] = str(tuple(norm.placements))
            norm = norm.full_tensor()
        out["norms"].append(norm.item())
        opt.step()
        out["losses"].append(loss.item())
    return out


# %%
# The reference, clipped and not
# ------------------------------
# One process, the full global batch, SGD. Training without the clip as well shows that the clip is
# not a no-op here: ``MAX_NORM`` lies within the range of the gradient norms, so it clips some steps
# (counted below) and moves the final parameters far beyond the tolerance of the checks.
def reference(max_norm: float) -> tuple[dict, dict]:
    model = build_model(CFG)
    run = clipped_steps(model, make_optimizer("sgd", model.parameters()), BATCHES,
                        max_norm=max_norm)
    return run, full_state(model)


REF, REF_PARAMS = reference(MAX_NORM)
_, UNCLIPPED_PARAMS = reference(float("inf"))
clipped = sum(n > MAX_NORM for n in REF["norms"])
effect = max((REF_PARAMS[k] - UNCLIPPED_PARAMS[k]).abs().max().item() for k in REF_PARAMS)
print(f"reference: {clipped} of {STEPS} steps had a gradient norm above max_norm={MAX_NORM}; "
      f"clipping moved the final parameters by up to {effect:.1e}")
if clipped == 0 or not effect > 100 * checks.PARAM_TOL["sgd"]:
    raise checks.CheckFailed(f"[clipping is active] reference: {clipped} clipped steps, effect "
                             f"{effect:.1e}; lower MAX_NORM so that the page tests something.")

# %%
# The FSDP2 worker
# ----------------
# ``fully_shard`` on every block and the root, as everywhere on this site; then the same loop, on
# this rank's slice of every batch.


def fsdp2_worker(rank: guide.Rank) -> dict:
    model = sharding.wrap(build_model(CFG, device=rank.device), "FSDP2", rank)
    opt = make_optimizer("sgd", model.parameters())
    run = clipped_steps(model, opt, BATCHES, rank.rank, rank.world_size)
    return {**run, "params": full_state(model)}


results = guide.launch(fsdp2_worker, WORLD_SIZE)

# %%
# The checks
# ----------
# Every rank must report the *same* norm, equal to the reference's unsharded norm at that step, and
# the clipped run must match the clipped reference in losses and parameters. The ranks' local norms
# are not the norm: their squares add up to its square.
run = f"FSDP2 x{WORLD_SIZE}, SGD, clip {MAX_NORM}"
norm_gaps = []
for r, res in enumerate(results):
    if res["norm_placements"] != "(Replicate(),)":
        raise checks.CheckFailed(f"[clip norm] {run}: rank {r} got a norm with placements "
                                 f"{res['norm_placements']}, expected (Replicate(),).")
    gap = checks.max_abs_diff(REF["norms"], res["norms"])
    norm_gaps.append(gap)
    if not gap <= checks.LOSS_TOL:
        raise checks.CheckFailed(f"[clip norm] {run}: rank {r}'s clip_grad_norm_ differs from the "
                                 f"reference's unsharded norm by {gap:.1e} > {checks.LOSS_TOL:.0e}.")
norm_gap = max(norm_gaps)
loss_gap = checks.assert_losses_match(run, REF["losses"],
                                      mean_over_ranks([r["losses"] for r in results]))
param_gap = checks.assert_params_match(run, REF_PARAMS, results[0]["params"], checks.PARAM_TOL["sgd"])
pythagoras = max(abs(sum(r["local_norms"][s] ** 2 for r in results) ** 0.5 - REF["norms"][s])
                 for s in range(STEPS))
if not pythagoras <= checks.LOSS_TOL:
    raise checks.CheckFailed(f"[clip norm] {run}: the ranks' local norms do not combine to the "
                             f"reference norm (off by {pythagoras:.1e}): the shards do not partition "
                             "the gradient.")
print(f"norm returned by clip_grad_norm_: a DTensor with {results[0]['norm_placements']}")
print(f"{'step':>4}{'reference':>11}" + "".join(f"{f'rank {r}':>10}" for r in range(WORLD_SIZE))
      + "".join(f"{f'local r{r}':>10}" for r in range(WORLD_SIZE)))
for s in range(0, STEPS, 5):
    print(f"{s:>4}{REF['norms'][s]:>11.6f}" + "".join(f"{r['norms'][s]:>10.6f}" for r in results)
          + "".join(f"{r['local_norms'][s]:>10.6f}" for r in results))
print(f"\nmax |norm − reference norm| {norm_gap:.1e}; max |Δloss| {loss_gap:.1e}; "
      f"max |Δparam| {param_gap:.1e} (tol {checks.PARAM_TOL['sgd']:.0e}); "
      f"max |sqrt(Σ local²) − norm| {pythagoras:.1e}")

# %%
# The true norm and the local ones
# --------------------------------
# Per step: the reference's norm, the norm FSDP2's ``clip_grad_norm_`` returned, and what each rank
# would have computed from its own shards. Below the ``max_norm`` line (dash-dot) nothing is
# clipped.
fig = knob_plots.clip_norms(REF["norms"], {f"FSDP2 x{WORLD_SIZE}": results[0]["norms"]},
                            {f"rank {r}, own shards": res["local_norms"]
                             for r, res in enumerate(results)}, MAX_NORM)
plt.show()
