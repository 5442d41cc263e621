"""
DDP and FSDP2 train the same model
==================================

Data parallelism promises that N processes, each looking at 1/N of a batch, take *exactly* the step
one process would take on the whole batch. DDP keeps a full copy of the model on every rank and
all-reduces gradients; FSDP2 (``fully_shard``) keeps only a 1/N shard of every parameter, gradient
and optimizer state per rank, and gathers the rest when it needs it. Different memory, different
communication, and yet the same arithmetic.

This page does not take that on faith. It trains one mini transformer three ways on the same global
batches and **fails the docs build** if any step disagrees:

1. one process on the full global batch (the reference),
2. DDP on 2 gloo ranks, each rank fed a *different* half of each batch,
3. FSDP2 on 2 ranks: ``fully_shard`` on each transformer block, then on the root.

Everything below ran when this page was built; every number in it comes from that run.
"""

# %%
# The model and the data
# ----------------------
# :class:`guide.model.TinyLM` is a GPT-style model small enough for two CPU processes: token and
# position embeddings, pre-norm blocks of causal self-attention and an MLP, a final LayerNorm and an
# LM head. The data are token sequences that follow an arithmetic progression modulo the vocabulary,
# so the loss falls visibly within a few dozen steps.
import matplotlib.pyplot as plt
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import checks, claims, plotting, report
from guide.data import synthetic_batches
from guide.layout import full_state, param_layouts
from guide.model import ModelConfig, build_model
from guide.sharding import Strategy
from guide.training import (OPTIMIZERS, TrainResult, make_optimizer, mean_over_ranks,
                            reference_run, train_steps)

WORLD_SIZE = guide.world_size(2, supports=(2, 4, 8))  # 2 here; torchrun's under torchrun
STEPS = 20
CFG = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab, seed=0)  # 4 sequences per rank, any N
ledger = claims.Ledger("plot_ddp_vs_fsdp2")  # every number this page states

model = build_model(CFG)
n_params = sum(p.numel() for p in model.parameters())
n_params = ledger.claim("tinylm.main.params", n_params, "parameters", model=repr(CFG))
fp32_mib = ledger.claim("tinylm.main.params_fp32", round(n_params * 4 / 2**20, 2),
                        "MiB", model=repr(CFG))
print(model)
print(f"\n{n_params:,} parameters ({fp32_mib:.2f} MiB in fp32); {STEPS} global batches "
      f"of {BATCHES.shape[1]} sequences x {BATCHES.shape[2] - 1} tokens")

# %%
# The training step is the same for all three runs
# ------------------------------------------------
# :func:`guide.training.train_steps` is the plain loop ``zero_grad(); loss = f(model(x));
# loss.backward(); optimizer.step()`` over this rank's slice of each global batch. Neither DDP nor
# FSDP2 changes a line of it: their communication is hooked into ``backward()`` (and, for FSDP2,
# into ``forward()``). The reference is that loop in one process on the full batch. It must learn
# (:func:`guide.checks.assert_learns`, inside ``reference_run``): runs that match a reference that
# does not learn would prove nothing.
REFERENCE = {opt: reference_run(CFG, opt, BATCHES) for opt in ("sgd", "adamw")}
ref_rows = []
for opt, (losses, _) in REFERENCE.items():
    drop = checks.assert_learns(f"reference, {opt}", losses)  # as reference_run does
    with ledger.scope(model=repr(CFG), steps=STEPS, world_size=WORLD_SIZE):
        ledger.record(f"main-example.reference.{opt}.loss_drop", drop, fmt=".4f")
        first, last = (ledger.claim(f"main-example.reference.{opt}.loss.{when}", loss, "nats",
                                    fmt=".4f")
                       for when, loss in (("first", losses[0]), ("last", losses[-1])))
    ref_rows.append([OPTIMIZERS[opt].label, first, last])
REF_COLS = ["reference", "loss at step 0", f"loss at step {STEPS - 1}"]
print(report.table(ref_rows, REF_COLS, formats={c: ".4f" for c in REF_COLS[1:]}))

# %%
# The DDP worker
# --------------
# Each rank builds the model, wraps it in ``DDP`` (which broadcasts rank 0's weights and registers
# the gradient all-reduce), and trains on its own half of every batch. :func:`guide.launch` runs the
# function on ``WORLD_SIZE`` ranks of a gloo process group and returns each rank's result here.


def ddp_worker(rank: guide.Rank, optimizer: str) -> TrainResult:
    model = DDP(build_model(CFG, device=rank.device))
    initial = full_state(model)
    opt = make_optimizer(optimizer, model.parameters())
    losses = train_steps(model, opt, BATCHES, rank)
    return TrainResult(losses, full_state(model), initial, param_layouts(model, rank.rank))


# %%
# The FSDP2 worker
# ----------------
# ``fully_shard`` is applied bottom-up: each block becomes one communication unit (one all-gather of
# its parameters in forward, again in backward, one reduce-scatter of its gradients), and the root
# call picks up what is left (embeddings, final norm, head). Every parameter becomes a ``DTensor``
# sharded on dim 0 across the mesh. ``fully_shard`` does **not** broadcast weights, so every rank
# builds the same initial model (``build_model`` seeds it); ``full_tensor()`` gathers the result.


def fsdp2_worker(rank: guide.Rank, optimizer: str) -> TrainResult:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    initial = full_state(model)  # all-gathers the shards: the model the ranks hold
    opt = make_optimizer(optimizer, model.parameters())  # on the sharded parameters
    losses = train_steps(model, opt, BATCHES, rank)
    return TrainResult(losses, full_state(model), initial, param_layouts(model, rank.rank))


DDP_, FSDP2_ = Strategy.DDP, Strategy.FSDP2  # the site's names (label, colour) for them
runs = {}
for opt in ("sgd", "adamw"):
    runs[DDP_, opt] = guide.launch(ddp_worker, WORLD_SIZE, opt)
    runs[FSDP2_, opt] = guide.launch(fsdp2_worker, WORLD_SIZE, opt)

# %%
# The checks that fail the build
# ------------------------------
# First the storage: FSDP2 parameters must be ``DTensor`` with ``(Shard(dim=0),)`` holding this
# rank's rows of dim 0; DDP parameters must be full size. Then the start: the model the ranks hold
# before the first step must be the reference's, bit for bit, and after the last step every rank
# must hold the same parameters (replicas that drift apart were never synchronised). Then every
# step's global loss (the mean of the ranks' losses, whose batch slices are equal) must match the
# reference within
# :data:`guide.checks.LOSS_TOL`, and the trained parameters within :data:`guide.checks.PARAM_TOL`.
# The tolerances come from measurement: the only gap between one process and N is the order of
# floating-point additions. SGD catches a gradient that is summed instead of averaged (every step
# N times too large); AdamW, whose update ignores the gradient's scale, would hide it, so both run.
full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
initial = full_state(model)
loss_tol = ledger.claim("tolerance.loss", checks.LOSS_TOL, "nats")
param_tol = {opt: ledger.claim(f"tolerance.param.{opt}", checks.PARAM_TOL[opt],
                               "absolute") for opt in ("sgd", "adamw")}


def gap(name: str, checked: checks.Checked) -> float:
    """Record a gap a check measured as this page prints it (2 digits), with that check."""
    return ledger.record(f"main-example.{name}", checked, fmt=".1e", model=repr(CFG),
                         steps=STEPS, world_size=WORLD_SIZE)


rows = []
for (strategy, opt), results in runs.items():
    run = f"{strategy.label} x{WORLD_SIZE}, {opt}"
    layouts = [lay for r in results for lay in r.layouts]
    if strategy is FSDP2_:
        held_elements = checks.assert_sharded(run, layouts, WORLD_SIZE)
    else:
        checks.assert_replicated(run, layouts, full_shapes)
    checks.assert_same_init(run, initial, results[0].initial)
    checks.assert_ranks_agree(run, [r.params for r in results])
    ref_losses, ref_params = REFERENCE[opt]
    losses = mean_over_ranks([r.losses for r in results])
    d_loss = checks.assert_losses_match(run, ref_losses, losses, loss_tol)
    d_param = checks.assert_params_match(run, ref_params, results[0].params,
                                         param_tol[opt])
    key = f"{strategy.value}.{opt}"
    d_loss = gap(f"{key}.max_loss_gap", d_loss)
    d_param = gap(f"{key}.max_param_gap", d_param)
    rows.append([run, d_loss, loss_tol, d_param, param_tol[opt]])

COLS = ["run", "max |Δloss|", "loss tol", "max |Δparam|", "param tol"]
print(report.table(rows, COLS, formats={c: ".1e" for c in COLS[1:]}))
print("\nAll checks passed: DDP and FSDP2 reproduce the single-process run "
      "step for step.")

# %%
# Three curves, one line
# ----------------------
# The loss curves lie on top of each other; the lower panels show how far apart they are, on a log
# scale, under the dashed tolerance the build asserts. Points at the floor are bitwise equal to the
# reference. The largest gap of DDP with SGD was :claim:`main-example.ddp.sgd.max_loss_gap <unit>`
# in this build (the number is the ledger's, filled in when the site was built).


def loss_comparison(reference: dict, runs: dict, tol: float) -> plt.Figure:
    """Top: loss per step, one column per optimizer. Bottom: |loss - reference|, log."""
    plotting.style()
    fig, axes = plt.subplots(2, len(reference), figsize=(10.4, 6.4), sharex=True,
                             squeeze=False, height_ratios=[3, 2])
    for (top, bottom), (opt, ref) in zip(axes.T, reference.items()):
        top.plot(ref, color=plotting.REFERENCE_COLOR, lw=4, alpha=0.35,
                 label="1 process, full batch")
        for k, (strategy, losses) in enumerate(runs[opt].items()):
            top.plot(losses, color=strategy.color, lw=1.6, ls=("-", "--")[k],
                     label=f"{strategy.label}, {WORLD_SIZE} ranks")
            plotting.gap_axis(bottom, [abs(a - b) for a, b in zip(losses, ref)],
                              color=strategy.color, marker="os"[k],
                              label=strategy.label)
        plotting.tolerance_line(bottom, tol)
        top.set(title=OPTIMIZERS[opt].label, ylabel="training loss (nats/token)")
        top.legend(loc="upper right")
        bottom.set(ylabel="|loss − reference| (nats)", xlabel="training step")
        bottom.legend(loc="upper left", ncols=2)
    return fig


fig = loss_comparison(
    {opt: REFERENCE[opt][0] for opt in ("sgd", "adamw")},
    {opt: {s: mean_over_ranks([r.losses for r in runs[s, opt]])
           for s in (DDP_, FSDP2_)} for opt in ("sgd", "adamw")},
    tol=loss_tol,
)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# What each rank holds
# --------------------
# The same parameters, as each rank stores them after training. DDP keeps the full tensor on every
# rank; FSDP2 keeps a ``DTensor`` whose local shard is one chunk of dim 0 (``torch.chunk``
# semantics: ceil-sized chunks in rank order, so the last ranks get what is left, possibly
# nothing). One rank's shards add up to 1/N of the
# model, which is where FSDP2's memory saving comes from.
shown = ["tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.fc2.weight",
         "blocks.0.ln1.bias", "head.weight"]
layout = {(s, lay.name, lay.rank): lay for s in (DDP_, FSDP2_)
          for r in runs[s, "adamw"] for lay in r.layouts}
ranks = range(WORLD_SIZE)
runs_ranks = [(s, r) for s in (DDP_, FSDP2_) for r in ranks]
print(report.table(
    [[name, full_shapes[name], *(layout[s, name, r].local_shape for s, r in runs_ranks)]
     for name in shown],
    ["parameter", "global", *(f"{s.label} r{r}" for s, r in runs_ranks)]))
held = {r: sum(torch.Size(lay.local_shape).numel() for (s, _, rr), lay in layout.items()
               if s is FSDP2_ and rr == r) for r in ranks}  # shapes: assert_sharded
share = {r: ledger.record(f"main-example.fsdp2.rank{r}.params_share",
                          held_elements[r].scaled(1 / n_params, "fraction"), fmt=".1%",
                          model=repr(CFG), world_size=WORLD_SIZE)
         for r in held}
print(report.table([[f"rank {r}", n_params, n, share[r]] for r, n in held.items()],
                   ["FSDP2", "parameters (DDP: every rank)", "held", "share"],
                   formats={"share": ".1%"}))
print(f"placements: {layout[FSDP2_, 'blocks.0.qkv.weight', 0].placements}")
