"""
Switch from DDP to FSDP2: the whole script
==========================================

.. admonition:: Verdict
   :class: tip

   To switch, change :claim:`ddp_to_fsdp2.diff.lines.changed` lines, drop
   :claim:`ddp_to_fsdp2.diff.lines.removed` and add :claim:`ddp_to_fsdp2.diff.lines.added` of the
   :claim:`ddp_to_fsdp2.diff.lines.ddp_script` that run in the DDP script below: build the model the
   same on every rank, a mesh, ``fully_shard`` each block then the root, the optimizer after
   that, ``MixedPrecisionPolicy`` instead of autocast, ``set_requires_gradient_sync`` instead of
   ``no_sync()``, and a DCP checkpoint instead of rank 0's ``torch.save``. Both scripts, run here
   on gloo ranks, train as one process does, up to floating-point reordering (largest loss gap
   :claim:`ddp_to_fsdp2.max_loss_gap <unit>`), and each loads its checkpoint bit for bit.
   **Stay on DDP** while the model state fits one GPU: per step FSDP2 sent
   :claim:`ddp_to_fsdp2.bytes_ratio <unit>` bytes here, and for Llama-3.2-1B on one 8-GPU node,
   where DDP fits in :claim:`ddp_to_fsdp2.predicted.ddp.gib_per_gpu <unit>` per GPU, FSDP2's
   communication is predicted to grow from :claim:`ddp_to_fsdp2.predicted.m1.fsdp2_ddp_comm <unit>`
   with one micro-batch per step to :claim:`ddp_to_fsdp2.predicted.m16.fsdp2_ddp_comm <unit>` with
   sixteen, while DDP's stays one all-reduce per step.

Measured on CPU gloo processes (a tiny model, two shared cores); every GPU number is the site's
step-time model's **prediction**, labelled so.

"What do I write to switch my DDP script to FSDP2?" The first block holds the answer twice: a
complete DDP training script (process group, device, wrapping, mixed precision, gradient
accumulation, clipping, a checkpoint) and the same script for FSDP2. The page then runs both, as
they are, on gloo ranks, and **fails the docs build** unless each matches one process training on
the whole batch, step for step. Each change links to the page that proves it in depth.
"""

# %%
# Before and after, to copy
# -------------------------
# Both scripts are five functions: set up, one micro-batch, train, save, load. ``init_distributed``
# is shared: run either script with ``torchrun --nproc-per-node=8 train.py``. ``model_fn`` builds
# your model, with the same weights on every rank (seed it): DDP broadcasts rank 0's weights when
# it wraps the model, ``fully_shard`` broadcasts nothing. ``model.blocks`` stands for your model's
# list of layers (``model.layers`` in most LLMs). ``batches`` are this rank's slices of the global
# batches (what a ``DistributedSampler`` gives each rank); each is split into ``k`` micro-batches.
# The page's workers below call these very functions.
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def init_distributed() -> torch.device:
    """Join the process group torchrun describes (both scripts); one GPU per process."""
    if not dist.is_initialized():  # this page's launcher has joined one already
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", dist.get_node_local_rank())
    torch.cuda.set_device(device)
    return device


# -- before: DDP --------------------------------------------------------------------------------
def ddp_setup(model_fn, device, lr=1e-2):
    model = model_fn().to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, opt


def ddp_micro_step(model, tokens, k, dtype):
    with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()) / k
    loss.backward()
    return loss.item()


def ddp_train(model, opt, batches, k, max_norm, dtype=torch.bfloat16):
    losses, norms = [], []
    for batch in batches:
        loss = 0.0
        for m, tokens in enumerate(batch.chunk(k), start=1):
            if m < k:
                with model.no_sync():  # accumulate: no all-reduce
                    loss += ddp_micro_step(model, tokens, k, dtype)
            else:  # the last micro-batch all-reduces the sum
                loss += ddp_micro_step(model, tokens, k, dtype)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
        losses.append(loss)
        norms.append(norm.item())
    return losses, norms


def ddp_save(model, opt, path):
    if dist.get_rank() == 0:  # every rank holds the same replica: one writes it
        torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, path)
    dist.barrier()


def ddp_load(model, opt, path):
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])  # fault-point: ddp-load-optim


# -- after: FSDP2 -------------------------------------------------------------------------------
def fsdp2_setup(model_fn, device, dtype=torch.bfloat16, lr=1e-2):
    model = model_fn().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # fault-point: fsdp2-mesh
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in model.blocks:  # one unit per block, then the root
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # fault-point: fsdp2-root
    opt = torch.optim.AdamW(model.parameters(), lr=lr)  # after fully_shard: on the DTensors
    return model, opt


def fsdp2_micro_step(model, tokens, k):
    logits = model(tokens[:, :-1])  # the policy casts to dtype: no autocast
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()) / k
    loss.backward()
    return loss.item()


def fsdp2_train(model, opt, batches, k, max_norm):
    losses, norms = [], []
    for batch in batches:
        loss = 0.0
        for m, tokens in enumerate(batch.chunk(k), start=1):
            model.set_requires_gradient_sync(m == k)  # reduce-scatter on the last only
            loss += fsdp2_micro_step(model, tokens, k)  # fault-point: fsdp2-micro-step
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # fault-point: clip
        opt.step()
        opt.zero_grad()
        losses.append(loss)
        norms.append(norm.full_tensor().item())  # the norm is a DTensor
    return losses, norms


def fsdp2_save(model, opt, path):
    msd, osd = get_state_dict(model, opt)  # this rank's shards; optimizer state keyed by name
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)  # every rank writes its own


def fsdp2_load(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)  # fills them in place
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)


# %%
# Each change, and the page that proves it
# ----------------------------------------
# #. **Process group and device**: unchanged; ``init_distributed`` serves both.
# #. **Same weights on every rank**: DDP copies rank 0's at ``DDP(model)``; FSDP2 shards whatever
#    each rank built, so ``model_fn`` must be seeded (:doc:`plot_ddp_vs_fsdp2`).
# #. **A mesh**: ``init_device_mesh(device.type, (world_size,))``, one dimension over every rank
#    (two dimensions make it HSDP: :doc:`plot_hsdp`).
# #. **fully_shard each block, then the root**: each block one unit, gathered only while it
#    computes; the root call takes the rest (:doc:`plot_prefetch_and_units`).
# #. **The optimizer after fully_shard**: built before, it holds tensors FSDP2 replaced and trains
#    nothing; a forward between the two is the other order mistake (:doc:`plot_when_fsdp2_breaks`,
#    section 1).
# #. **MixedPrecisionPolicy instead of autocast**: bf16 compute, fp32 gradient reduction, fp32
#    master shards (:doc:`plot_mixed_precision`).
# #. **set_requires_gradient_sync instead of no_sync()**: accumulate the micro-batches' gradients,
#    reduce on the last (:doc:`plot_gradient_accumulation`).
# #. **Clipping**: the same ``clip_grad_norm_`` call computes the global norm over the sharded
#    gradients; read it with ``full_tensor()`` (:doc:`plot_gradient_clipping`).
# #. **A DCP checkpoint instead of rank 0's torch.save**: every rank writes its shards, and any
#    world size can load them (:doc:`plot_checkpoint`).
#
# The setup the page runs
# -----------------------
# A four-block :class:`guide.model.TinyLM`, AdamW, the same global batches for every run, two
# micro-batches per step, and a clipping threshold that the gradient's norm exceeds on some steps
# (checked below: a threshold never reached would test nothing). The scripts take ``dtype``; on
# these CPUs the page passes ``torch.float32``, so that both runs can be held to the fp32 reference
# at fp32 tolerances (bf16 is held to its own tolerance on :doc:`plot_mixed_precision`).
import functools

import matplotlib.pyplot as plt

import guide
from guide import checks, comm, plotting, report, script_diff
from guide.checkpoint import gathered_state, job_dir
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.layout import full_state, param_layouts
from guide.model import ModelConfig, build_model
from guide.sharding import Strategy
from guide.training import mean_over_ranks, next_token_loss

PAGE = guide.Page(section="Start here", order=2, key_api="fully_shard(", world_size=2,
                  supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
STEPS, K, LR, MAX_NORM = 8, 2, 1e-2, 0.7
DTYPE = torch.float32  # see above; torch.bfloat16 on GPUs
CFG = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * K * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab, seed=0)  # 4 sequences per micro-batch per rank
MODEL_FN = functools.partial(build_model, CFG, seed=0)  # the same weights on every rank
MODEL = dict(model=repr(CFG))
FOLDER = job_dir("guide-ddp-to-fsdp2")  # one path for every rank
DDP_, FSDP2_ = Strategy.DDP, Strategy.FSDP2

# %%
# The reference: one process, the whole batch
# -------------------------------------------
# Plain PyTorch in one process, written apart from the scripts: no micro-batches (each global batch
# in one forward), :func:`guide.training.next_token_loss`, the same clip and AdamW. Accumulating
# ``k`` micro-batches of ``B/(kN)`` sequences on ``N`` ranks, each loss divided by ``k``, and
# averaging over ranks gives this gradient up to the order of additions. It must learn
# (:func:`guide.checks.assert_learns`), and clipping must act on some of its steps.


def reference(batches: torch.Tensor) -> tuple[list[float], list[float], dict]:
    model = MODEL_FN()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for batch in batches:
        loss = next_token_loss(model, batch)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms, full_state(model)


REF_LOSSES, REF_NORMS, REF_PARAMS = reference(BATCHES)
checks.assert_learns("single-process reference", REF_LOSSES)
clipped = sum(n > MAX_NORM for n in REF_NORMS)
checks.expect("clipping acts", "single-process reference", clipped < STEPS,
              f"the norm exceeds max_norm on all {STEPS} steps: choose a threshold that some "
              "steps do not reach.")
clipped = PAGE.check("ddp_to_fsdp2.reference.clipped_steps", checks.expect_order(
    "clipping acts", "single-process reference", 0, clipped, low_name="0",
    high_name="clipped steps", keep="high"), "steps of the run", fmt=".0f", steps=STEPS)

# %%
# The workers: the scripts, as they are
# -------------------------------------
# Each worker runs one script: set up, train the first step, then the others under
# :class:`guide.comm.CollectiveLog` (counted below), save, and load into a fresh model and
# optimizer built by the same setup. It returns what the checks need: losses and norms, the model
# before and after, how each rank held its parameters, the state it saved (gathered whole:
# :func:`guide.checkpoint.gathered_state`) and the state the fresh copy loaded. DDP's all-reduce
# runs in C++; :func:`guide.comm.count_ddp_allreduce` makes it visible before the first step.


def run_script(rank: guide.Rank, strategy: Strategy) -> dict:
    device = init_distributed()
    mine = [rank_slice(b, rank.rank, rank.world_size).to(device) for b in BATCHES]
    if strategy is DDP_:
        setup, train = functools.partial(ddp_setup, lr=LR), functools.partial(ddp_train, dtype=DTYPE)
        save, load, path = ddp_save, ddp_load, FOLDER / "ddp.pt"
    else:
        setup, train = functools.partial(fsdp2_setup, dtype=DTYPE, lr=LR), fsdp2_train
        save, load, path = fsdp2_save, fsdp2_load, FOLDER / "fsdp2"
    model, opt = setup(MODEL_FN, device)
    if strategy is DDP_:
        comm.count_ddp_allreduce(model)
    initial, layouts = full_state(model), param_layouts(model, rank.rank)
    losses, norms = train(model, opt, mine[:1], K, MAX_NORM)
    with CollectiveLog(model) as log:
        more_losses, more_norms = train(model, opt, mine[1:], K, MAX_NORM)
    saved, params = gathered_state(model, opt), full_state(model)
    save(model, opt, str(path))
    fresh, fresh_opt = setup(MODEL_FN, device)
    load(fresh, fresh_opt, str(path))
    return dict(losses=losses + more_losses, norms=norms + more_norms, initial=initial,
                params=params, layouts=layouts, saved=saved,
                loaded=gathered_state(fresh, fresh_opt), records=log.records)


RUNS = {s: guide.launch(run_script, WORLD_SIZE, s) for s in (DDP_, FSDP2_)}

# %%
# The checks that fail the build
# ------------------------------
# For each script: the parameters are stored as it says (DDP: full tensors on every rank; FSDP2:
# ``Shard(dim=0)`` DTensors); the model the ranks start from is the reference's, bit for bit;
# every step's global loss (the mean over ranks) and gradient norm before clipping match the
# reference's within :data:`guide.checks.LOSS_TOL`, and the trained parameters within
# :data:`guide.checks.PARAM_TOL`; the fresh model and optimizer hold, after loading, exactly
# (tolerance 0) the parameters and AdamW moments that were saved. The norm is the test of
# clipping: each rank's own shards would give a smaller norm, and a clip by it the wrong update.
full_shapes = {n: tuple(p.shape) for n, p in MODEL_FN().named_parameters()}
initial = full_state(MODEL_FN())
loss_tol = PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats")
param_tol = PAGE.state("tolerance.param.adamw", checks.PARAM_TOL["adamw"], "absolute")
rows, gaps = [], []
for strategy, results in RUNS.items():
    run = f"{strategy.label} script x{WORLD_SIZE}"
    layouts = [lay for r in results for lay in r["layouts"]]
    if strategy is FSDP2_:
        checks.assert_sharded(run, layouts, WORLD_SIZE)
    else:
        checks.assert_replicated(run, layouts, full_shapes)
    checks.assert_same_init(run, initial, results[0]["initial"])
    checks.assert_ranks_agree(run, [r["params"] for r in results])
    d_loss = checks.assert_losses_match(run, REF_LOSSES,
                                        mean_over_ranks([r["losses"] for r in results]),
                                        loss_tol, against=checks.SINGLE_PROCESS)
    d_norm = checks.expect_close("clip norm", run, results[0]["norms"], REF_NORMS, loss_tol,
                                 "gradient norm before clipping",
                                 against=checks.SINGLE_PROCESS)
    d_param = checks.assert_params_match(run, REF_PARAMS, results[0]["params"], param_tol,
                                         against=checks.SINGLE_PROCESS)
    for r in results:
        checks.assert_params_match(f"{run}, checkpoint", r["saved"], r["loaded"], 0.0,
                                   "checkpoint round trip", against="the state it saved")
    n_state = PAGE.state(f"ddp_to_fsdp2.{strategy.value}.checkpoint_tensors",
                         len(results[0]["saved"]), "tensors")
    gaps.append(d_loss)
    rows.append([run, d_loss, d_norm, d_param, n_state])
COLS = ["script", "max loss gap", "max norm gap", "max param gap", "tensors loaded bitwise"]
with PAGE.scope(steps=STEPS, world_size=WORLD_SIZE, micro_batches=K, **MODEL):
    PAGE.show("ddp_to_fsdp2.checks", rows, COLS, formats={c: ".1e" for c in COLS[1:4]},
              keys=[s.value for s in RUNS])
    max_gap = PAGE.check("ddp_to_fsdp2.max_loss_gap", max(gaps), fmt=".1e")
print(f"All checks passed: both scripts train as one process does, clipping included, and "
      "each loads the state it saved, bit for bit.")

# %%
# The gradient norm the clip saw, step by step: both scripts on the reference's curve, and the
# threshold above which ``clip_grad_norm_`` scaled the gradients down.
plotting.style()
fig, ax = plt.subplots(figsize=(7.2, 3.8))
ax.plot(REF_NORMS, color=plotting.REFERENCE_COLOR, lw=4, alpha=0.35, label="1 process")
for k, (strategy, results) in enumerate(RUNS.items()):
    ax.plot(results[0]["norms"], color=strategy.color, ls=("-", "--")[k], marker="os"[k],
            label=f"{strategy.label} script")
ax.axhline(MAX_NORM, color="grey", ls=":", label="max_norm")
ax.set(xlabel="training step", ylabel="gradient norm before clipping",
       title="Clipping sees the global norm under DDP and FSDP2")
plotting.legend_below(fig)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# What changed: the two scripts, line by line
# -------------------------------------------
# The diff of the two scripts as the page ran them (their source, read back with ``inspect``):
# blank and comment lines ignored, and the functions' ``ddp_``/``fsdp2_`` prefixes too, since they
# only tell the two scripts apart on this page (:mod:`guide.script_diff`).
BEFORE = script_diff.source(ddp_setup, ddp_micro_step, ddp_train, ddp_save, ddp_load)
AFTER = script_diff.source(fsdp2_setup, fsdp2_micro_step, fsdp2_train, fsdp2_save, fsdp2_load)
LINES = script_diff.diff_lines(BEFORE, AFTER, rename={"ddp_": "fsdp2_"})
COUNT = script_diff.counts(LINES)
checks.expect_close("diff", "DDP -> FSDP2", COUNT["before"] + COUNT["added"] - COUNT["removed"],
                    len(script_diff.code_lines(AFTER)), 0,
                    "running lines after", against="the FSDP2 script's own line count")
PAGE.show("ddp_to_fsdp2.diff",
          [["lines", COUNT["before"], COUNT["after"], COUNT["same"], COUNT["changed"],
            COUNT["removed"], COUNT["added"]]],
          ["running lines", "DDP script", "FSDP2 script", "same", "changed", "removed", "added"],
          keys=["lines"])
report.show(script_diff.side_by_side(LINES, ("DDP (before)", "FSDP2 (after)")))

# %%
# When DDP is faster
# ------------------
# For a model that fits one GPU, sharding buys memory it does not need and pays in collectives.
# Counted in the runs above, per optimizer step of ``K`` micro-batches (steps after the first):
# DDP all-reduces the gradients once (``no_sync()`` skips the others); FSDP2 all-gathers every
# unit in each micro-batch's forward and each block again in its backward, and reduce-scatters
# once. Each count is checked against :mod:`guide.comm.expected` (:func:`guide.checks.check_volume`:
# calls exactly, elements within :data:`guide.checks.ELEMENT_TOL`); the bytes are the ring model's
# (:func:`guide.comm.ring_bytes`: what NCCL approaches), not gloo's. ``clip_grad_norm_``'s one-number
# all-reduce and ``full_tensor()`` run as DTensor collectives that the log does not see.
model = MODEL_FN()
one = comm.fsdp2_step(comm.fsdp2_groups(model), WORLD_SIZE)
EXPECTED = {DDP_: comm.ddp_step(list(full_shapes.values()), WORLD_SIZE),
            FSDP2_: [c for c in one if c.kind == "all_gather"] * K
            + [c for c in one if c.kind == "reduce_scatter"]}
rows = []
for strategy, results in RUNS.items():
    run = f"{strategy.label} script x{WORLD_SIZE}"
    for r in results:
        volume = checks.check_volume(run, r["records"], EXPECTED[strategy], STEPS - 1)
    calls = {kind: sum(c.kind == kind for c in results[0]["records"]) / (STEPS - 1)
             for kind in ("all_reduce", "all_gather", "reduce_scatter")}
    ring = sum(comm.ring_bytes(c) for c in EXPECTED[strategy]) / 2**10
    rows.append([strategy.label, calls["all_reduce"], calls["all_gather"],
                 calls["reduce_scatter"], sum(v[0] for v in volume.values()), ring])
COLS = ["script", "all-reduces", "all-gathers", "reduce-scatters", "elements (full buffers)",
        "KiB sent per rank (ring model)"]
with PAGE.scope(world_size=WORLD_SIZE, micro_batches=K, precision="fp32", **MODEL):
    PAGE.show("ddp_to_fsdp2.per_step", rows, COLS,
              formats={"elements (full buffers)": ",.0f", "KiB sent per rank (ring model)": ",.1f",
                       "all-reduces": ".0f", "all-gathers": ".0f", "reduce-scatters": ".0f"},
              keys=[s.value for s in RUNS])
    ratio = PAGE.state("ddp_to_fsdp2.bytes_ratio", rows[1][-1] / rows[0][-1], "× DDP's",
                       fmt=".2f")

# %%
# Llama-3.2-1B on one 8-GPU node, predicted
# -----------------------------------------
# **GPU-only, predicted.** Llama-3.2-1B (:data:`guide.memory.PRESETS`) with bf16 compute and fp32
# reduction on one node of H100s, priced as :doc:`plot_step_time_estimates` prices Llama-3-70B: the
# memory per GPU from :func:`guide.memory.fit.per_gpu` (the calculator's), each collective from
# link rates and NCCL's latencies (:func:`guide.comm.step_seconds`, one after another), compute
# from torchtitan's FLOP count at the same assumed MFU. Each GPU runs ``M`` micro-batches of one
# ``SEQ``-token sequence per step; DDP all-reduces once per step, FSDP2 all-gathers in every
# micro-batch and reduce-scatters once, as the scripts above do. The step estimate assumes perfect
# overlap (the larger of communication and compute): what it shows is which one the step waits on.
from guide.comm import H100_NODE
from guide.memory import GPU_MEMORY_CONSTANTS, GPU_TOTAL_MEMORY_GIB, PRESETS, GiB, activation_bytes
from guide.memory.fit import per_gpu

ARCH = PRESETS["llama-3.2-1b"]
G, SEQ, MICRO = H100_NODE.gpus_per_node, 4096, (1, 4, 16)
BF16, FP32 = torch.bfloat16, torch.float32
GPU = "H100 (80 GB)"
PEAK = PAGE.cite("h100.dense_bf16_flops")
MFU = PAGE.cite("torchtitan.llama3-8b.mfu.high")
PAGE.cite(GPU_MEMORY_CONSTANTS[GPU])
CAPACITY = GPU_TOTAL_MEMORY_GIB[GPU]
PREDICTED = dict(model="llama-3.2-1b", seq_len=SEQ, gpus=G, hardware=H100_NODE.name,
                 precision="bf16_mixed", mfu=MFU)
act = activation_bytes(ARCH, SEQ, 1, checkpointing="none", bytes_per_element=BF16.itemsize)
memory = {s: per_gpu(ARCH, s.value, G, "bf16_mixed", "adamw", activations=act,
                     ddp_buckets=True).total / GiB for s in (DDP_, FSDP2_)}
# The section's premise, checked: under DDP the model fits one GPU.
fits = checks.expect_order("memory model", "llama-3.2-1b, DDP", memory[DDP_], CAPACITY,
                           low_name="DDP's GiB per GPU", high_name="an H100's total memory",
                           unit="GiB")
units = ARCH.fsdp2_units()
fsdp2_one = comm.fsdp2_step(comm.fsdp2_unit_groups(units), G, BF16, FP32)
gathers = comm.step_seconds([c for c in fsdp2_one if c.kind == "all_gather"], H100_NODE)
scatter = comm.step_seconds([c for c in fsdp2_one if c.kind == "reduce_scatter"], H100_NODE)
all_reduce = comm.step_seconds(comm.ddp_step(ARCH.param_shapes(), G, FP32), H100_NODE)
per_token = comm.model_flops_per_token(ARCH.n_params - ARCH.vocab * ARCH.hidden, ARCH.layers,
                                       ARCH.hidden, SEQ)
compute = comm.compute_seconds(ARCH.n_params, SEQ, PEAK, MFU, flops_per_token=per_token)
rows = []
for m in MICRO:
    ddp_s, fsdp2_s = all_reduce, m * gathers + scatter
    rows.append([m, m * SEQ, 1e3 * ddp_s, 1e3 * fsdp2_s, 1e3 * m * compute, fsdp2_s / ddp_s,
                 fsdp2_s / (m * compute)])
COLS = ["micro-batches per step", "tokens per GPU", "DDP comm ms", "FSDP2 comm ms",
        "compute ms", "FSDP2/DDP comm", "FSDP2 comm/compute"]
with PAGE.scope(**PREDICTED):
    PAGE.show("ddp_to_fsdp2.predicted.table", rows, COLS,
              formats={"DDP comm ms": ".1f", "FSDP2 comm ms": ".1f", "compute ms": ".0f",
                       "FSDP2/DDP comm": ".1f", "FSDP2 comm/compute": ".0%"},
              title="Llama-3.2-1B, 8 × H100, one node (predicted)", keys=[f"m{m}" for m in MICRO])
    grows = {m: PAGE.state(f"ddp_to_fsdp2.predicted.m{m}.fsdp2_ddp_comm", r[5], "× DDP's",
                           fmt=".1f") for m, r in zip(MICRO, rows)}
    mem = {DDP_.value: PAGE.check(f"ddp_to_fsdp2.predicted.{DDP_.value}.gib_per_gpu", fits,
                                  fmt=".1f"),
           FSDP2_.value: PAGE.state(f"ddp_to_fsdp2.predicted.{FSDP2_.value}.gib_per_gpu",
                                    memory[FSDP2_], "GiB", fmt=".1f")}
    # Below this many tokens per micro-batch, FSDP2's all-gathers take longer than the compute
    # they hide behind: the step waits on them.
    breakeven = PAGE.state("ddp_to_fsdp2.predicted.fsdp2_breakeven_tokens",
                           round(gathers / (compute / SEQ)), "tokens per GPU per micro-batch")
capacity = PAGE.state("h100.memory_total_gib", round(CAPACITY, 1), "GiB")  # the GPU's, any run
# What the prose says, held to the numbers: FSDP2's share grows with M; every row hides behind
# compute (so exposure needs micro-batches below the break-even); DDP's is one all-reduce per step.
checks.expect("prediction", "llama-3.2-1b", all(a[5] < b[5] for a, b in zip(rows, rows[1:])),
              "FSDP2's communication does not grow with the micro-batches: rewrite the advice.")
checks.expect("prediction", "llama-3.2-1b", all(r[6] < 1 for r in rows) and breakeven < SEQ,
              "FSDP2's communication outlasts compute in a row: rewrite the advice.")
print(f"Predicted, per GPU: DDP holds {mem['ddp']:.1f} GiB, FSDP2 {mem['fsdp2']:.1f} GiB of "
      f"an H100's {capacity:.1f} GiB. FSDP2's all-gathers outlast a micro-batch's compute below "
      f"{breakeven:,} tokens per GPU.")

# %%
# The advice, as the numbers give it. Llama-3.2-1B fits each GPU of the node under DDP, so the
# memory FSDP2 frees buys nothing unless it is spent (a longer sequence, a bigger micro-batch, no
# activation checkpointing). What FSDP2 costs grows with accumulation: DDP all-reduces once per
# step, FSDP2 gathers every unit in every micro-batch. At these sizes NVLink hides either behind
# compute (predicted); with micro-batches below the break-even above, FSDP2's all-gathers no longer
# hide and the step waits on them, and across nodes every byte costs more
# (:doc:`plot_step_time_estimates`). Switch when the calculator says DDP does not fit, or leaves no
# room for the activations you need; until then, keep DDP.
PAGE.conclude(
    f"Both scripts match one process (largest loss gap {max_gap:.1e} nats) and load their "
    f"checkpoints bit for bit; the switch changes {COUNT['changed']} lines, removes "
    f"{COUNT['removed']} and adds {COUNT['added']}. FSDP2 sent {ratio:.2f}x DDP's bytes per step "
    f"here; for Llama-3.2-1B on one 8-GPU node (predicted) DDP fits in {mem['ddp']:.1f} GiB per "
    "GPU, so stay on DDP until the model state does not fit.")
