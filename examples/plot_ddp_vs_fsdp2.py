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
from guide import checks, dtensor, plotting
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.dtensor import full_state
from guide.training import make_optimizer, mean_over_ranks, reference_run, train_steps

WORLD_SIZE = guide.world_size(2)  # 2 here; torchrun's WORLD_SIZE when run under torchrun
STEPS = 20
CFG = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * WORLD_SIZE, seq_len=16, vocab=CFG.vocab,
                            seed=0)  # 4 sequences per rank, at any world size

model = build_model(CFG)
n_params = sum(p.numel() for p in model.parameters())
print(model)
print(f"\n{n_params:,} parameters ({n_params * 4 / 2**20:.2f} MiB in fp32); "
      f"{STEPS} global batches of {BATCHES.shape[1]} sequences x {BATCHES.shape[2] - 1} tokens")

# %%
# The training step is the same for all three runs
# ------------------------------------------------
# :func:`guide.training.train_steps` is the plain loop ``zero_grad(); loss = f(model(x));
# loss.backward(); optimizer.step()`` over this rank's slice of each global batch. Neither DDP nor
# FSDP2 changes a line of it: their communication is hooked into ``backward()`` (and, for FSDP2,
# into ``forward()``). The reference is that loop in one process on the full batch.
REFERENCE = {opt: reference_run(CFG, opt, BATCHES) for opt in ("sgd", "adamw")}

# %%
# The DDP worker
# --------------
# Each rank builds the model, wraps it in ``DDP`` (which broadcasts rank 0's weights and registers
# the gradient all-reduce), and trains on its own half of every batch. :func:`guide.launch` runs the
# function on ``WORLD_SIZE`` ranks of a gloo process group and returns each rank's result here.


def ddp_worker(rank: guide.Rank, optimizer: str) -> dict:
    model = DDP(build_model(CFG, device=rank.device))
    initial = full_state(model)
    opt = make_optimizer(optimizer, model.parameters())
    losses = train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
    return {"initial": initial, "losses": losses, "params": full_state(model),
            "layouts": dtensor.param_layouts(model, rank.rank)}


# %%
# The FSDP2 worker
# ----------------
# ``fully_shard`` is applied bottom-up: each block becomes one communication unit (one all-gather of
# its parameters in forward, again in backward, one reduce-scatter of its gradients), and the root
# call picks up what is left (embeddings, final norm, head). Every parameter becomes a ``DTensor``
# sharded on dim 0 across the mesh. ``fully_shard`` does **not** broadcast weights, so every rank
# builds the same initial model (``build_model`` seeds it); ``full_tensor()`` gathers the result.


def fsdp2_worker(rank: guide.Rank, optimizer: str) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    initial = full_state(model)  # all-gathers the shards: the model the ranks jointly hold
    opt = make_optimizer(optimizer, model.parameters())  # built on the sharded parameters
    losses = train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
    return {"initial": initial, "losses": losses, "params": full_state(model),
            "layouts": dtensor.param_layouts(model, rank.rank)}


runs = {}
for opt in ("sgd", "adamw"):
    runs["DDP", opt] = guide.launch(ddp_worker, WORLD_SIZE, opt)
    runs["FSDP2", opt] = guide.launch(fsdp2_worker, WORLD_SIZE, opt)

# %%
# The checks that fail the build
# ------------------------------
# First the storage: FSDP2 parameters must be ``DTensor`` with ``(Shard(dim=0),)`` holding this
# rank's rows of dim 0; DDP parameters must be full size. Then the start: the model the ranks hold
# before the first step must be the reference's, bit for bit, and after the last step every rank
# must hold the same parameters (replicas that drift apart were never synchronised). Then every step's global loss (the
# mean of the ranks' losses, whose batch slices are equal) must match the reference within
# :data:`guide.checks.LOSS_TOL`, and the trained parameters within :data:`guide.checks.PARAM_TOL`.
# The tolerances come from measurement: the only gap between one process and N is the order of
# floating-point additions. SGD catches a gradient that is summed instead of averaged (a 2x step);
# AdamW, whose update ignores the gradient's scale, would hide it, so both run.
full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
initial = full_state(model)
gaps = {}
for (strategy, opt), results in runs.items():
    run = f"{strategy} x{WORLD_SIZE}, {opt}"
    layouts = [lay for r in results for lay in r["layouts"]]
    if strategy == "FSDP2":
        checks.assert_sharded(run, layouts, WORLD_SIZE)
    else:
        checks.assert_replicated(run, layouts, full_shapes)
    checks.assert_same_init(run, initial, results[0]["initial"])
    checks.assert_ranks_agree(run, [r["params"] for r in results])
    ref_losses, ref_params = REFERENCE[opt]
    losses = mean_over_ranks([r["losses"] for r in results])
    gaps[run] = (checks.assert_losses_match(run, ref_losses, losses),
                 checks.assert_params_match(run, ref_params, results[0]["params"],
                                            checks.PARAM_TOL[opt]))

print(f"{'run':<18} {'max |Δloss|':>12} {'tol':>7} {'max |Δparam|':>13} {'tol':>7}")
for run, (dloss, dparam) in gaps.items():
    opt = run.rsplit(" ", 1)[1]
    print(f"{run:<18} {dloss:12.1e} {checks.LOSS_TOL:7.0e} {dparam:13.1e} "
          f"{checks.PARAM_TOL[opt]:7.0e}")
print("\nAll checks passed: DDP and FSDP2 reproduce the single-process run step for step.")

# %%
# Three curves, one line
# ----------------------
# The loss curves lie on top of each other; the lower panels show how far apart they are, on a log
# scale, under the dashed tolerance the build asserts. Points at the floor are bitwise equal to the
# reference.
fig = plotting.loss_comparison(
    {opt: REFERENCE[opt][0] for opt in ("sgd", "adamw")},
    {opt: {s: mean_over_ranks([r["losses"] for r in runs[s, opt]]) for s in ("DDP", "FSDP2")}
     for opt in ("sgd", "adamw")},
    world_size=WORLD_SIZE,
    tol=checks.LOSS_TOL,
)
plt.show()

# %%
# What each rank holds
# --------------------
# The same parameters, as each rank stores them after training. DDP keeps the full tensor on every
# rank; FSDP2 keeps a ``DTensor`` whose local shard is one chunk of dim 0 (``torch.chunk``
# semantics: ceil-sized, the remainder on the last rank). One rank's shards add up to 1/N of the
# model, which is where FSDP2's memory saving comes from.
shown = ["tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.fc2.weight", "blocks.0.ln1.bias",
         "head.weight"]
layout = {(s, lay.name, lay.rank): lay for s in ("DDP", "FSDP2")
          for r in runs[s, "adamw"] for lay in r["layouts"]}
header = f"{'parameter':<22}{'global':>12}" + "".join(
    f"{f'DDP r{r}':>12}" for r in range(WORLD_SIZE)) + "".join(
    f"{f'FSDP2 r{r}':>12}" for r in range(WORLD_SIZE))
print(header)
for name in shown:
    row = f"{name:<22}{str(full_shapes[name]):>12}"
    for s in ("DDP", "FSDP2"):
        row += "".join(f"{str(layout[s, name, r].local_shape):>12}" for r in range(WORLD_SIZE))
    print(row)
local = {r: sum(torch.Size(lay.local_shape).numel() for (s, _, rr), lay in layout.items()
                if s == "FSDP2" and rr == r) for r in range(WORLD_SIZE)}
print("\nFSDP2 parameters held per rank: " + ", ".join(
    f"rank {r}: {n:,} ({n / n_params:.1%})" for r, n in local.items()) +
    f"; DDP: {n_params:,} (100%) on every rank")
print(f"placements: {layout['FSDP2', 'blocks.0.qkv.weight', 0].placements}")
