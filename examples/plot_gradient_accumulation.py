"""
Gradient accumulation: skipping the sync, and what it costs
===========================================================

Accumulating gradients over ``k`` micro-batches before one optimizer step trains on a ``k`` times
larger batch without its activation memory. Data parallelism adds a choice: reduce the gradients
after *every* micro-batch, or only after the last one. DDP skips with ``with model.no_sync():``;
FSDP2 with ``model.set_requires_gradient_sync(False)``. Skipping saves ``k - 1`` of every ``k``
gradient reductions.

This page checks three things and **fails the docs build** if one does not hold:

1. ``k`` accumulated micro-batches on N ranks give the parameters of one process taking one step on
   the ``k`` times larger batch, for DDP and FSDP2, skipping the sync or not;
2. skipping really skips: counted reductions per optimizer step drop from ``k`` per unit to one;
3. what skipping costs. FSDP2 cannot reduce-scatter a gradient it did not reduce, so during
   accumulation it holds each gradient **unsharded**, at full size, on every rank: the memory FSDP2
   saves on gradients is given back until the last micro-batch. The page measures it.
"""

# %%
# The data: one big batch, or k micro-batches of it
# -------------------------------------------------
# The reference takes each global batch of ``K * B`` sequences in one step.
# :func:`guide.steps.micro_batches` cuts the *same* batch into ``K`` micro-batches of ``B``; each
# rank then takes its slice of each micro-batch. The model is the wider configuration of the
# ``reshard_after_forward`` page, so that a full set of gradients is megabytes.
import contextlib
import statistics

import matplotlib.pyplot as plt
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import checks, comm, knob_plots, sharding
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.model_state import local_tensor
from guide.peak_memory import MMAP_THRESHOLD, PeakMemory, prepare
from guide.steps import micro_batches, next_token_loss
from guide.dtensor import full_state
from guide.training import make_optimizer, mean_over_ranks, reference_run

WORLD_SIZE = guide.world_size(2)
K, B, STEPS = 4, 8, 4
CFG = ModelConfig(d_model=256, n_heads=4, d_mlp=1024, n_layers=4)
BIG = synthetic_batches(steps=STEPS, batch_size=K * B, seq_len=16, vocab=CFG.vocab, seed=0)
MICRO = micro_batches(BIG, K)  # (steps, K, B, T+1)
print(f"{STEPS} optimizer steps; each: 1 batch of {K * B} sequences (reference) = {K} micro-batches "
      f"of {B} ({B // WORLD_SIZE} per rank on {WORLD_SIZE} ranks)")

# %%
# One micro-batch, and one optimizer step
# ---------------------------------------
# Each micro-batch's loss is divided by ``K``: the sum of ``K`` gradients of mean losses over ``B``
# sequences is then the gradient of the mean loss over all ``K * B``. ``sync`` says whether this
# backward reduces the gradients across ranks. DDP's switch is a context manager around forward *and*
# backward; FSDP2's is a flag on the module, read by the backward hooks.


def micro_step(model, tokens, sync: bool) -> float:
    if isinstance(model, DDP):
        ctx = contextlib.nullcontext() if sync else model.no_sync()
    else:
        model.set_requires_gradient_sync(sync)
        ctx = contextlib.nullcontext()
    with ctx:
        loss = next_token_loss(model, tokens) / K
        loss.backward()
    return loss.item()


def accumulation_step(model, opt, step_batch, rank, skip_sync: bool) -> float:
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    for m, micro in enumerate(step_batch):
        sync = m == K - 1 or not skip_sync
        loss += micro_step(model, rank_slice(micro, rank.rank, rank.world_size), sync)
    opt.step()
    return loss


# %%
# The worker
# ----------
# The same worker wraps the model in DDP or applies ``fully_shard``. Optimizer step 0 runs as is. In
# step 1 the first micro-batch runs inside :class:`guide.peak_memory.PeakMemory`: what it leaves
# behind is the gradient memory held until the next micro-batch. Step 2 runs inside
# :class:`guide.comm.CollectiveLog` (DDP's C++ all-reduce is made visible with
# :func:`guide.comm.count_ddp_allreduce`, registered before the first step).


def worker(rank: guide.Rank, strategy: str, skip_sync: bool) -> dict:
    prepare()
    model = sharding.wrap(build_model(CFG, device=rank.device), strategy, rank)
    if strategy == "DDP":
        comm.count_ddp_allreduce(model)
    opt = make_optimizer("sgd", model.parameters())

    losses = [accumulation_step(model, opt, MICRO[0], rank, skip_sync)]
    opt.zero_grad(set_to_none=True)
    with PeakMemory() as first:
        loss = micro_step(model, rank_slice(MICRO[1, 0], rank.rank, rank.world_size),
                          sync=not skip_sync)
    grad_bytes = sum(local_tensor(p.grad).nbytes for p in model.parameters() if p.grad is not None)
    for m in range(1, K):
        loss += micro_step(model, rank_slice(MICRO[1, m], rank.rank, rank.world_size),
                           sync=m == K - 1 or not skip_sync)
    opt.step()
    losses.append(loss)
    with CollectiveLog(model) as log:
        losses.append(accumulation_step(model, opt, MICRO[2], rank, skip_sync))
    for step_batch in MICRO[3:]:
        losses.append(accumulation_step(model, opt, step_batch, rank, skip_sync))
    return {"losses": losses, "params": full_state(model), "held_bytes": first.end_bytes,
            "grad_bytes": grad_bytes, "collectives": log.records}


RUNS = [(s, skip) for s in ("DDP", "FSDP2") for skip in (True, False)]
results = {(s, skip): guide.launch(worker, WORLD_SIZE, s, skip) for s, skip in RUNS}
REF_LOSSES, REF_PARAMS = reference_run(CFG, "sgd", BIG)


def label(strategy: str, skip: bool) -> str:
    return f"{strategy}, {'sync on last only' if skip else 'sync every micro-batch'}"


# %%
# 1. The parameters of the big-batch step
# ---------------------------------------
# After every run, the trained parameters must equal the single-process run on the big batches
# within :data:`guide.checks.PARAM_TOL` (SGD), and each optimizer step's loss (summed over
# micro-batches, averaged over ranks) must equal the reference's.
for (strategy, skip), res in results.items():
    run = f"{strategy} x{WORLD_SIZE}, K={K}, {'no sync' if skip else 'sync'} until the last"
    losses = mean_over_ranks([r["losses"] for r in res])
    dl = checks.assert_losses_match(run, REF_LOSSES, losses)
    dp = checks.assert_params_match(run, REF_PARAMS, res[0]["params"], checks.PARAM_TOL["sgd"])
    print(f"{label(strategy, skip):<36} max |Δloss| {dl:.1e}   max |Δparam| {dp:.1e}")

# %%
# 2. Reductions per optimizer step
# --------------------------------
# Counted on rank 0 over one optimizer step of ``K`` micro-batches. Without skipping, every
# micro-batch reduces (one all-reduce per DDP bucket, one reduce-scatter per FSDP2 unit); with it,
# only the last does: ``K`` times fewer. FSDP2's all-gathers do not change: each micro-batch still
# gathers the parameters for its forward and backward.
REDUCE = {"DDP": "all_reduce", "FSDP2": "reduce_scatter"}
n_units = CFG.n_layers + 1  # fully_shard units: the blocks and the root
count = {}
for (strategy, skip), res in results.items():
    recs = res[0]["collectives"]
    count[strategy, skip] = {kind: sum(c.kind == kind for c in recs)
                             for kind in ("all_reduce", "reduce_scatter", "all_gather")}
for strategy, kind in REDUCE.items():
    skipped, every = count[strategy, True][kind], count[strategy, False][kind]
    per_backward = n_units if strategy == "FSDP2" else skipped
    if skipped < 1 or every != K * skipped or (strategy == "FSDP2" and skipped != n_units):
        raise checks.CheckFailed(
            f"[sync skipped] {strategy} x{WORLD_SIZE}: {kind} per optimizer step is {skipped} with "
            f"skipping and {every} without; expected {per_backward} and {K} x {per_backward}.")
if count["FSDP2", True]["all_gather"] != count["FSDP2", False]["all_gather"]:
    raise checks.CheckFailed("[sync skipped] FSDP2: skipping the gradient sync changed the number "
                             "of all-gathers.")
print(f"{'run':<36}{'all-reduce':>11}{'reduce-scatter':>15}{'all-gather':>11}")
for key, c in count.items():
    print(f"{label(*key):<36}{c['all_reduce']:>11}{c['reduce_scatter']:>15}{c['all_gather']:>11}")

# %%
# 3. The memory it costs
# ----------------------
# What one micro-batch leaves behind is its gradients. DDP always holds full gradients in
# ``.grad``. FSDP2 that reduces every micro-batch holds only its shards (``1/N``, padded). FSDP2 that
# skips the sync holds full, unsharded gradients *inside* FSDP2 until the last micro-batch
# reduce-scatters them: its ``.grad`` is still ``None`` then, so only a memory measurement sees
# them. For FSDP2 the measured growth of the rank's resident memory must match the bytes expected
# from the parameter shapes within 10 % (plus tensors under glibc's mmap threshold, which can reuse
# resident heap pages unseen). For DDP the check reads ``.grad``; its resident memory is printed but
# not checked, because DDP's reducer can hand a ``no_sync`` backward gradient memory it already
# holds, so the growth need not show the gradients (in testing it did in some steps, not in others).
MiB = 2**20
shapes = [p.shape for p in build_model(CFG).parameters()]
full = [s.numel() * 4 for s in shapes]
shard = [comm.fsdp2_padded_numel(s, WORLD_SIZE) * 4 // WORLD_SIZE for s in shapes]
expected = {("DDP", True): full, ("DDP", False): full, ("FSDP2", True): full, ("FSDP2", False): shard}
held, visible, checked = {}, {}, {}
print(f"{'run':<36}{'held (measured)':>16}{'in .grad':>10}{'expected':>10}")
for key, res in results.items():
    held[key] = statistics.mean(r["held_bytes"] for r in res)
    visible[key] = statistics.mean(r["grad_bytes"] for r in res)
    want = sum(expected[key])
    small = sum(b for b in expected[key] if b < MMAP_THRESHOLD)
    got = checked[key] = held[key] if key[0] == "FSDP2" else visible[key]
    if not abs(got - want) <= 0.1 * want + small:
        raise checks.CheckFailed(
            f"[gradient memory] {label(*key)} x{WORLD_SIZE}: one micro-batch left "
            f"{got / MiB:.2f} MiB of gradients behind, expected {want / MiB:.2f} MiB.")
    print(f"{label(*key):<36}{held[key] / MiB:>12.2f} MiB{visible[key] / MiB:>6.2f} MiB"
          f"{want / MiB:>6.2f} MiB")
if visible["FSDP2", True] != 0:
    raise checks.CheckFailed("[gradient memory] FSDP2 without sync: .grad was set before the last "
                             "micro-batch; the page says FSDP2 holds the gradients internally.")
saved = count["FSDP2", False]["reduce_scatter"] - count["FSDP2", True]["reduce_scatter"]
extra = held["FSDP2", True] - held["FSDP2", False]
print(f"\nFSDP2 trade-off at K={K}, N={WORLD_SIZE}: skipping the sync saves {saved} of "
      f"{count['FSDP2', False]['reduce_scatter']} reduce-scatters per optimizer step and costs "
      f"{extra / MiB:.2f} MiB more gradient memory per rank during accumulation: the full gradients, "
      "as DDP holds them.")

fig = knob_plots.accumulation_tradeoff({label(*k): count[k][REDUCE[k[0]]] for k in RUNS},
                                       {label(*k): checked[k] / MiB for k in RUNS}, K, WORLD_SIZE)
plt.show()
