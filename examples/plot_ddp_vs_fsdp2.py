"""
DDP and FSDP2 train the same model
==================================

.. admonition:: Verdict
   :class: tip

   Both take the step one process takes, up to floating-point reordering (largest loss gap here:
   :claim:`main-example.max_loss_gap <unit>`), so choose by memory and traffic. **Use DDP** while
   the model state (parameters, gradients, optimizer state) fits one GPU with room for
   activations: it moves fewer bytes per step (FSDP2 moves :claim:`main-example.bytes_ratio
   <unit>` bytes, ring model). **Use FSDP2** when it does not fit: each rank then holds
   :claim:`main-example.fsdp2.max_params_share` of the parameters instead of all of them.

Measured on CPU gloo processes (tiny models, two shared cores); the bytes per step are the ring
model's prediction for the calls FSDP2 and DDP issue, and labelled so.

**Switching a DDP script?** :doc:`plot_ddp_to_fsdp2` has the whole script before and after (process
group and device, mesh, ``fully_shard``, the optimizer's place, mixed precision, gradient
accumulation, clipping, a DCP checkpoint), run and checked, with the diff counted.

The code to copy is the next block: plain PyTorch, nothing else. The rest of the page trains one
mini transformer three ways on the same global batches (one process on the full batch; DDP; FSDP2,
each rank fed its own slice of every batch) and **fails the docs build** if any step disagrees.
"""

# %%
# The code to copy
# ----------------
# DDP keeps a full copy of the model on every rank and all-reduces (averages) the gradients during
# ``backward()``. ``fully_shard`` keeps a 1/N shard of every parameter, gradient and optimizer state
# per rank and gathers the rest when it needs it. It is applied bottom-up: each block becomes one
# communication unit (one all-gather in forward, one in backward, one reduce-scatter of its
# gradients), and the root call picks up what is left (embeddings, final norm, head). Unlike DDP,
# ``fully_shard`` does not broadcast weights: every rank must build the same initial model. The
# training loop itself is unchanged for both; the page's workers below call these very functions.
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_ddp(model: torch.nn.Module) -> DDP:
    """A full replica per rank; rank 0's weights broadcast, gradients averaged in backward."""
    return DDP(model)  # on GPU: DDP(model.cuda(rank), device_ids=[rank])


def make_mesh(device_type: str) -> DeviceMesh:
    """A 1-D mesh over every rank of the process group ("cuda" on GPUs, "cpu" with gloo)."""
    return init_device_mesh(device_type, (dist.get_world_size(),))


def shard_fsdp2(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """FSDP2: each block one unit, then the root; every parameter becomes a sharded DTensor."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# %%
# The model and the data
# ----------------------
# :class:`guide.model.TinyLM` is a GPT-style model small enough for two CPU processes: token and
# position embeddings, pre-norm blocks of causal self-attention and an MLP, a final LayerNorm and an
# LM head. The data are token sequences that follow an arithmetic progression modulo the vocabulary,
# so the loss falls visibly within a few dozen steps. Everything below ran when this page was built.
import matplotlib.pyplot as plt

import guide
from guide import checks, plotting
from guide.comm.cost import ring_bytes
from guide.comm.expected import ddp_step, fsdp2_groups, fsdp2_step
from guide.data import synthetic_batches
from guide.layout import full_state, param_layouts
from guide.model import ModelConfig, build_model
from guide.sharding import Strategy
from guide.training import TrainResult, make_optimizer, mean_over_ranks, train_steps
from guide.optimizers import OPTIMIZERS
from guide.reference import reference_run

PAGE = guide.Page(section="Start here", order=1, key_api="fully_shard(", world_size=2,
                  supports=(2, 4, 8))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
STEPS = 20
CFG = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab, seed=0)  # 4 sequences per rank, any N
MODEL = dict(model=repr(CFG))

model = build_model(CFG)
n_params = sum(p.numel() for p in model.parameters())
PAGE.state("tinylm.main.params", n_params, "parameters", **MODEL)
PAGE.assume(world_size=WORLD_SIZE, **MODEL)  # what every number below depends on
print(model)
PAGE.show("tinylm.main",
          {"setup": ["TinyLM", CFG.n_layers, n_params, n_params * 4 / 2**20, STEPS,
                     BATCHES.shape[1], BATCHES.shape[2] - 1]},
          ["model", "blocks", "parameters", "fp32 MiB", "global batches", "sequences each",
           "tokens each"],
          formats={"parameters": ",", "fp32 MiB": ".2f"})

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
ref_rows = {}
for opt, (losses, _) in REFERENCE.items():
    drop = checks.assert_learns(f"reference, {opt}", losses)  # as reference_run does
    ref_rows[opt] = [OPTIMIZERS[opt].label, losses[0], losses[-1], drop]
REF_COLS = ["reference", "loss at step 0", f"loss at step {STEPS - 1}", "loss drop"]
with PAGE.scope(steps=STEPS):
    PAGE.show("main-example.reference", ref_rows, REF_COLS,
              formats={c: ".4f" for c in REF_COLS[1:]})

# %%
# The workers
# -----------
# Each rank builds the model and wraps it with the functions above, then trains on its own slice of
# every batch. :func:`guide.launch` runs a worker on ``WORLD_SIZE`` ranks of a gloo process group
# and returns each rank's result here. ``full_state`` gathers the parameters the ranks hold (for
# FSDP2, ``full_tensor()`` of every ``DTensor``); ``param_layouts`` notes how each is stored.


def ddp_worker(rank: guide.Rank, optimizer: str) -> TrainResult:
    model = wrap_ddp(build_model(CFG, device=rank.device))  # fault-point: ddp-wrap
    initial = full_state(model)
    opt = make_optimizer(optimizer, model.parameters())
    losses = train_steps(model, opt, BATCHES, rank)
    return TrainResult(losses, full_state(model), initial, param_layouts(model, rank.rank))


def fsdp2_worker(rank: guide.Rank, optimizer: str) -> TrainResult:
    model = build_model(CFG, device=rank.device)  # fault-point: fsdp2-build
    mesh = make_mesh(rank.device.type)
    shard_fsdp2(model, mesh)  # fault-point: fsdp2-shard
    initial = full_state(model)  # all-gathers the shards: the model the ranks hold
    opt = make_optimizer(optimizer, model.parameters())  # on the sharded parameters
    losses = train_steps(model, opt, BATCHES, rank)
    return TrainResult(losses, full_state(model), initial, param_layouts(model, rank.rank))


DDP_, FSDP2_ = Strategy.DDP, Strategy.FSDP2  # the site's names (label, colour) for them
runs = {}
for opt in ("sgd", "adamw"):
    runs[DDP_, opt] = guide.launch(ddp_worker, WORLD_SIZE, opt)
    runs[FSDP2_, opt] = guide.launch(fsdp2_worker, WORLD_SIZE, opt)  # fault-point: fsdp2-launch

# %%
# The checks that fail the build
# ------------------------------
# First the storage: FSDP2 parameters must be ``DTensor`` with ``(Shard(dim=0),)`` holding this
# rank's rows of dim 0; DDP parameters must be full size. Then the start: the model the ranks hold
# before the first step must be the reference's, bit for bit, and after the last step every rank
# must hold the same parameters (replicas that drift apart were never synchronised). Then every
# step's global loss (the mean of the ranks' losses, whose batch slices are equal) must match the
# reference within :data:`guide.checks.LOSS_TOL`, and the trained parameters within
# :data:`guide.checks.PARAM_TOL`. The tolerances come from measurement: the only gap between one
# process and N is the order of floating-point additions. SGD catches a gradient that is summed
# instead of averaged (every step N times too large); AdamW, whose update ignores the gradient's
# scale, would hide it, so both run.
full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
initial = full_state(model)
loss_tol, param_tol = checks.LOSS_TOL, checks.PARAM_TOL  # the site's, shown in the table

rows, loss_gaps = {}, []
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
    d_loss = checks.assert_losses_match(run, ref_losses, losses, loss_tol,
                                        against=checks.SINGLE_PROCESS)
    d_param = checks.assert_params_match(run, ref_params, results[0].params, param_tol[opt],
                                         against=checks.SINGLE_PROCESS)
    loss_gaps.append(d_loss)
    rows[f"{strategy.value}.{opt}"] = [run, d_loss, loss_tol, d_param, param_tol[opt]]

COLS = ["run", "max loss gap", "loss tol", "max param gap", "param tol"]
with PAGE.scope(steps=STEPS):
    PAGE.show("main-example", rows, COLS, formats={c: ".1e" for c in COLS[1:]})
    max_gap = PAGE.check("main-example.max_loss_gap", max(loss_gaps), fmt=".1e")
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
# nothing). One rank's shards add up to about 1/N of the model, which is where FSDP2's memory
# saving comes from: the fullest rank holds :claim:`main-example.fsdp2.max_params_share` of the
# parameters (each share is checked against ``torch.chunk``'s rows by ``assert_sharded``).
shown = ["tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.fc2.weight",
         "blocks.0.ln1.bias", "head.weight"]
layout = {(s, lay.name, lay.rank): lay for s in (DDP_, FSDP2_)
          for r in runs[s, "adamw"] for lay in r.layouts}
ranks = range(WORLD_SIZE)
runs_ranks = [(s, r) for s in (DDP_, FSDP2_) for r in ranks]
PAGE.show(None,
          [[name, full_shapes[name], *(layout[s, name, r].local_shape for s, r in runs_ranks)]
           for name in shown],
          ["parameter", "global", *(f"{s.label} r{r}" for s, r in runs_ranks)])

# %%
# One rank's shards, added up: about 1/N of the parameters (checked), against DDP's whole model.
share = {r: held_elements[r].scaled(1 / n_params, "fraction") for r in ranks}
PAGE.show("main-example.fsdp2.holdings",
          {f"rank{r}": [f"rank {r}", n_params, held_elements[r], share[r]] for r in ranks},
          ["FSDP2", "parameters (DDP: every rank)", "held", "share"],
          formats={"share": ".1%", "held": ",.0f"})
PAGE.check("main-example.fsdp2.max_params_share", max(share.values()), fmt=".1%")

# %%
# Bytes per step
# --------------
# The price of sharding is traffic. DDP all-reduces every gradient once per step; FSDP2
# all-gathers each block's parameters in forward and again in backward and reduce-scatters its
# gradients (the root's parameters stay gathered until backward, so it gathers them once). Under
# the ring algorithm (what NCCL approaches) an all-reduce costs twice what an all-gather or a
# reduce-scatter of the same buffer costs, so FSDP2 sends about half again DDP's bytes per step.
# Computed from the calls :mod:`guide.comm.expected` predicts, not timed here:
# the :doc:`communication page <plot_communication>` counts the calls themselves and checks them
# against the same model.
shapes = list(full_shapes.values())
steps_by = {DDP_: ddp_step(shapes, WORLD_SIZE),
            FSDP2_: fsdp2_step(fsdp2_groups(model), WORLD_SIZE)}
sent = {s: sum(ring_bytes(c) for c in calls) for s, calls in steps_by.items()}
with PAGE.scope(precision="fp32"):
    PAGE.show("main-example.bytes",
              {s.value: [s.label, len(calls), sent[s] / 2**10] for s, calls in steps_by.items()},
              ["strategy", "collective calls", "KiB sent per rank (ring model)"],
              formats={"KiB sent per rank (ring model)": ",.1f"})
    ratio = sent[FSDP2_] / sent[DDP_]
    PAGE.state("main-example.bytes_ratio", ratio, "× DDP's", fmt=".2f")
PAGE.conclude(
    f"Same step, measured: the largest loss gap is {max_gap:.1e} nats. Memory: an FSDP2 rank "
    f"holds at most {max(share.values()):.1%} of the parameters, a DDP rank all of them. "
    f"Traffic: FSDP2 sends {ratio:.2f}x DDP's bytes per step (ring model). Use DDP while the "
    "model state fits one GPU; use FSDP2 when it does not.")
