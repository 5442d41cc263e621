"""
FSDP2 pitfalls, each one reproduced and guarded
===============================================

.. admonition:: Verdict
   :class: tip

   Check three silent mistakes first, since nothing fails: build the optimizer **after**
   ``fully_shard`` (before it, parameters move by :claim:`pitfalls.optimizer_first.param_change`),
   end with ``fully_shard(model)`` (without it the ranks drift apart by
   :claim:`pitfalls.no_root.drift`), and build with the **same seed** on every rank (otherwise
   the model is off by :claim:`pitfalls.seed_per_rank.gap`). The table below maps each symptom
   to its fix.

Measured on CPU gloo processes (tiny models, two shared cores); nothing on this page is predicted
for a GPU. Each section makes one mistake on purpose, shows its symptom as torch presents it (the
error or warning you would paste into a search box, or the number that is silently wrong), runs
the fix, and asserts both: **the wrong way must still go wrong** (else the build fails with
``[pitfall reproduces]`` naming the section to update), and **the right way must be right**
(equal to a single process, or counted to be what the semantics require). Under each section's
code, its outcome as the run printed it; the checks that produced it are in the page's source
(download it below) and :mod:`guide.pitfalls`.
"""

# %%
# The fix most pitfalls come back to, in plain PyTorch: ``fully_shard`` each block, then the root,
# with the same weights on every rank; build the optimizer after. The sections below call this.
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def apply_fsdp2(model: nn.Module, mesh, **options) -> nn.Module:
    """Each block its own group, then the root (pitfall 7); every rank built the same weights
    (pitfall 6); build the optimizer on what this returns (pitfall 1)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


# %%
# Symptom → fix
# -------------
# Each row links to its section; every symptom is reproduced there by this page's run.

# sphinx_gallery_start_ignore
from guide import report
from guide.report import Link

SYMPTOMS = [  # (section label, pitfall, symptom, fix)
    ("optimizer-first", "optimizer built before fully_shard", "none: the loss never moves",
     "build the optimizer after fully_shard"),
    ("tied-embeddings", "tied embeddings in two FSDP groups",
     "ValueError: ...already managed by another FSDP group (older torch: the tie breaks)",
     "fully_shard([model.tok_emb, model.head])"),
    ("inplace-output", "in-place op on an FSDP2 module's output",
     "UserWarning: ...returned a view tensor; RuntimeError: setStorage: ...", "y = y + x"),
    ("grad-norm", "local part of a gradient norm",
     "none: each rank reads its own, smaller norm", "p.grad.norm().full_tensor()"),
    ("no-sync", "DDP-style no_sync", "AttributeError: ...has no attribute 'no_sync'",
     "model.set_requires_gradient_sync(False)"),
    ("seed-per-rank", "different seeds on different ranks",
     "none: a patchwork of the ranks' models", "the same seed on every rank"),
    ("no-root", "no root fully_shard", "none: the ranks drift apart",
     "fully_shard(model) last"),
    ("meta-init", "meta-device init without a broadcast", "none: not the 1-process model",
     "set_model_state_dict(..., broadcast_from_rank0=True)"),
    ("reshard-default", "reshard_after_forward=True everywhere",
     "none: one more all-gather per step", "leave the default, None"),
    ("other-method", "a method other than forward",
     "RuntimeError: ...got mixed torch.Tensor and DTensor",
     "register_fsdp_forward_method(model, name)"),
]
report.show(report.table([[Link(name, f"#pitfalls-{label}"), symptom, fix]
                          for label, name, symptom, fix in SYMPTOMS],
                         ["pitfall", "symptom", "fix"]))
# sphinx_gallery_end_ignore

# %%
# Setup
# -----
# The site's model with 2 blocks (:class:`guide.model.TinyLM`), SGD, and a few global batches of
# token sequences, each rank taking its own slice. The single-process references run here, in this
# process, on the full batches. Each section runs one short job on the ranks
# (:func:`run_pitfall`); the checks that decide "the wrong way still goes wrong" are
# :mod:`guide.pitfalls`, each tested on a run that did *not* go wrong.
import contextlib
import inspect
import re

import matplotlib.pyplot as plt
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.fsdp import register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import checks, comm, plotting, sharding
from guide.comm import CollectiveLog
from guide.data import micro_batches, rank_slice, synthetic_batches
from guide.layout import chunk_sizes, full_state, local_tensor, param_layouts
from guide.model import ModelConfig, TinyLM, build_model
from guide.pitfalls import (assert_differs, assert_frozen, assert_partial,
                            assert_reproduces, caught, torch_source_says)
from guide.training import make_optimizer, mean_over_ranks, next_token_loss, train_steps
from guide.reference import reference_run

PAGE = guide.Page(section="Migrate and pitfalls", order=2, key_api="fully_shard(", world_size=2,
                  supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig(n_layers=2)
STEPS = 3
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab)
REFERENCE = reference_run(CFG, "sgd", BATCHES)  # (losses, final params), one process
checks.assert_learns("reference", REFERENCE[0])
# fp32 gradients differ from 1 process's by reduction order only
GRAD_TOL = checks.PARAM_TOL["sgd"]
PARAMS = PAGE.state("tinylm.2-blocks.params",
                    sum(p.numel() for p in build_model(CFG).parameters()),
                    "parameters")
RUN = dict(model="tinylm-2-blocks", optimizer="sgd", world_size=WORLD_SIZE)


def gap(name: str, value: float, unit: str, check: str, **assumptions) -> float:
    """Record a measured gap as this page prints it (2 digits), with the check that measured
    it (a gap no check returned is computed)."""
    if isinstance(value, checks.Checked):
        return PAGE.check(f"pitfalls.{name}", value, unit, fmt=".1e", **{**RUN, **assumptions})
    return PAGE.state(f"pitfalls.{name}", value, unit, fmt=".1e", **{**RUN, **assumptions})


print(f"torch {torch.__version__}, {WORLD_SIZE} ranks, TinyLM with {CFG.n_layers} "
      f"blocks, {PARAMS:,} parameters")


# %%
# One short job per section: ``run_pitfall(worker)`` runs ``worker`` on every rank and adds what
# each rank returned to ``results`` (``R``: rank 0's), so each outcome shows under its own code.
results = [{} for _ in range(WORLD_SIZE)]
R = results[0]  # rank 0's view; sections that compare ranks read `results`


def run_pitfall(worker) -> None:
    for mine, got in zip(results, guide.launch(worker, WORLD_SIZE)):
        mine.update(got)


# %%
# .. _pitfalls-optimizer-first:
#
# 1. The optimizer built before ``fully_shard``
# ---------------------------------------------
# ``fully_shard`` replaces every parameter of the module with a new ``nn.Parameter`` wrapping a
# ``DTensor`` shard (``FSDPParam._init_sharded_param`` in
# ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``). An optimizer built earlier holds the
# *old* tensors: no gradient ever reaches them, ``step()`` skips parameters without a gradient, and
# training does nothing, without an error or a warning. The fix is the order: shard, then build the
# optimizer. The wrong way trains on one batch repeated, so a loss that does not move is the
# symptom, not a change of data. Two variants freeze only the root's parameters while the loss
# still falls (the optimizer built between the blocks' and the root's ``fully_shard``, or after a
# forward): see :ref:`order mistakes <whenbreaks-order>` on the page about hangs.
ONE_BATCH = BATCHES[:1].expand(5, -1, -1)  # the same global batch, 5 times
ONE_BATCH_REFERENCE = reference_run(CFG, "sgd", ONE_BATCH)


def optimizer_first(rank: guide.Rank, mesh, build_optimizer_first: bool) -> dict:
    model = build_model(CFG, device=rank.device)
    if build_optimizer_first:
        opt = make_optimizer("sgd", model.parameters())  # WRONG: the plain tensors
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if not build_optimizer_first:
        opt = make_optimizer("sgd", model.parameters())  # right: the DTensor parameters
    before = full_state(model)
    losses, messages = caught(train_steps, model, opt, ONE_BATCH, rank)
    return {"before": before, "after": full_state(model), "losses": losses,
            "messages": messages}


def pitfall_1(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"1 wrong": optimizer_first(rank, mesh, build_optimizer_first=True),
        "1 right": optimizer_first(rank, mesh, build_optimizer_first=False)}


run_pitfall(pitfall_1)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "1. optimizer before fully_shard"
wrong, right = R["1 wrong"], R["1 right"]
assert_frozen(run, wrong["before"], wrong["after"], wrong["losses"], wrong["messages"])
WAYS = {"optimizer first": "1 wrong", "fully_shard first": "1 right"}
curves = {way: mean_over_ranks([res[key]["losses"] for res in results])
          for way, key in WAYS.items()}
curves["1 process"] = ONE_BATCH_REFERENCE[0]
checks.assert_learns(run + " (fixed)", curves["fully_shard first"])
checks.assert_losses_match(run + " (fixed)", curves["1 process"],
                           curves["fully_shard first"], against=checks.SINGLE_PROCESS)
checks.assert_params_match(run + " (fixed)", ONE_BATCH_REFERENCE[1], right["after"],
                           checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
PAGE.show("pitfalls.optimizer_first.losses", [[s, *(c[s] for c in curves.values())]
                    for s in range(len(ONE_BATCH))],
                   ["step", *curves], formats=dict.fromkeys(curves, ".4f"),
                   title=f"loss on the same global batch (mean over ranks), "
                         f"{len(ONE_BATCH)} SGD steps",
                   **RUN)
moved = max((wrong["after"][k] - wrong["before"][k]).abs().max().item()
            for k in wrong["before"])
# computed: assert_frozen above checked both are exactly 0 (a bound of 0 is no allowance, so
# the ledger cannot hold it as asserted)
FROZEN = dict(steps=len(ONE_BATCH), **RUN)
said = PAGE.state("pitfalls.optimizer_first.messages", len(wrong["messages"]),
                  "messages", guard="computed", **FROZEN)
moved = PAGE.state("pitfalls.optimizer_first.param_change", moved, "absolute",
                   guard="computed", **FROZEN)
# the last step's loss is the untrained model's: the 1-process loss before its first step
stuck = PAGE.check("pitfalls.optimizer_first.loss", checks.expect_close(
    "pitfall reproduces", run, curves["optimizer first"][-1], ONE_BATCH_REFERENCE[0][0],
    checks.LOSS_TOL, what="last loss", unit="nats",
    against="the 1-process loss at initialisation"), fmt=".4f", **FROZEN)
print(f"\nthe wrong run: {said} warnings or errors; largest parameter change "
      f"{moved:.1e}")
# sphinx_gallery_end_ignore

# %%
# The loss, step by step: the wrong way is a flat line.

# sphinx_gallery_start_ignore
plotting.style()
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(curves["1 process"], color=plotting.REFERENCE_COLOR, lw=5, alpha=0.3,
        label="1 process")
ax.plot(curves["fully_shard first"], "o-", color=sharding.Strategy.FSDP2.color,
        label=f"optimizer built after fully_shard, {WORLD_SIZE} ranks")
ax.plot(curves["optimizer first"], "s--", color="black",
        label=f"optimizer built before fully_shard, {WORLD_SIZE} ranks")
ax.set_xlabel("SGD step (same batch every step)")
ax.set_ylabel("training loss (nats/token)")
ax.set_title("Optimizer built before fully_shard: the loss never moves")
ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
ax.legend()
plt.show()
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-tied-embeddings:
#
# 2. Tied embeddings in two FSDP groups
# -------------------------------------
# Many language models use one matrix as the token embedding and the output head
# (``head.weight = tok_emb.weight``). Sharding the embedding in its own group, as per-module
# wrapping policies do, puts the shared parameter in two groups. torch 2.13's FSDP2 refuses at its
# lazy init, the first forward (``FSDPState._validate_no_duplicate_params`` in ``_fsdp_state.py``,
# added by pytorch #176257; reports: accelerate #4171, torchtitan #2495). Older releases
# (torch 2.9, the floor here) say nothing: the first ``fully_shard`` replaces ``tok_emb.weight``
# with a DTensor, ``head.weight`` keeps the old tensor, and the tie is silently broken (measured
# below when this page runs on such a torch; on torch 2.13 the page shows the refusal instead).
# The fix is torch's own advice: one group for both modules,
# ``fully_shard([model.tok_emb, model.head])`` (leaving both to the root works too). The right way
# below also builds the model on the ``meta`` device, shards it, materialises it with ``to_empty``
# and loads rank 0's weights, then trains: the tie must survive all of it, and the gradient of the
# shared matrix (embedding part plus head part) must be reduced once, as one process computes it.


def tie(model: TinyLM) -> TinyLM:
    model.head.weight = model.tok_emb.weight
    return model


def tied_reference() -> tuple[list[float], dict]:
    """One process trains the tied model: (losses, final parameters)."""
    model = tie(build_model(CFG))
    losses = train_steps(model, make_optimizer("sgd", model.parameters()), BATCHES)
    return losses, full_state(model)


TIED_INIT = tie(build_model(CFG)).state_dict()
TIED_REFERENCE = tied_reference()


def tied_embeddings(rank: guide.Rank, mesh) -> dict:
    wrong = tie(build_model(CFG, device=rank.device))
    fully_shard(wrong.tok_emb, mesh=mesh)  # WRONG: the tied weight's own group...
    apply_fsdp2(wrong, mesh)  # ...and the root's (which owns head)
    _, messages = caught(wrong, BATCHES[0, :, :-1].to(rank.device))
    broken = None
    if not messages:  # a torch without the check: it trains; measure what
        opt = make_optimizer("sgd", wrong.parameters())
        losses, said = caught(train_steps, wrong, opt, BATCHES, rank)
        broken = {"tied": wrong.head.weight is wrong.tok_emb.weight, "losses": losses,
                  "messages": said, "params": full_state(wrong)}

    with torch.device("meta"):
        model = tie(TinyLM(CFG))
    fully_shard([model.tok_emb, model.head], mesh=mesh)  # right: one group for the pair
    apply_fsdp2(model, mesh)
    tied = {"after fully_shard": model.head.weight is model.tok_emb.weight}
    model.to_empty(device=rank.device)
    tied["after to_empty"] = model.head.weight is model.tok_emb.weight
    from_rank0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, TIED_INIT if rank.is_main else {}, options=from_rank0)
    opt = make_optimizer("sgd", model.parameters())
    losses = train_steps(model, opt, BATCHES, rank)
    tied["after training"] = model.head.weight is model.tok_emb.weight
    return {"messages": messages, "tied": tied, "losses": losses,
            "params": full_state(model), "broken": broken}


def pitfall_2(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"2": tied_embeddings(rank, mesh)}


run_pitfall(pitfall_2)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "2. tied embeddings"
if torch_source_says("already managed by another FSDP group"):
    error = assert_reproduces(run, R["2"]["messages"],
                              "is shared with a parameter already managed by "
                              "another FSDP group")
    symptom, outcome = "ValueError: ...already managed by another FSDP group", "raises"
else:  # an older torch: no error, and the tie is broken
    broken = R["2"]["broken"]
    checks.expect("pitfall reproduces", run,
                  broken is not None and not broken["tied"] and not broken["messages"],
                  f"torch {torch.__version__}: {broken}")
    worst = assert_differs(run, TIED_REFERENCE[1], broken["params"],
                           checks.PARAM_TOL["sgd"])
    error = (f"torch {torch.__version__} says nothing; head.weight is no longer "
             f"tok_emb.weight, and {STEPS} steps later the model is off the tied "
             f"one by up to {worst:.1e}")
    symptom, outcome = "none: the tie breaks silently", "untied"
print(error)
for r, res in enumerate(results):
    checks.expect("tie kept", run + " (fixed)", all(res["2"]["tied"].values()),
                  f"rank {r}: {res['2']['tied']}")
checks.assert_learns(run + " (fixed)", R["2"]["losses"])
tied_losses = mean_over_ranks([res["2"]["losses"] for res in results])
tied_loss_gap = checks.assert_losses_match(run + " (fixed)", TIED_REFERENCE[0],
                                           tied_losses, against=checks.SINGLE_PROCESS)
tied_param_gap = checks.assert_params_match(run + " (fixed)", TIED_REFERENCE[1],
                                            R["2"]["params"], checks.PARAM_TOL["sgd"],
                                            against=checks.SINGLE_PROCESS)
tied_loss_gap = gap("tied_embeddings.fixed.loss_gap", tied_loss_gap, "nats",
                    "loss equivalence", steps=STEPS)
tied_param_gap = gap("tied_embeddings.fixed.param_gap", tied_param_gap, "absolute",
                     "parameter equivalence", steps=STEPS)
print(f"\nfully_shard([tok_emb, head]): head.weight is tok_emb.weight "
      f"{R['2']['tied']}; against the tied single-process model: max |Δloss| "
      f"{tied_loss_gap:.1e}, max |Δparam| {tied_param_gap:.1e}")
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-inplace-output:
#
# 3. An in-place op on an FSDP2 module's output
# ---------------------------------------------
# FSDP2 runs a module's backward all-gather from a hook it registers on the module's *outputs*
# (``FSDPState._register_pre_backward_hook`` in ``_fsdp_state.py``). If an output is a view and the
# caller modifies it in place (``y += x``, a residual written the short way), autograd rebases the
# view's history and the hook is no longer on the backward path: the parameters are not gathered
# again. torch 2.13 warns at every such forward. What happens next depends on
# ``reshard_after_forward``; both are measured below. The model is the smallest that shows it:
# three linear layers whose ``forward`` returns a view, each in its own ``fully_shard`` group, with
# residual connections. The fix is out of place: ``y = y + x``.
class ViewOut(nn.Module):
    """A linear layer whose output is a view (as any ``.view``/``.transpose`` at the
    end makes)."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).view(-1, x.shape[-1])


class Residual(nn.Module):
    def __init__(self, inplace: bool, n: int = 3) -> None:
        super().__init__()
        self.layers, self.inplace = nn.ModuleList(ViewOut() for _ in range(n)), inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            y = layer(x)
            if self.inplace:
                y += x  # WRONG: in place, on the view FSDP2 hooked
            else:
                y = y + x  # right
            x = y
        return x


def residual(inplace: bool) -> Residual:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Residual(inplace)


def residual_input(rank: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))


def residual_grads(model: nn.Module, x: torch.Tensor) -> dict:
    model(x).pow(2).mean().backward()
    return {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
            for n, p in model.named_parameters()}


RESIDUAL_REFERENCE = residual_grads(
    residual(False), torch.cat([residual_input(r) for r in range(WORLD_SIZE)]))


def inplace_output(rank: guide.Rank, mesh) -> dict:
    out = {}
    for name, inplace, reshard in (("in place", True, None),
                                   ("in place, no reshard", True, False),
                                   ("out of place", False, None)):
        model = residual(inplace).to(rank.device)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh)
        x = residual_input(rank.rank).to(rank.device)
        grads, messages = caught(residual_grads, model, x)
        types = sorted({type(p.grad).__name__ for p in model.parameters()})
        out[name] = {"grads": grads, "messages": messages,
                     "grad types": None if grads is None else types}
    return out


def pitfall_3(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"3": inplace_output(rank, mesh)}


run_pitfall(pitfall_3)

# %%
# **Outcome.** The warning comes first, at every forward of a module whose output is a view
# (printed once here). With the default ``reshard_after_forward`` (``True`` for the layers) their
# parameters were freed after forward and never gathered again: backward fails, reading a freed
# storage. With ``reshard_after_forward=False`` the parameters were never freed, so the missing
# all-gather goes unnoticed: here backward runs and the gradients are right (measured), which hides
# the bug until someone turns resharding back on. Out of place, every gradient equals the
# single-process one either way.

# sphinx_gallery_start_ignore
run = "3. in-place op on an FSDP2 output"
res = R["3"]
error = assert_reproduces(run, res["in place"]["messages"], "RuntimeError")
if torch_source_says("returned a view tensor"):
    warning = assert_reproduces(run, res["in place"]["messages"], "returned a view tensor")
else:
    warning = f"(torch {torch.__version__} gives no warning first)"
print(warning, error, sep="\n\n")
# the sizes torch names are a layer's freed weight: d x d fp32 elements, 4 bytes each
said = re.search(r"itemsize (\d+) requiring a storage size of (\d+)", error)
if said:
    weight = residual(False).layers[0].lin.weight
    RESIDUAL_RUN = dict(model="residual-3-linear", optimizer="none", world_size=WORLD_SIZE)
    for claim, got, want, what in (("itemsize", said[1], weight.element_size(), "itemsize"),
                                   ("storage_bytes", said[2],
                                    weight.numel() * weight.element_size(), "storage size")):
        PAGE.check(f"pitfalls.inplace_output.error.{claim}", checks.expect_close(
            "pitfall reproduces", run, int(got), want, 0, what=what, unit="bytes",
            against="the layer's fp32 weight"), fmt=".0f", **RESIDUAL_RUN)
checks.expect("hidden by no reshard", run,
              res["in place, no reshard"]["grads"] is not None,
              f"backward failed: {res['in place, no reshard']['messages']}")
hidden_gap = checks.assert_params_match(
    run + ", reshard_after_forward=False", RESIDUAL_REFERENCE,
    res["in place, no reshard"]["grads"], GRAD_TOL, check="gradients",
    against="one process's gradients")
fixed_gap = checks.assert_params_match(run + " (fixed)", RESIDUAL_REFERENCE,
                                       res["out of place"]["grads"], GRAD_TOL,
                                       check="gradients", against="one process's gradients")
RESIDUAL = dict(model="residual-3-linear", optimizer="none")
gaps = {"in place": "raised",
        "in place, no reshard": gap("inplace_output.no_reshard.grad_gap", hidden_gap,
                                    "absolute", "gradients", **RESIDUAL),
        "out of place": gap("inplace_output.fixed.grad_gap", fixed_gap, "absolute",
                            "gradients", **RESIDUAL)}
report.show(report.table([[name, ", ".join(r["grad types"] or ["-"]), gaps[name]]
                    for name, r in res.items()],
                   ["run", "gradient types", "max |Δgrad|"],
                   formats={"max |Δgrad|": ".1e"}))
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-grad-norm:
#
# 4. Reading the local part of a gradient norm
# --------------------------------------------
# Under FSDP2 a gradient is a ``DTensor`` sharded over the ranks. ``p.grad.norm()`` returns a
# ``DTensor`` too, with a *partial* placement (``_NormPartial``): each rank holds the norm of its
# own shard, and only a reduction makes the norm. Reading it with ``.to_local()`` or through the
# local tensor (per-layer gradient-norm logging does) gives each rank a different, too small number;
# the squares of the ranks' values add up to the square of the norm. ``.full_tensor()`` reduces.
# pytorch #170862 reported the same for the total norm ``clip_grad_norm_`` returns (torch 2.9);
# torchtitan #766 for logged norms. On torch 2.13 ``clip_grad_norm_`` returns a replicated
# ``DTensor`` whose local value is the norm; on torch 2.9 it is still partial. The page asserts
# whichever this torch returns: the norm itself, or parts that add up to it. (The clipping itself
# is the subject of the gradient-clipping page.)
GRAD_MODEL = build_model(CFG)
next_token_loss(GRAD_MODEL, BATCHES[0]).backward()
NORM_REFERENCE = {n: p.grad.norm().item() for n, p in GRAD_MODEL.named_parameters()}
TOTAL_NORM_REFERENCE = torch.nn.utils.get_total_norm(
    [p.grad for p in GRAD_MODEL.parameters()]).item()


def grad_norms(rank: guide.Rank, mesh) -> dict:
    model = apply_fsdp2(build_model(CFG, device=rank.device), mesh)
    tokens = rank_slice(BATCHES[0], rank.rank, rank.world_size)
    next_token_loss(model, tokens).backward()
    norms = {n: p.grad.norm() for n, p in model.named_parameters()}
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf"))
    return {"placements": {str(n.placements) for n in norms.values()},
            "local": {n: v.to_local().item() for n, v in norms.items()},  # WRONG
            "full": {n: v.full_tensor().item() for n, v in norms.items()},  # right
            "clip placements": str(total.placements),
            "clip local": total.to_local().item(),
            "clip full": total.full_tensor().item()}


def pitfall_4(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"4": grad_norms(rank, mesh)}


run_pitfall(pitfall_4)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "4. local part of a norm"
checks.expect("pitfall reproduces", run,
              all(len(res["4"]["placements"]) == 1 and
                  next(iter(res["4"]["placements"])).startswith("(_NormPartial(")
                  for res in results),
              f"p.grad.norm() placements {R['4']['placements']}")
rows = []
for name, ref in NORM_REFERENCE.items():
    local = [res["4"]["local"][name] for res in results]
    assert_partial(f"{run}: {name}", local, R["4"]["full"][name], checks.LOSS_TOL)
    checks.expect_close("gradient norm", run + " (fixed)",
                        [res["4"]["full"][name] for res in results], [ref] * WORLD_SIZE,
                        checks.LOSS_TOL, what=f"{name}.grad.norm().full_tensor()")
    rows.append([name, ref, R["4"]["full"][name], *local])
norms = ["1 process", "full_tensor()", *(f"to_local() r{r}" for r in range(WORLD_SIZE))]
PAGE.show("pitfalls.grad_norm.by_parameter", rows[:4] + rows[-1:], ["parameter", *norms],
          formats=dict.fromkeys(norms, ".5f"), step=0, **RUN)
clip_local = [res["4"]["clip local"] for res in results]
if R["4"]["clip placements"].startswith("(_NormPartial("):  # pytorch #170862 (2.9)
    assert_partial(run + ": clip_grad_norm_", clip_local, TOTAL_NORM_REFERENCE,
                   checks.LOSS_TOL)
else:
    checks.expect("pitfall reproduces", run,
                  R["4"]["clip placements"] == "(Replicate(),)",
                  f"clip_grad_norm_ returns {R['4']['clip placements']}")
    checks.expect_close("gradient norm", run, clip_local,
                        [TOTAL_NORM_REFERENCE] * WORLD_SIZE, checks.LOSS_TOL,
                        what="clip_grad_norm_")
total = PAGE.check("pitfalls.grad_norm.total", checks.expect_close(
    "gradient norm", run, R["4"]["clip full"], TOTAL_NORM_REFERENCE, checks.LOSS_TOL,
    what="clip_grad_norm_(...).full_tensor()", unit="gradient 2-norm",
    against="the 1-process total norm"), fmt=".5f", step=0, **RUN)
print(f"\np.grad.norm() placements: {next(iter(R['4']['placements']))}; "
      f"clip_grad_norm_ returns {R['4']['clip placements']}: its to_local() on rank 0, "
      f"{R['4']['clip local']:.5f}, is "
      f"{'a part of the' if 'Partial' in R['4']['clip placements'] else 'the'} norm "
      f"(the norm: {total:.5f}, as 1 process)")
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-no-sync:
#
# 5. A DDP-style ``no_sync`` that does nothing
# --------------------------------------------
# Gradient accumulation code written for DDP skips the gradient all-reduce on all but the last
# micro-batch with ``with model.no_sync():`` (which sets ``model.require_backward_grad_sync``).
# An FSDP2 module has no ``no_sync``; code that guards it with ``isinstance(model, DDP)``, as
# NVIDIA/cosmos-framework #161 shipped, silently reduces every micro-batch, and setting
# ``require_backward_grad_sync`` on an FSDP2 module just creates an attribute nobody reads. The
# result is still correct, but every micro-batch pays a full reduce-scatter. The FSDP2 call is
# ``model.set_requires_gradient_sync(False)`` (``FSDPModule`` in ``_fully_shard.py``; the
# gradient-accumulation page measures what it costs in memory). Counted with
# :class:`guide.comm.CollectiveLog`, over ``K`` micro-batches per step:
K = 2


def skip_sync(rank: guide.Rank, mesh, fsdp2_way: bool) -> dict:
    model = apply_fsdp2(build_model(CFG, device=rank.device), mesh)
    _, messages = caught(lambda: model.no_sync())  # DDP's API
    opt = make_optimizer("sgd", model.parameters())
    with CollectiveLog(model) as log:
        for micro in micro_batches(BATCHES, K):
            opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(micro):
                last = i == K - 1
                skip = contextlib.nullcontext()
                if fsdp2_way:
                    model.set_requires_gradient_sync(last)  # right
                else:  # WRONG: DDP's switches; the guard is False, the flag unread
                    if isinstance(model, DDP) and not last:
                        skip = model.no_sync()
                    model.require_backward_grad_sync = last
                with skip:
                    tokens = rank_slice(batch, rank.rank, rank.world_size)
                    (next_token_loss(model, tokens) / K).backward()
            opt.step()
    return {"messages": messages,
            "reduce_scatters": log.count("reduce_scatter") / STEPS,
            "params": full_state(model)}


def pitfall_5(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"5 wrong": skip_sync(rank, mesh, fsdp2_way=False),
        "5 right": skip_sync(rank, mesh, fsdp2_way=True)}


run_pitfall(pitfall_5)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "5. DDP-style no_sync"
wrong, right = R["5 wrong"], R["5 right"]
error = assert_reproduces(run, wrong["messages"], "object has no attribute 'no_sync'")
units = len(sharding.fsdp2_units(build_model(CFG)))
ACCUMULATE = dict(micro_batches=K, **RUN)
calls = {  # reduce-scatters per step: one per group per micro-batch, or once per step
    "no_sync / require_backward_grad_sync": PAGE.check(
        "pitfalls.no_sync.ddp_style.reduce_scatters_per_step", checks.expect_close(
            "pitfall reproduces", run, wrong["reduce_scatters"], K * units, 0,
            what="reduce-scatters per step", unit="calls",
            against="one per fully_shard group per micro-batch"), fmt=".0f", **ACCUMULATE),
    "set_requires_gradient_sync(False)": PAGE.check(
        "pitfalls.no_sync.fixed.reduce_scatters_per_step", checks.expect_close(
            "comm calls", run + " (fixed)", right["reduce_scatters"], units, 0,
            what="reduce-scatters per step", unit="calls",
            against="one per fully_shard group"), fmt=".0f", **ACCUMULATE),
}
for name, r in (("DDP-style", wrong), ("set_requires_gradient_sync", right)):
    checks.assert_params_match(f"{run}, {name}", REFERENCE[1], r["params"],
                               checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
units = PAGE.state("tinylm.2-blocks.fsdp2_units", units, "fully_shard groups")
print(error)
report.show(report.table(list(calls.items()),
                   ["gradient sync skipped with", "reduce-scatters per step"],
                   title=f"{K} micro-batches per step, {units} fully_shard groups; "
                   "both runs end at the 1-process parameters"))
ddp_style = calls["no_sync / require_backward_grad_sync"]
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-seed-per-rank:
#
# 6. Different seeds on different ranks
# -------------------------------------
# DDP broadcasts rank 0's weights when it wraps the model; ``fully_shard`` does not broadcast
# anything: each rank keeps *its own rows* of whatever it built (``FSDPParam._init_sharded_param``
# takes this rank's ``torch.chunk`` of the local tensor, no collective). Seed each rank differently
# (``torch.manual_seed(rank)``, a common data-loading habit) and the model the ranks jointly hold is
# a patchwork: rows of rank 0's model, then rows of rank 1's, a model no process ever built. Nothing
# fails; the run is just not the one you seeded. The fix: build with the same seed everywhere (or
# load one checkpoint).


def seeds(rank: guide.Rank, mesh, same_seed: bool) -> dict:
    seed = 0 if same_seed else rank.rank  # WRONG when it depends on the rank
    model = apply_fsdp2(build_model(CFG, seed=seed, device=rank.device), mesh)
    return full_state(model)


def pitfall_6(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"6 wrong": seeds(rank, mesh, same_seed=False),
        "6 right": seeds(rank, mesh, same_seed=True)}


run_pitfall(pitfall_6)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "6. seed per rank"
initial = full_state(build_model(CFG))
seed_gap = assert_differs(run, initial, R["6 wrong"], 0.0)
seeded = {r: build_model(CFG, seed=r).tok_emb.weight for r in range(WORLD_SIZE)}
chunks = chunk_sizes(CFG.vocab, WORLD_SIZE)
patch = torch.cat([seeded[r][sum(chunks[:r]):sum(chunks[:r + 1])]
                   for r in range(WORLD_SIZE)])
checks.expect("pitfall reproduces", run,
              torch.equal(R["6 wrong"]["tok_emb.weight"], patch),
              "the jointly held tok_emb is not rank r's rows of seed r's model")
checks.assert_same_init(run + " (fixed)", initial, R["6 right"])
origin = ", ".join(f"rank {r}'s chunk of rows from seed {r}" for r in range(WORLD_SIZE))
# the gap one process predicts: every parameter's rows cut as fully_shard cuts dim 0, rank r's
# from seed r's model, against the seed-0 model
by_seed = [full_state(build_model(CFG, seed=r)) for r in range(WORLD_SIZE)]


def patchwork(name: str) -> torch.Tensor:
    sizes = chunk_sizes(by_seed[0][name].shape[0], WORLD_SIZE)
    return torch.cat([by_seed[r][name][sum(sizes[:r]):sum(sizes[:r + 1])]
                      for r in range(len(sizes))])


predicted_gap = max((patchwork(n).double() - t.double()).abs().max().item()
                    for n, t in initial.items())
seed_gap = PAGE.check("pitfalls.seed_per_rank.gap", checks.expect_close(
    "pitfall reproduces", run, seed_gap, predicted_gap, 0, what="worst gap to seed 0",
    unit="absolute", against="the patchwork of seeds built in one process"), fmt=".2f", **RUN)
print(f"tok_emb.weight as the ranks hold it: {origin}; worst gap to the seed-0 model "
      f"{seed_gap:.2f}")
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-no-root:
#
# 7. Forgetting the root ``fully_shard``
# --------------------------------------
# ``fully_shard`` on the blocks alone leaves the embeddings, the final norm and the head as plain
# tensors, full size on every rank. Worse, nothing reduces their gradients: no DDP wraps them and no
# FSDP group owns them, so each rank updates them from its own slice of the batch and the ranks'
# copies drift apart. And each block, now a root itself, keeps its parameters unsharded from forward
# to backward (a root's ``reshard_after_forward`` default is ``False``, ``FSDPState._lazy_init``).
# The fix is the last line of every FSDP2 recipe: ``fully_shard(model, mesh=mesh)``.


def root_shard(rank: guide.Rank, mesh, shard_root: bool) -> dict:
    model = build_model(CFG, device=rank.device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    if shard_root:
        fully_shard(model, mesh=mesh)  # the line that is missing in the wrong way
    opt = make_optimizer("sgd", model.parameters())
    with CollectiveLog(model) as log:
        losses = train_steps(model, opt, BATCHES, rank)
    return {"losses": losses, "params": full_state(model),
            "layouts": param_layouts(model, rank.rank),
            "param_bytes": sum(local_tensor(p).nbytes for p in model.parameters()),
            "all_gathers": log.count("all_gather") / STEPS,
            "reduce_scatters": log.count("reduce_scatter") / STEPS}


def pitfall_7(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"7 wrong": root_shard(rank, mesh, shard_root=False),
        "7 right": root_shard(rank, mesh, shard_root=True)}


run_pitfall(pitfall_7)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "7. no root fully_shard"
wrong, right = R["7 wrong"], R["7 right"]
plain = sorted({lay.name for lay in wrong["layouts"] if not lay.is_dtensor})
drift = assert_differs(run, results[0]["7 wrong"]["params"],
                       results[1]["7 wrong"]["params"], 0.0)
# each block is a root: kept until backward
blocks_only = [comm.FSDPGroup.of(b.parameters(), reshard_after_forward=False)
               for b in build_model(CFG).blocks]
ROOT_CALLS = {}  # (way, kind): measured calls per step, checked against guide.comm's
for name, r, groups in (("blocks only", wrong, blocks_only),
                        ("blocks + root", right, comm.fsdp2_groups(build_model(CFG)))):
    model_calls = comm.fsdp2_step(groups, WORLD_SIZE)
    for kind in ("all_gather", "reduce_scatter"):
        ROOT_CALLS[name, kind] = checks.expect_close(
            "comm calls", f"{run}, {name}", r[kind + "s"],
            sum(c.kind == kind for c in model_calls), 0, what=f"{kind}s per step",
            unit="calls", against="guide.comm for these fully_shard groups")
checks.assert_sharded(run + " (fixed)",
                      [lay for res in results for lay in res["7 right"]["layouts"]],
                      WORLD_SIZE)
checks.assert_ranks_agree(run + " (fixed)",
                          [res["7 right"]["params"] for res in results])
checks.assert_params_match(run + " (fixed)", REFERENCE[1], right["params"],
                           checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
drift = gap("no_root.drift", drift, "absolute", "pitfall reproduces", steps=STEPS)
print(f"plain, unreduced tensors without the root call: {plain}")
print(f"after {STEPS} steps the ranks' copies differ by up to {drift:.1e}\n")


def root_row(name: str, prefix: str, r: dict) -> list:
    """One row of the table below, each number recorded."""
    kib = PAGE.state(f"{prefix}.params_kib_rank0", round(r["param_bytes"] / 2**10, 1),
                     "KiB", precision="fp32", **RUN)
    return [name, kib,
            *(PAGE.check(f"{prefix}.{kind}s_per_step", ROOT_CALLS[name, kind], fmt=".0f")
              for kind in ("all_gather", "reduce_scatter"))]


report.show(report.table([root_row("blocks only", "pitfalls.no_root", wrong),
                    root_row("blocks + root", "tinylm.2-blocks.fsdp2", right)],
                   ["fully_shard on", "params on rank 0 (KiB)", "all-gathers/step",
                    "reduce-scatters/step"], formats={"params on rank 0 (KiB)": ".1f"}))
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-meta-init:
#
# 8. Meta-device init without a broadcast
# ---------------------------------------
# Building a large model on the ``meta`` device, sharding it, then ``to_empty()`` and
# ``reset_parameters()`` is the memory-saving way to start; but each rank then draws its *local*
# shard from its own generator (with the same seed everywhere, every rank's shard holds the same
# values), and the model the ranks hold is not the single-process one. The
# :ref:`checkpoint page <sphx_glr_auto_examples_plot_checkpoint.py>` (section "Meta-device init")
# reproduces it and asserts the fix: load rank 0's full state dict with
# ``set_model_state_dict(..., StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``,
# the same call section 2 uses above.
#
# .. _pitfalls-reshard-default:
#
# 9. ``reshard_after_forward``: the default, and passing ``True``
# ---------------------------------------------------------------
# ``reshard_after_forward=None`` (the default) means ``True`` for every group except the root, which
# keeps its parameters until backward, since backward needs them first (``FSDPState._lazy_init``).
# Before pytorch #154704 (2025) an explicit ``True`` was clamped to ``False`` on the root as well;
# since then it is respected (#154655), and #155319 made ``None`` the way to get the clamp.
# Code that passes ``True`` everywhere, believing it is the default, now pays one more all-gather
# per step: the root's, in backward. The ``reshard_after_forward`` page measures the memory side.


def reshard_default(rank: guide.Rank, mesh, option: bool | None) -> dict:
    model = apply_fsdp2(build_model(CFG, device=rank.device), mesh,
                        reshard_after_forward=option)
    opt = make_optimizer("sgd", model.parameters())
    with CollectiveLog(model) as log:
        train_steps(model, opt, BATCHES[:1], rank)
    # a forward, no backward: what does the root hold?
    model(BATCHES[0, :, :-1].to(rank.device))
    held = ("sharded (DTensor)" if isinstance(model.tok_emb.weight, DTensor)
            else "unsharded (plain tensor)")
    return {"all_gathers": log.count("all_gather"), "root holds after forward": held}


def pitfall_9(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"9": {option: reshard_default(rank, mesh, option) for option in (None, True, False)}}


run_pitfall(pitfall_9)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "9. reshard_after_forward=True"
default = inspect.signature(fully_shard).parameters["reshard_after_forward"].default
counts = {option: R["9"][option]["all_gathers"] for option in (None, True, False)}
checks.expect("pitfall reproduces", run, default is None,
              f"the default is now {default!r}")
GATHERS = {}  # option: measured all-gathers per step, checked against guide.comm's
for option, measured in counts.items():
    expected = sum(c.kind == "all_gather" for c in comm.fsdp2_step(
        comm.fsdp2_groups(build_model(CFG), option), WORLD_SIZE))
    GATHERS[option] = checks.expect_close(
        "comm calls", f"{run} ({option})", measured, expected, 0, what="all-gathers per step",
        unit="calls", against=f"guide.comm for reshard_after_forward={option}")
checks.expect("pitfall reproduces", run, counts[True] == counts[None] + 1,
              f"True costs {counts[True]} all-gathers, the default {counts[None]}")
print(f"fully_shard(..., reshard_after_forward={default!r}) is the default on torch "
      f"{torch.__version__}\n")
VARIANT = {None: "fsdp2", True: "fsdp2_reshard_root", False: "fsdp2_no_reshard"}
counts = {o: PAGE.check(f"tinylm.2-blocks.{VARIANT[o]}.all_gathers_per_step", c,
                        fmt=".0f")
          for o, c in GATHERS.items()}
report.show(report.table([[repr(o), counts[o], R["9"][o]["root holds after forward"]]
                    for o in counts],
                   ["reshard_after_forward", "all-gathers per step",
                    "root's tok_emb after forward"]))
# sphinx_gallery_end_ignore

# %%
# .. _pitfalls-other-method:
#
# 10. Calling a method other than ``forward``
# -------------------------------------------
# FSDP2 all-gathers a group's parameters in hooks around ``forward`` only. A method that computes
# with the parameters without going through ``forward`` (a ``generate``, an ``embed``, a scoring
# helper) meets them sharded, as ``DTensor``, next to plain tensors. pytorch #125394 added
# ``register_fsdp_forward_method(model, "embed")``, which wraps the method in the same hooks.
# A ``generate`` loop, and what it all-gathers per token: :ref:`generate <whenbreaks-methods>`.
class EmbedLM(TinyLM):
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok_emb(tokens) + self.pos_emb(positions)


def embed_lm() -> EmbedLM:
    model = EmbedLM(CFG)
    model.load_state_dict(build_model(CFG).state_dict())
    return model


EMBED_REFERENCE = embed_lm().embed(BATCHES[0, :, :-1]).detach()


def other_method(rank: guide.Rank, mesh, register: bool) -> dict:
    model = apply_fsdp2(embed_lm().to(rank.device), mesh)
    if register:
        register_fsdp_forward_method(model, "embed")  # right
    tokens = rank_slice(BATCHES[0], rank.rank, rank.world_size).to(rank.device)
    next_token_loss(model, tokens).backward()  # an ordinary forward and backward first
    out, messages = caught(model.embed, BATCHES[0, :, :-1].to(rank.device))
    return {"embed": None if out is None else out.detach(), "messages": messages}


def pitfall_10(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"10 wrong": other_method(rank, mesh, register=False),
        "10 right": other_method(rank, mesh, register=True)}


run_pitfall(pitfall_10)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "10. method other than forward"
error = assert_reproduces(run, R["10 wrong"]["messages"],
                          "got mixed torch.Tensor and DTensor")
print(error)
embed_gap = checks.assert_params_match(run + " (fixed)", {"embed": EMBED_REFERENCE},
                                       {"embed": R["10 right"]["embed"]}, GRAD_TOL,
                                       check="method output",
                                       against="one process's embed()")
embed_gap = gap("other_method.fixed.gap", embed_gap, "absolute", "method output")
print(f"\nwith register_fsdp_forward_method: max |Δ| to 1 process {embed_gap:.1e}")

# sphinx_gallery_thumbnail_number = 1
# What the tests (tests/test_pitfalls.py) read of this run, and nothing else.
RESULT = dict(SYMPTOMS=SYMPTOMS, WORLD_SIZE=WORLD_SIZE, K=K, R=R, results=results, curves=curves,
              initial=initial, REFERENCE=REFERENCE, TIED_REFERENCE=TIED_REFERENCE,
              NORM_REFERENCE=NORM_REFERENCE)
# sphinx_gallery_end_ignore

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
