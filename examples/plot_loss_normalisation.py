"""
Loss normalisation with unequal token counts
============================================

.. admonition:: Verdict
   :class: tip

   When ranks see different numbers of tokens (padding, packing, variable-length data), do not
   average per-rank mean losses: FSDP2 (like DDP) averages the gradients over ranks, which trains
   on the mean of the ranks' means, not on the mean over all tokens. Here that gradient missed
   the single-process reference by
   :claim:`loss_norm.per_rank_mean.grad_gap` (relative to the largest gradient) and nothing
   failed. Sum the loss over tokens and divide by the global token count (one ``all_reduce`` of
   the count), then either multiply by the number of ranks, or make FSDP2 sum the gradients with
   ``set_gradient_divide_factor(1.0)`` on **every** unit (the call is not recursive). Both matched
   the reference to :claim:`loss_norm.global_mean_times_n.grad_gap` and
   :claim:`loss_norm.divide_factor_1.grad_gap`.

Measured on CPU gloo processes (a tiny model, two shared cores): every number here is measured.

A rank's mean loss divides by *its* token count. With ``N`` ranks holding ``n_r`` tokens each, the
objective the gradients follow is ``(1/N) Σ_r (1/n_r) Σ_{t ∈ r} ℓ_t``; the objective wanted is
``(1/n) Σ_t ℓ_t`` with ``n = Σ_r n_r``. They agree only when every ``n_r`` is equal: each token's
weight is off by ``n / (N n_r)``. Rank-equal batches of fixed-length sequences hide this; padded
variable-length sequences expose it, silently: the loss still falls.

This page trains the same model on the same variable-length batches five ways on 2 gloo ranks and
one process, compares the gradients of the first step and the parameters after the last with the
single-process reference, and **fails the docs build** unless the fixes match it, the per-rank
mean misses it by far more than the tolerance, and what the per-rank mean trains on is shown to be
the reweighted objective above.
"""

# %%
# The code to copy
# ----------------
# ``token_loss_sum`` is the summed cross-entropy over the real tokens (``IGNORE`` marks padding).
# ``global_tokens`` all-reduces this rank's count. FSDP2 divides the summed gradients by the
# number of ranks, so ``loss_global_mean`` multiplies by it; ``sum_gradients`` makes FSDP2 sum
# instead, and then ``loss_global_sum`` is the loss. On gloo a divide factor other than ``N``
# also needs ``set_force_sum_reduction_for_comms(True)``: gloo has no ``PREMUL_SUM`` reduction
# (NCCL has; there the call is optional).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

IGNORE = -100  # the target at a padded position


def token_loss_sum(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs).flatten(0, 1).float()
    return F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE, reduction="sum")


def global_tokens(targets: torch.Tensor) -> torch.Tensor:
    n = (targets != IGNORE).sum()
    dist.all_reduce(n)  # the tokens of the whole global batch, on every rank
    return n


def loss_per_rank_mean(model, inputs, targets):  # the silent bug with unequal token counts
    return token_loss_sum(model, inputs, targets) / (targets != IGNORE).sum()


def loss_global_mean(model, inputs, targets):  # fix 1: FSDP2 averages over ranks; undo it
    n = global_tokens(targets)
    return token_loss_sum(model, inputs, targets) * dist.get_world_size() / n


def sum_gradients(model: torch.nn.Module, modules=None) -> None:
    """Fix 2: FSDP2 sums gradients over ranks instead of averaging them. Every unit must be told
    (``modules`` defaults to all of them)."""
    for module in model.modules() if modules is None else modules:
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM


def loss_global_sum(model, inputs, targets):  # with sum_gradients(model)
    return token_loss_sum(model, inputs, targets) / global_tokens(targets)


# %%
# Variable-length data
# --------------------
# The site's synthetic sequences, each cut to its own length: positions past it are padding (their
# target is ``IGNORE``; attention is causal, so padding after a sequence never changes its real
# positions). The lengths are drawn at random and sorted, so rank 0's rows are long and rank 1's
# short: rank 0 holds about twice rank 1's tokens.
import dataclasses

import matplotlib.pyplot as plt
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checks, report, sharding
from guide.data import rank_slice, synthetic_batches
from guide.layout import full_state
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.sharding import Strategy
from guide.training import make_optimizer

PAGE = guide.Page(section="Configure FSDP2", order=5, key_api="set_gradient_divide_factor(",
                  world_size=2, supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig()
STEPS, B, T = 3, 8, 16
SETUP = dict(model="tinylm", optimizer="sgd", world_size=WORLD_SIZE, steps=STEPS, batch=B,
             seq_len=T)
TOKENS = synthetic_batches(steps=STEPS, batch_size=B, seq_len=T, vocab=CFG.vocab, seed=0)
_gen = torch.Generator().manual_seed(0)
LENGTHS = torch.randint(2, T + 1, (STEPS, B), generator=_gen).sort(dim=1, descending=True).values
INPUTS = TOKENS[:, :, :-1]
TARGETS = TOKENS[:, :, 1:].clone()
TARGETS[torch.arange(T).expand(STEPS, B, T) >= LENGTHS[..., None]] = IGNORE


def rank_tokens(step: int, rank: int) -> int:
    """Real tokens of ``rank``'s slice of step ``step``'s batch."""
    return int((rank_slice(TARGETS[step], rank, WORLD_SIZE) != IGNORE).sum())


counts = [[rank_tokens(s, r) for r in range(WORLD_SIZE)] for s in range(STEPS)]
report.show(report.table(
    [[f"rank {r}", *(PAGE.state(f"loss_norm.tokens.step{s}.rank{r}", counts[s][r], "tokens",
                                **SETUP) for s in range(STEPS))] for r in range(WORLD_SIZE)],
    ["rank", *(f"step {s} tokens" for s in range(STEPS))], title="Real tokens per rank"))
checks.expect("unequal tokens", "the data", min(max(c) / min(c) for c in counts) >= 1.5,
              f"per-rank token counts {counts}: the page needs them unequal (by half again).")

# %%
# The runs, and the single-process reference
# ------------------------------------------
# Each run trains ``STEPS`` SGD steps with FSDP2 and returns the full gradients of its first step
# and its final parameters. ``divide factor 1, root only`` is fix 2 applied to the root module
# alone (``model.set_gradient_divide_factor(1.0)``): the blocks keep averaging. The reference is
# one process on the whole batch with the loss wanted: summed over every real token, divided by
# their number (``F.cross_entropy``'s own mean with ``ignore_index``).


@dataclasses.dataclass(frozen=True)
class Run:
    label: str
    key: str
    loss: object  # one of the loss functions above
    divide: str = ""  # "", "all" or "root": where sum_gradients is applied


RUNS = (Run("per-rank mean (the bug)", "per_rank_mean", loss_per_rank_mean),
        Run("global mean x N", "global_mean_times_n", loss_global_mean),
        Run("global sum, divide factor 1", "divide_factor_1", loss_global_sum, "all"),
        Run("global sum, divide factor 1, root only", "root_only", loss_global_sum, "root"))


def train(rank: guide.Rank, run: Run) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    sharding.apply_fsdp2(model, mesh)
    if run.divide:
        sum_gradients(model, None if run.divide == "all" else [model])
    opt = make_optimizer("sgd", model.parameters())
    first_grads = None
    for step in range(STEPS):
        inputs, targets = (rank_slice(t[step], rank.rank, rank.world_size).to(rank.device)
                           for t in (INPUTS, TARGETS))
        opt.zero_grad(set_to_none=True)
        run.loss(model, inputs, targets).backward()
        if first_grads is None:
            first_grads = {name: p.grad.full_tensor().clone()
                           for name, p in model.named_parameters()}
        opt.step()
    return {"grads": first_grads, "params": full_state(model)}


def worker(rank: guide.Rank) -> dict:
    return {run.key: train(rank, run) for run in RUNS}


def reference(objective: str) -> dict:
    """One process, the whole batch. ``"tokens"``: the mean over every real token (the loss
    wanted); ``"rank means"``: the mean over rank slices of each slice's token mean (what the
    per-rank mean trains on, written out)."""
    model = build_model(CFG)
    opt = make_optimizer("sgd", model.parameters())
    first = None
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if objective == "tokens":
            loss = token_loss_sum(model, INPUTS[step], TARGETS[step]) / (
                TARGETS[step] != IGNORE).sum()
        else:
            slices = [tuple(rank_slice(t[step], r, WORLD_SIZE) for t in (INPUTS, TARGETS))
                      for r in range(WORLD_SIZE)]
            loss = sum(loss_per_rank_mean(model, i, t) for i, t in slices) / WORLD_SIZE
        loss.backward()
        if first is None:
            first = {name: p.grad.clone() for name, p in model.named_parameters()}
        opt.step()
    return {"grads": first, "params": full_state(model)}


per_rank = guide.launch(worker, WORLD_SIZE)
PAGE.state("loss_norm.divide_factor", 1.0, "", fmt=".1f")  # the factor the runs' labels name
REF = reference("tokens")
REWEIGHTED = reference("rank means")

# %%
# The gradients, against the reference
# ------------------------------------
# The largest gradient difference of the first step, relative to the reference's largest
# gradient, and the largest parameter difference after the last step. The fixes must match within
# the site's tolerances; the per-rank mean and the root-only divide factor must miss by more than
# a hundred times the tolerance: the gap is the bug, not rounding. What the per-rank mean computes
# must in turn match, to the same tolerances, one process training on the reweighted objective.
GRAD_TOL = 1e-6  # relative: fp32 reduction order, as checks.PARAM_TOL["sgd"] for parameters
PAGE.state("tolerance.grad_rel", GRAD_TOL, "", fmt=".0e")
scale = max(g.abs().max().item() for g in REF["grads"].values())


def grad_gap(grads: dict) -> float:
    return max((grads[n] - REF["grads"][n]).abs().max().item() for n in REF["grads"]) / scale


rows, gaps = [], {}
for run in RUNS:
    res = per_rank[0][run.key]
    name = f"FSDP2 x{WORLD_SIZE}, {run.label}"
    g = grad_gap(res["grads"])
    p = max((res["params"][n] - REF["params"][n]).abs().max().item() for n in REF["params"])
    if run.key in ("global_mean_times_n", "divide_factor_1"):
        gaps[run.key] = checks.expect_close("gradient equivalence", name, g, 0.0, GRAD_TOL,
                                            "relative gradient gap", against=checks.SINGLE_PROCESS)
        pcell = checks.assert_params_match(name, REF["params"], res["params"],
                                           checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
    else:
        gaps[run.key] = checks.expect_order("silent gap", name, 100 * GRAD_TOL, g,
                                            low_name="a hundred times the tolerance",
                                            high_name="relative gradient gap", keep="high")
        pcell = checks.expect_order("silent gap", name, 100 * checks.PARAM_TOL["sgd"], p,
                                    low_name="a hundred times the tolerance",
                                    high_name="parameter gap", keep="high")
    rows.append([run.label,
                 PAGE.check(f"loss_norm.{run.key}.grad_gap", gaps[run.key], fmt=".1e", **SETUP),
                 PAGE.check(f"loss_norm.{run.key}.param_gap", pcell, fmt=".1e", **SETUP)])
report.show(report.table(rows, ["loss", "max |Δgrad| / max |grad|", "max |Δparam|"],
                         formats={"max |Δgrad| / max |grad|": ".1e", "max |Δparam|": ".1e"},
                         title=f"Against one process on the whole batch (tolerance {GRAD_TOL:.0e})"))

bug = per_rank[0]["per_rank_mean"]
explained = checks.assert_params_match(
    f"FSDP2 x{WORLD_SIZE}, per-rank mean", REWEIGHTED["params"], bug["params"],
    checks.PARAM_TOL["sgd"], against="one process on the mean of the rank slices' means")
explained = PAGE.check("loss_norm.per_rank_mean.matches_reweighted", explained, fmt=".1e", **SETUP)
print(f"\nThe per-rank mean trains on the mean of the ranks' means: its parameters match one "
      f"process minimising that objective within {explained:.1e}.")

# %%
# Which fix
# ---------
#
# .. index::
#    ! set_gradient_divide_factor
#
# Both fixes compute the same gradient. ``x N`` keeps FSDP2's defaults and is one line in the
# loss; it is also what DDP needs (DDP averages too). ``set_gradient_divide_factor(1.0)`` states
# the intent in the model's setup instead, but must reach every unit: applied to the root alone
# it left the blocks averaging, and that run missed the reference as badly as the bug (the table
# above). The loss a rank prints under either fix is its share of the global mean, not a mean of
# its own tokens: sum it over ranks (divide factor 1) or average it (``x N``) to log the global
# mean. With equal token counts on every rank, all of this changes nothing: that is why the other
# pages of this site can average per-rank means.
PAGE.conclude(
    f"With unequal token counts, averaging per-rank mean losses missed the single-process "
    f"gradient by {gaps['per_rank_mean']:.1e} (relative) without an error; dividing the summed "
    f"loss by the global token count and multiplying by N matched it to "
    f"{gaps['global_mean_times_n']:.1e}, and set_gradient_divide_factor(1.0) on every unit to "
    f"{gaps['divide_factor_1']:.1e}. On the root only, the divide factor missed by "
    f"{gaps['root_only']:.1e}.")

# %%
# The gap in one figure
# ---------------------
# The first step's gradient gap per loss, on a log scale, against the tolerance: the two fixes
# sit below it, the per-rank mean and the root-only divide factor orders of magnitude above.
style()
fig, ax = plt.subplots(figsize=(8, 3.8))
values = [float(gaps[run.key]) for run in RUNS]
fixed = ("global_mean_times_n", "divide_factor_1")
for i, (run, v) in enumerate(zip(RUNS, values)):
    ax.barh(i, max(v, 1e-9), color=Strategy.FSDP2.color, alpha=1.0 if run.key in fixed else 0.45)
ax.axvline(GRAD_TOL, color="black", linestyle="--", linewidth=1, label="tolerance")
ax.set_xscale("log")
ax.set_yticks(range(len(RUNS)), [run.label for run in RUNS])
ax.invert_yaxis()
ax.set_xlabel("first step: max |Δgrad| / max |grad| against one process")
ax.legend(loc="lower right")
fig.suptitle(f"Per-rank means miss the global token mean ({WORLD_SIZE} gloo ranks)", fontsize=11)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
