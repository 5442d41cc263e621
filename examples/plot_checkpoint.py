"""
Checkpoints that survive a change of world size
===============================================

.. admonition:: Verdict
   :class: tip

   Save with ``dcp.save`` of ``get_state_dict(model, optimizer)`` (model **and** optimizer), into a
   new directory per step, published by a rename only once every rank finished; load with
   ``dcp.load`` at any world size (bit for bit here). Use ``dcp.async_save`` when the write stalls
   training: it returned :claim:`checkpoint.big.async_save.saved_ms <unit>` sooner than ``dcp.save``
   here. Avoid ``full_state_dict=True`` for training checkpoints: rank 0 held the whole model state
   (:claim:`checkpoint.big.full_state_dict.peak_bytes <unit>` at peak); keep it for exporting one
   file, and ``torch.load`` it with ``weights_only=True``.
   Measured on CPU gloo processes (tiny models, two shared cores); this page predicts nothing.

After "does it fit?", the question FSDP2 users ask most is "can I stop, and resume on a different
number of GPUs?" (torchtitan #811 and #850, accelerate #3971, torchtitan #1058). Tutorials show the
API; this page proves the answer. It trains FSDP2 on 4 ranks with AdamW, saves the model **and** the
optimizer with ``torch.distributed.checkpoint`` (DCP), and loads that one checkpoint into FSDP2 on 4
and on 2 ranks, HSDP on a ``(2, 2)`` mesh, DDP on 2 ranks and a single process. It asserts that each
of them holds the saved parameters and Adam moments bit for bit, and that training on from the
checkpoint is the training that never stopped. Then: what a checkpoint weighs on disk, a full state
dict for ``torch.load``, ``async_save``, meta-device init, and what a save that dies halfway leaves
behind.

Everything below ran when this page was built; a claim that does not hold **fails the docs build**.
"""

# %%
# The plain PyTorch: save, load, ``async_save``
# ---------------------------------------------
# What to copy, torch only. ``get_state_dict(model, optimizer)`` returns what DCP needs from both.
# For FSDP2 each value is a ``DTensor``: this rank's rows plus the global shape and the placement.
# The optimizer's state is keyed by *parameter name*, not by the integer ids of
# ``optimizer.state_dict()``: that is what lets a job of another size match Adam's moments to its
# own parameters. ``dcp.save`` writes each rank's chunks to its own file and, last, rank 0 writes
# ``.metadata``, the index of who saved which rows.
#
# Loading is the same call in reverse: ``get_state_dict`` on the *new* model gives DTensors (or
# plain tensors) of the new layout, ``dcp.load`` fills them in place from whichever saved chunks
# overlap each rank's rows, and ``set_state_dict`` hands them to the model and the optimizer.
# ``dcp.async_save`` does the save's copy (staging) and returns a future; a thread writes the files.
# ``full_state_dict=True`` gathers every tensor whole on rank 0 instead (see below for its cost).
# Every job on this page calls these very functions.
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)


def save(model, opt, checkpoint_id, process_group=None) -> None:
    msd, osd = get_state_dict(model, opt)  # DTensors; optimizer state keyed by name
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=checkpoint_id,
             process_group=process_group)


def load(model, opt, checkpoint_id, storage_reader=None, no_dist: bool = False,
         with_optimizer: bool = True) -> None:
    msd, osd = get_state_dict(model, opt)  # the new layout: dcp.load fills it in place
    state = {"model": msd, "optim": osd} if with_optimizer else {"model": msd}
    dcp.load(state, checkpoint_id=checkpoint_id, storage_reader=storage_reader,
             no_dist=no_dist)  # no_dist: one process
    if with_optimizer:
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    else:
        set_model_state_dict(model, msd)


def async_save(model, opt, checkpoint_id, process_group):
    """Returns a future; training goes on while a thread writes (its own gloo group)."""
    msd, osd = get_state_dict(model, opt)
    return dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=checkpoint_id,
                          process_group=process_group)


def save_full(model, opt, path) -> tuple[dict, dict]:
    """One plain file for ``torch.load``: rank 0 gathers the whole state (others get ``{}``)."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                   cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save({"model": msd, "optim": osd}, path)
    return msd, osd


# %%
# The run to checkpoint
# ---------------------
# A one-block :class:`guide.model.TinyLM`, AdamW, ``K`` steps before the checkpoint and ``K`` after.
# Each job gets its ranks' slices of the same global batches, so a run at any world size trains on
# the same data. Every dim-0 size of this model divides by 4 (FSDP2's chunks are even).
import shutil
import time
import warnings

import matplotlib.pyplot as plt
from torch.distributed.checkpoint.format_utils import (
    dcp_to_torch_save,
    torch_save_to_dcp,
)
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checkpoint, checks, plotting, report
from guide.data import synthetic_batches
from guide.layout import full_state, local_tensor
from guide.memory import (RESOLUTION_BYTES, PeakMemory, param_shapes, per_rank_state_bytes,
                          prepare)
from guide.model import ModelConfig, TinyLM, build_model
from guide.sharding import Strategy, apply_ddp, apply_fsdp2
from guide.training import make_optimizer, mean_over_ranks, train_steps
from guide.optimizers import OPTIMIZERS

# dcp.load(no_dist=True) warns that it assumes one process, though it was told so.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
CFG = ModelConfig(n_layers=1)
K = 3  # steps before the checkpoint, and after it
BATCHES = synthetic_batches(steps=2 * K, batch_size=8, seq_len=16, vocab=CFG.vocab,
                            seed=0)
PAGE = guide.Page(section="Operate: checkpoints, clusters", order=2, key_api="dcp.save(",
                  world_size=4, supports=(2, 4))
SOURCE_N = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
SHAPES = param_shapes(build_model(CFG))
ROOT = checkpoint.job_dir("guide-checkpoint")  # one path for every rank of every job
PARAMS = PAGE.state("tinylm.1-block.params",
                    sum(torch.Size(s).numel() for s in SHAPES), "parameters")
TENSORS = PAGE.state("tinylm.1-block.tensors", len(SHAPES), "tensors")
SEQUENCES = PAGE.state("checkpoint.batch.sequences", BATCHES.shape[1], "sequences")
SAVED = dict(model="tinylm-1-block", optimizer="adamw", world_size=SOURCE_N, steps=K)
print(f"{PARAMS:,} parameters in {TENSORS} tensors; {K} + {K} AdamW steps on "
      f"batches of {SEQUENCES} sequences; checkpoints in {ROOT}")

# %%
# Published atomically, read verified
# -----------------------------------
# DCP overwrites an existing checkpoint in place. :func:`guide.checkpoint.publishing` makes the save
# atomic instead: ``save`` writes into ``step-000003.partial``, and only when every rank has
# returned does rank 0 write a manifest (size and SHA-256 of every file) and rename the directory.
# A crash leaves a ``.partial`` directory, never a published one. Before a load,
# :func:`guide.checkpoint_verify.verify` checks every file whole, every tensor's name and global
# shape what this model expects, or raises an error naming the file or the parameter (see "Faults"
# below). :class:`guide.checkpoint.CountingReader` is DCP's file reader that also counts the bytes
# it reads.
def save_published(model, opt, path) -> None:
    with checkpoint.publishing(path) as partial:
        save(model, opt, partial)


def load_verified(model, opt, path, no_dist: bool = False, with_optimizer: bool = True) -> int:
    msd, osd = get_state_dict(model, opt)
    checkpoint.verify(path, {"model": msd, "optim": osd} if with_optimizer else {"model": msd})
    reader = checkpoint.CountingReader(path)
    load(model, opt, path, storage_reader=reader, no_dist=no_dist, with_optimizer=with_optimizer)
    return reader.bytes_read


# %%
# Four layouts
# ------------
# The same model, spread four ways. FSDP2: ``fully_shard`` on each block, then the root, over all
# ranks. HSDP: the same calls over a 2-D mesh, sharded within each pair of ranks and replicated
# across the pairs. DDP: a full copy per rank. One process: no wrapper. Every target starts from
# another seed than the source, so a load that did nothing fails the checks.
def build(rank, layout: str, seed: int, cfg: ModelConfig = CFG):
    model = build_model(cfg, seed=seed, device=rank.device)
    if layout == "FSDP2":
        apply_fsdp2(model, init_device_mesh(rank.device.type, (rank.world_size,)))
    elif layout == "HSDP":
        mesh = init_device_mesh(rank.device.type, (2, rank.world_size // 2),
                                mesh_dim_names=("replicate", "shard"))
        apply_fsdp2(model, mesh)
    elif layout == "DDP":
        model = apply_ddp(model, init_device_mesh(rank.device.type, (rank.world_size,)))
    return model, make_optimizer("adamw", model.parameters())


# %%
# The jobs
# --------
# The source trains ``K`` steps, saves (timed), keeps the full state it saved, saves the same step
# two other ways (next sections), then trains ``K`` more steps: the run that never stopped. Each
# target loads the checkpoint, keeps what it loaded, and trains the same ``K`` steps on from there.
# Full states are gathered on every rank (a collective) and kept on rank 0.
def source(rank, root, group) -> dict:
    model, opt = build(rank, "FSDP2", seed=0)
    losses = train_steps(model, opt, BATCHES[:K], rank)
    start = time.perf_counter()
    save_published(model, opt, checkpoint.step_dir(root, K))
    out = {"save_s": time.perf_counter() - start}
    saved = checkpoint.gathered_state(model, opt)
    full_state_dict(model, opt, root / "full.pt")
    out.update(async_save_while_training(model, opt, rank, root, group))
    uninterrupted = checkpoint.gathered_state(model, opt)
    out["losses"] = losses + out.pop("losses_after")
    if not rank.is_main:
        return out
    return {**out, "saved": saved, "uninterrupted": uninterrupted}


def target(rank, root, layout: str, with_optimizer: bool = True) -> dict:
    model, opt = build(rank, layout, seed=1)
    start = time.perf_counter()
    bytes_read = load_verified(model, opt, checkpoint.step_dir(root, K),
                               no_dist=layout == "1 process", with_optimizer=with_optimizer)
    load_s = time.perf_counter() - start
    loaded = checkpoint.gathered_state(model, opt)
    losses = train_steps(model, opt, BATCHES[K:], rank)
    resumed = checkpoint.gathered_state(model, opt)
    placements = getattr(next(model.parameters()), "placements", "full copy")
    if layout in ("FSDP2", "HSDP"):
        placements = str(tuple(placements))
    out = {"load_s": load_s, "bytes_read": bytes_read, "losses": losses,
           "placements": placements}
    return {**out, "loaded": loaded, "resumed": resumed} if rank.is_main else out


# %%
# Full state dict against sharded
# -------------------------------
# ``StateDictOptions(full_state_dict=True, cpu_offload=True)`` gathers every tensor whole onto rank
# 0's CPU memory (the other ranks get ``{}``): one plain file that ``torch.save`` writes and any
# single process reads, at the price of the whole model state on one rank.
def full_state_dict(model, opt, path) -> int:
    msd, osd = save_full(model, opt, path)
    tensors = checkpoint.flat_tensors([msd, osd])
    return sum(t.nbytes for t in tensors.values())  # 0 off rank 0


# %%
# ``async_save``: save while training goes on
# -------------------------------------------
# ``dcp.async_save`` copies the state dict (staging) and returns a future; a thread writes the files
# while the next steps run. Its collectives run in that thread, so it gets a process group of its
# own (gloo: async_save needs a CPU backend). The save is published when the future is done. What
# blocks training is the call, then the wait for the future and the publish. (The first call of
# each kind of save also pays a one-time set-up, a thread pool and the planner's caches: each job
# makes a one-element save of each kind before anything is timed.)
def async_save_while_training(model, opt, rank, root, group) -> dict:
    partial = checkpoint.begin_save(root / "async", group)
    future = async_save(model, opt, partial, group)
    losses_after = train_steps(model, opt, BATCHES[K:], rank)
    future.result()
    checkpoint.publish(partial, group)
    return {"losses_after": losses_after}


def warm_up(root, group) -> None:
    dcp.save({"w": torch.zeros(1)}, checkpoint_id=root / "warm-up")
    dcp.async_save({"w": torch.zeros(1)}, checkpoint_id=root / "warm-up-async",
                   process_group=group).result()


# %%
# The costs, on a bigger model
# ----------------------------
# On this toy, DCP's fixed costs (plans, records, barriers) outweigh its tensors. The costs that
# grow with the model are measured on ``BIG``, a bigger model of the same kind (not trained:
# ``get_state_dict`` gives AdamW its zero moments): rank 0's peak memory
# (:class:`guide.memory.PeakMemory`) during a sharded save and during a full state dict, and how
# long a blocking save and an ``async_save`` keep training waiting. Both end with the same
# publish (checksums and a rename), which training waits for either way and which is timed on its
# own: what ``async_save`` saves is the time between the call and the return to training. Each
# time is the fastest of ``TIMINGS`` saves (a busy machine only ever adds time).
BIG = ModelConfig(vocab=1024, d_model=256, n_layers=2, n_heads=4, d_mlp=1024)
TIMINGS = 3  # each save is timed this many times; the fastest counts (a busy machine only adds)


def timed_save(model, opt, path, group, use_async: bool) -> tuple[float, float]:
    """(seconds until training could go on, seconds of the publish that follows the write)."""
    start = time.perf_counter()
    partial = checkpoint.begin_save(path, group)
    if use_async:
        future = async_save(model, opt, partial, group)
    else:
        save(model, opt, partial, process_group=group)
    returned_s = time.perf_counter() - start  # training goes on from here
    if use_async:
        future.result()  # in a real loop: a few steps later
    start = time.perf_counter()
    checkpoint.publish(partial, group)
    return returned_s, time.perf_counter() - start


def big_saves(rank, root, group) -> dict:
    prepare()  # freed memory leaves the process: PeakMemory measures live tensors
    model, opt = build(rank, "FSDP2", seed=0, cfg=BIG)
    with PeakMemory(device="cpu") as sharded:
        save_published(model, opt, root / "big-sharded")
    with PeakMemory(device="cpu") as full:
        held = full_state_dict(model, opt, root / "big-full.pt")
    times = {"save": [], "async_save": []}
    for i in range(TIMINGS):  # alternate, so that a burst of load hits both
        for kind in times:
            times[kind].append(timed_save(model, opt, root / f"big-{kind}-{i}", group,
                                          use_async=kind == "async_save"))
    return {"peak_sharded": sharded.peak_bytes, "peak_full": full.peak_bytes,
            "full_held": held,
            **{f"{kind}_returned_s": min(t[0] for t in ts) for kind, ts in times.items()},
            "publish_s": min(t[1] for ts in times.values() for t in ts)}


# %%
# Meta-device init
# ----------------
# Large models are built on ``torch.device("meta")`` (shapes, no memory), sharded, and only then
# given memory with ``to_empty``: no rank ever holds the whole model. The trap is the next line
# people write: ``reset_parameters()`` on every module, same seed on every rank. On a CPU mesh each
# rank then draws its *local* shard from the same random stream: every rank holds the same values,
# and the model is not the one a single process would build. The fix: rank 0 builds (or loads a seed
# checkpoint of) the real initial weights, and ``set_model_state_dict(...,
# StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))`` sends each rank its rows.
def meta_init(rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    with torch.device("meta"):
        trap = TinyLM(CFG)
    apply_fsdp2(trap, mesh)
    trap.to_empty(device=rank.device)
    torch.manual_seed(0)
    for module in trap.modules():  # the trap: initialise each rank's shard on its own
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()

    with torch.device("meta"):
        fixed = TinyLM(CFG)
    apply_fsdp2(fixed, mesh)
    fixed.to_empty(device=rank.device)
    full = build_model(CFG, seed=0).state_dict() if rank.is_main else {}  # rank 0 only
    set_model_state_dict(fixed, full,
                         options=StateDictOptions(full_state_dict=True,
                                                  broadcast_from_rank0=True))
    trap_local = {n: local_tensor(p).detach().cpu().clone()
                  for n, p in trap.named_parameters()}
    return {"device": rank.device.type, "trap_local": trap_local,
            "trap": full_state(trap), "fixed": full_state(fixed)}


# %%
# Run them
# --------
# One job at 4 ranks (the source, the bigger model, the targets of that size), one at 2 ranks (its
# targets and the meta-device init), and the single process here. Under ``torchrun`` the world size
# is fixed: one job runs it all at that size, and the single process runs in each rank's own
# process.
TARGETS = {4: ["FSDP2", "HSDP"], 2: ["FSDP2", "DDP"]}


def job(rank, root, layouts: list[str], with_source: bool, with_meta: bool) -> dict:
    out = {}
    if with_source:
        group = dist.new_group(backend="gloo")  # for async_save's thread
        warm_up(root, group)
        out["source"] = source(rank, root, group)
        out["big"] = big_saves(rank, root, group)
    out.update({(layout, rank.world_size): target(rank, root, layout)
                for layout in layouts})
    if with_meta:
        out["meta"] = meta_init(rank)
    return out


if guide.under_torchrun():
    JOBS = [(SOURCE_N, TARGETS.get(SOURCE_N, ["FSDP2"]), True, True)]
else:
    JOBS = [(SOURCE_N, TARGETS[SOURCE_N], True, False), (2, TARGETS[2], False, True)]
results = {}
for n, layouts, with_source, with_meta in JOBS:
    per_rank = guide.launch(job, n, ROOT, layouts, with_source, with_meta)
    if with_source:
        big = per_rank[0].pop("big")
    if with_meta:
        meta = [r.pop("meta") for r in per_rank]
    for key in per_rank[0]:  # a step's global loss: the ranks' mean (equal slices)
        losses = [r[key]["losses"] for r in per_rank]
        per_rank[0][key]["losses"] = mean_over_ranks(losses)
    results.update(per_rank[0])
src = results.pop("source")
SINGLE = guide.Rank(0, 1, torch.device("cpu"), "none")
results["1 process", 1] = target(SINGLE, ROOT, "1 process")
forgot = target(SINGLE, ROOT, "1 process", with_optimizer=False)


# %%
# The resharding matrix
# ---------------------
# For each target: the parameters and the optimizer state it loaded (gathered whole with
# ``full_tensor()``) against what the source saved. The check is *bitwise* (tolerance 0) for every
# parameter, ``exp_avg``, ``exp_avg_sq`` and ``step``. "bytes read" is what one rank of the target
# read from the ``.distcp`` files: a rank fetches only the saved chunks that overlap its own rows.
usage = checkpoint.disk_usage(checkpoint.step_dir(ROOT, K))
CKPT_BYTES = PAGE.state("checkpoint.distcp_bytes", sum(usage.file_bytes), "bytes", **SAVED)


def worst(a: dict, b: dict, part: str) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a if k.startswith(part))


def name(layout: str, n: int) -> str:
    if layout == "1 process":
        return layout
    return f"HSDP 2x{n // 2}" if layout == "HSDP" else f"{layout} x{n}"


def shards(layout: str, n: int) -> int:
    """How many pieces the target cuts each tensor into: a rank holds one of them."""
    return {"FSDP2": n, "HSDP": n // 2}.get(layout, 1)


def share_read(layout: str, n: int, bytes_read: int) -> checks.Checked:
    """The fraction of the checkpoint one rank read: about its own piece, 1/shards
    (within half of that: the small records every rank needs come on top)."""
    share, fraction = 1 / shards(layout, n), round(bytes_read / CKPT_BYTES, 2)
    return checks.expect_close(
        "reads its share", name(layout, n), fraction, share, share / 2, what="fraction read",
        unit="of checkpoint", against="1 / the pieces the target cuts each tensor into")


rows = []
for (layout, n), res in results.items():
    checks.assert_params_match(f"FSDP2 x{SOURCE_N} -> {name(layout, n)}", src["saved"],
                               res["loaded"], 0.0, check="checkpoint round trip",
                               against=f"the saved FSDP2 x{SOURCE_N} state")
    rows.append([name(layout, n), res["placements"],
                 worst(src["saved"], res["loaded"], "model."),
                 worst(src["saved"], res["loaded"], "optim."), res["bytes_read"],
                 share_read(layout, n, res["bytes_read"]), res["load_s"]])
# Computed: every target was checked bitwise (tolerance 0) just above, and a bound of 0 around a
# gap of 0 is no value the ledger can record as asserted; the number is that check's result.
PAGE.state("checkpoint.reshard.max_abs_diff", max(max(r[2:4]) for r in rows),
           "absolute", guard="computed", **SAVED)
PAGE.show("checkpoint.reshard", rows, ["target", "placements", "max |Δ| params", "max |Δ| optimizer",
                              "bytes read/rank", "of checkpoint", "load s"],
                       formats={"max |Δ| params": ".1e", "max |Δ| optimizer": ".1e",
                                "of checkpoint": ".0%", "load s": ".2f"},
                       title=f"source: FSDP2 x{SOURCE_N}, AdamW, after {K} steps "
                             f"({CKPT_BYTES:,} bytes of .distcp files)",
                       **SAVED)

# %%
# Each rank reads the rows it will hold: about ``1/S`` of the checkpoint when the target cuts each
# tensor into ``S`` pieces (``S = N`` for FSDP2 on ``N`` ranks, the shard-group size for HSDP, whose
# replicas each read their own copy, and ``S = 1`` for DDP and the single process), as the "of
# checkpoint" column shows and the build asserts; the small records every rank needs, ``step`` and
# the optimizer's hyperparameters, come on top. In every case the values are the same, bit for bit.
plotting.style()
fig, ax = plt.subplots(figsize=(6.4, 3.6))
names = [name(layout, n) for layout, n in results]
read = [res["bytes_read"] / 1024 for res in results.values()]
colors = [Strategy.FSDP2.color if layout in ("FSDP2", "HSDP") else Strategy.DDP.color
          for layout, _ in results]
ax.barh(names, read, color=colors)
for y, kib in enumerate(read):
    ax.text(kib, y, f" {kib:,.0f}", va="center", fontsize=9)
ax.axvline(CKPT_BYTES / 1024, color="black", ls="--", lw=1)
ax.text(CKPT_BYTES / 1024, 0, "whole checkpoint ", ha="right", va="center", fontsize=9)
ax.invert_yaxis()
ax.set_xlabel("bytes read by one rank of the target (KiB)")
ax.set_title(f"One FSDP2 x{SOURCE_N} checkpoint, loaded bitwise by every layout")
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# Resuming is not restarting
# --------------------------
# Each target trained ``K`` more steps from what it loaded; the source trained the same ``K`` steps
# without stopping. At the source's world size the resumed run is the uninterrupted one **bit for
# bit**: same arithmetic, same order. At another world size or layout the gradient reduction adds
# in another order, so the runs differ in the last bits, which AdamW's division by
# ``sqrt(exp_avg_sq)`` magnifies: the tolerance is the site's measured AdamW tolerance across world
# sizes, ``checks.PARAM_TOL["adamw"]``, a fraction of one learning-rate step (printed below; see
# :mod:`guide.checks`). A resume that forgot the optimizer state restarts Adam's moments and step
# count, and must fail that same check.
checks.assert_learns(f"FSDP2 x{SOURCE_N}, uninterrupted", src["losses"])
TOL = PAGE.state("tolerance.param.adamw", checks.PARAM_TOL["adamw"], "absolute")
adamw = make_optimizer("adamw", [torch.zeros(1, requires_grad=True)])
LR = PAGE.state("adamw.lr", adamw.defaults["lr"], "per step")
print(f"AdamW's parameter tolerance {TOL:.0e} is {TOL / LR:g} of its learning rate "
      f"{LR:g}\n")
params_after = {k: v for k, v in src["uninterrupted"].items() if k.startswith("model.")}
RESUMES = "resume = uninterrupted"
rows = []
for (layout, n), res in results.items():
    run, same = f"resume: {name(layout, n)}", layout == "FSDP2" and n == SOURCE_N
    want = src["uninterrupted"] if same else params_after
    loss_gap = checks.assert_losses_match(run, src["losses"][K:], res["losses"],
                                          0.0 if same else checks.LOSS_TOL,
                                          against="the uninterrupted run")
    resumed = {k: res["resumed"][k] for k in want}
    param_gap = checks.assert_params_match(run, want, resumed, 0.0 if same else TOL,
                                           check=RESUMES, against="the uninterrupted run")
    tolerance = "0 (bitwise)" if same else f"{TOL:.0e}"
    rows.append([name(layout, n), tolerance, loss_gap, param_gap])
forgot_gap = worst(params_after, forgot["resumed"], "model.")
checks.expect(RESUMES, "optimizer state forgotten", not forgot_gap <= TOL,
              f"max |Δ| {forgot_gap:.1e} passes the tolerance {TOL:.0e}: the check "
              "cannot tell.")
rows.append(["1 process, optimizer state not loaded", f"{TOL:.0e}",
             checks.max_abs_diff(src["losses"][K:], forgot["losses"]), forgot_gap])
PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats")
same, others, without = rows[0], rows[1:-1], rows[-1]  # the source's own layout first
resume = {  # claim: (printed gap, unit, the check that bounds it)
    "same_layout.loss_gap": (same[2], "nats", "loss equivalence"),
    "same_layout.param_gap": (same[3], "absolute", RESUMES),
    "other_layouts.loss_gap": (max(r[2] for r in others), "nats", "loss equivalence"),
    "other_layouts.param_gap": (max(r[3] for r in others), "absolute", RESUMES),
    "without_optimizer_state.param_gap": (without[3], "absolute", RESUMES),
}
for claim, (gap, unit, check) in resume.items():
    PAGE.state(f"checkpoint.resume.{claim}", float(f"{gap:.1e}"), unit,
               guard="computed", **SAVED)  # the {check} check bounds it; a max over runs
PAGE.show("checkpoint.resume.table", rows, ["resumed run", "tolerance", "max |Δ| loss", "max |Δ| params"],
          formats={"max |Δ| loss": ".1e", "max |Δ| params": ".1e"},
          title=f"{K} steps after the checkpoint, against the run that never "
                "stopped", **SAVED)

# %%
# On disk
# -------
# What should a rank's file hold? Its share of the model state *without* gradients: parameters and
# optimizer state, which the memory model predicts (:func:`guide.memory.per_rank_state_bytes`). The
# tensor bytes in each file, read from ``.metadata``, match it; AdamW's ``step`` counters are the
# only difference (one 0-d tensor per parameter, the same on every rank, so DCP writes each once, on
# one rank). The rest of each file is framing: DCP stores every chunk as its own ``torch.save``
# record, with a zip header and a pickle. That costs about the same per record whatever its size,
# so it dominates this toy and vanishes for real models.
model_bytes = per_rank_state_bytes(SHAPES, "fsdp2", SOURCE_N, "fp32", "adamw",
                                   ddp_buckets=False)
expected = PAGE.state("checkpoint.rank_file.params_and_optimizer_bytes",
                      model_bytes.params + model_bytes.optimizer, "bytes",
                      # computed: the model's prediction, the value the sizes are checked against
                      guard="computed", precision="fp32", **SAVED)
steps_bytes = len(SHAPES) * OPTIMIZERS["adamw"].step_bytes
for r, held in enumerate(usage.tensor_bytes):
    checks.expect("checkpoint size", f"rank {r}",
                  expected - steps_bytes <= held <= expected,
                  f"{held:,} tensor bytes on disk; the model says {expected:,} "
                  f"(less up to {steps_bytes:,} of step counters).")
on_disk = sum(usage.tensor_bytes)
checks.expect("checkpoint size", "all ranks",
              on_disk == SOURCE_N * expected - (SOURCE_N - 1) * steps_bytes,
              f"{on_disk:,} tensor bytes; expected {SOURCE_N} x {expected:,} less "
              f"{SOURCE_N - 1} x {steps_bytes:,} of step counters.")
METADATA = PAGE.state("checkpoint.metadata_bytes", usage.metadata_bytes, "bytes", **SAVED)
SAVE_S = PAGE.state("checkpoint.save_seconds", round(src["save_s"], 2), "s", **SAVED)
PAGE.show("checkpoint.on_disk",
          [[f"rank {r}", usage.file_bytes[r], expected, usage.tensor_bytes[r], usage.entries[r],
            usage.framing_bytes[r] / usage.entries[r]] for r in range(len(usage.file_bytes))],
          ["rank", "file bytes", "model: params + optimizer", "tensor bytes", "records",
           "framing/record"], formats={"framing/record": ",.0f"},
          title=f".metadata: {METADATA:,} bytes; the save took {SAVE_S:.2f} s "
                "(rank 0, publishing included)",
          precision="fp32", **SAVED)

# %%
# The full state dict, and one file for ``torch.load``
# ----------------------------------------------------
# On ``BIG``, the full state dict made rank 0 hold every tensor of the model and the optimizer at
# once: its peak is the whole model state, to within :data:`guide.memory.RESOLUTION_BYTES` (small
# tensors come from glibc's heap and may reuse pages that were already resident, which
# :class:`~guide.memory.PeakMemory` does not see). The sharded save's peak is about the rank's own
# share (DCP serializes the rows it writes), a fraction that shrinks as the world grows. The full
# state dict's file is what a single process loads with ``torch.load(..., weights_only=True)``.
# ``weights_only`` matters: a checkpoint is a pickle, and unpickling without it runs whatever code
# the file names. With it, ``torch.load`` rebuilds only tensors and plain containers (DCP reads its
# own records the same way). ``dcp_to_torch_save`` and ``torch_save_to_dcp`` convert between the
# two formats offline.
with torch.device("meta"):  # shapes only
    big_shapes = param_shapes(TinyLM(BIG))
whole = per_rank_state_bytes(big_shapes, "ddp", 1, "fp32", "adamw", ddp_buckets=False)
share = per_rank_state_bytes(big_shapes, "fsdp2", SOURCE_N, "fp32", "adamw",
                             ddp_buckets=False)
held_checked = checks.expect_close(
    "full state dict", "rank 0", big["full_held"], whole.params + whole.optimizer, 0,
    what="bytes held", unit="bytes", against="per_rank_state_bytes('ddp', 1): the whole state")
peak_full_checked = checks.expect_order(
    "full state dict", "rank 0", big["full_held"] - RESOLUTION_BYTES, big["peak_full"],
    low_name="bytes held - RESOLUTION_BYTES", high_name="rank 0's peak", strict=False,
    unit="bytes", keep="high")
peak_sharded_checked = checks.expect_order(
    "sharded save", "rank 0", big["peak_sharded"], 1.5 * (share.params + share.optimizer),
    low_name="rank 0's peak", high_name="1.5 x its share of the state", unit="bytes")
ON_BIG = dict(model="checkpoint-big", optimizer="adamw", precision="fp32",
              world_size=SOURCE_N)
BIG_PARAMS = PAGE.state("checkpoint.big.params",
                        sum(torch.Size(s).numel() for s in big_shapes), "parameters")
SHARE = PAGE.state("checkpoint.big.sharded_save.share_bytes", share.params + share.optimizer,
                   "bytes", fmt=",.0f", **ON_BIG)  # computed: the memory model's prediction
big_table = report.table(
    [["sharded: get_state_dict + dcp.save",
      PAGE.check("checkpoint.big.sharded_save.peak_bytes", peak_sharded_checked, fmt=",.0f",
                 **ON_BIG), SHARE],
     ["full_state_dict=True, cpu_offload=True",
      PAGE.check("checkpoint.big.full_state_dict.peak_bytes", peak_full_checked, fmt=",.0f",
                 **ON_BIG),
      PAGE.check("checkpoint.big.full_state_dict.held_bytes", held_checked, fmt=",.0f",
                 **ON_BIG)]],
    ["rank 0 saving with", "peak memory (bytes)", "model state it stands for"],
    title=f"BIG: {BIG_PARAMS:,} parameters, AdamW, FSDP2 x{SOURCE_N}")
report.show(big_table)

# %%
# The full state dict's file, and DCP's converters, each give back the sharded save bit for bit.
plain = torch.load(ROOT / "full.pt", weights_only=True)
model, opt = build(SINGLE, "1 process", seed=1)
set_state_dict(model, opt, model_state_dict=plain["model"],
               optim_state_dict=plain["optim"])
checks.assert_params_match("torch.load(full.pt, weights_only=True)", src["saved"],
                           checkpoint.gathered_state(model, opt), 0.0,
                           check="full state dict", against=f"the saved FSDP2 x{SOURCE_N} state")

# under torchrun: one directory per rank
HERE = ROOT / f"process-{dist.get_rank() if dist.is_initialized() else 0}"
HERE.mkdir(exist_ok=True)
dcp_to_torch_save(checkpoint.step_dir(ROOT, K), HERE / "converted.pt")
converted = torch.load(HERE / "converted.pt", weights_only=True)
converted = checkpoint.flat_tensors(converted)
checks.assert_params_match("dcp_to_torch_save", src["saved"],
                           {k: converted[k] for k in src["saved"]}, 0.0,
                           check="format conversion", against=f"the saved FSDP2 x{SOURCE_N} state")
torch_save_to_dcp(ROOT / "full.pt", HERE / "from-torch-save")
model, opt = build(SINGLE, "1 process", seed=1)
msd, osd = get_state_dict(model, opt)
checkpoint.verify(HERE / "from-torch-save", {"model": msd, "optim": osd},
                  manifest=False)
load(model, opt, HERE / "from-torch-save", no_dist=True)
checks.assert_params_match("torch_save_to_dcp", src["saved"],
                           checkpoint.gathered_state(model, opt), 0.0,
                           check="format conversion", against=f"the saved FSDP2 x{SOURCE_N} state")
print("full.pt, dcp_to_torch_save and torch_save_to_dcp: each equals the sharded save, "
      "bitwise")

# %%
# ``async_save``: how long training waits
# ---------------------------------------
# The source's ``async_save`` wrote its files while the next ``K`` steps changed the very tensors
# it was saving. Loaded here, that checkpoint equals the blocking save bit for bit: the staging
# copy froze the state at the moment of the call. On ``BIG``, a blocking ``dcp.save`` returns to
# training after the plan, the staging and the write; ``dcp.async_save`` after the plan and the
# staging copy: the write is what it takes off the training loop, and the check below is that
# ordering. The publish after the write (checksums of every file, one rename) is the same for both
# and blocks either unless it is moved off the loop too; it is timed on its own.
model, opt = build(SINGLE, "1 process", seed=1)
load_verified(model, opt, ROOT / "async", no_dist=True)
checks.assert_params_match("async_save, then training went on", src["saved"],
                           checkpoint.gathered_state(model, opt), 0.0,
                           check="async checkpoint", against="the state saved before training went on")
order = checks.expect_order("async_save", f"BIG, FSDP2 x{SOURCE_N}",
                           big["async_save_returned_s"] * 1e3, big["save_returned_s"] * 1e3,
                           low_name="async_save returned", high_name="dcp.save returned",
                           unit="ms")
blocked = {"save": PAGE.state("checkpoint.big.save.returned_ms", order.reference, "ms",
                              fmt=".0f", **ON_BIG),
           "async_save": PAGE.check("checkpoint.big.async_save.returned_ms", order, fmt=".0f",
                                    **ON_BIG),  # ordered: below the blocking save
           "publish": PAGE.state("checkpoint.big.publish_ms", big["publish_s"] * 1e3, "ms",
                                 fmt=".0f", **ON_BIG)}
SAVED_MS = PAGE.state("checkpoint.big.async_save.saved_ms",
                      big["save_returned_s"] * 1e3 - big["async_save_returned_s"] * 1e3, "ms",
                      fmt=".0f", **ON_BIG)  # the ordering's margin, as measured
PAGE.conclude(
    f"BIG, rank 0: dcp.save returned to training after {blocked['save']:.0f} ms, "
    f"dcp.async_save after {blocked['async_save']:.0f} ms (the staging copy), {SAVED_MS:.0f} ms "
    "sooner; the publish "
    f"that follows either ({blocked['publish']:.0f} ms: checksums and a rename) waits the same.")

# %%
# Meta-device init, measured
# --------------------------
# The trap left a model far from the single-process one; on a CPU mesh every rank also holds the
# same local values. The fix gives the single-process model, bit for bit.
reference_init = full_state(build_model(CFG, seed=0))
trap_gap = max((meta[0]["trap"][k] - v).abs().max().item()
               for k, v in reference_init.items())
checks.expect("meta-device trap", "reset_parameters on shards",
              trap_gap > 0.0 or len(meta) == 1,
              "the trap did not reproduce: the model "
              "equals the single-process init.")
same_everywhere = all(torch.equal(m["trap_local"][k], meta[0]["trap_local"][k])
                      for m in meta for k in m["trap_local"])
checks.expect("meta-device trap", "CPU mesh",
              same_everywhere or meta[0]["device"] != "cpu",
              "the ranks' local shards differ: DTensor's CPU random ops "
              "changed.")
checks.assert_params_match("meta + broadcast_from_rank0", reference_init,
                           meta[0]["fixed"], 0.0, check="meta-device init",
                           against="one process's seeded model")
# Computed: the check above only orders it above 0 (and not on one rank); its size has no
# independent value.
trap_gap = PAGE.state("checkpoint.meta_init.trap_gap", round(trap_gap, 2), "absolute",
                      guard="computed", model="tinylm-1-block",
                      world_size=len(meta))
print(f"reset_parameters() on {len(meta)} ranks' shards: max |Δ| to the single-process "
      f"init {trap_gap:.2f}; identical local values on every rank: {same_everywhere}. "
      "set_model_state_dict(broadcast_from_rank0=True): bitwise equal")

# %%
# Faults: what a crash leaves behind
# ----------------------------------
# ``tests/test_checkpoint.py`` kills a rank in the middle of ``dcp.save``. Saved in place over the
# previous checkpoint, as plain DCP does, the directory keeps the old ``.metadata`` next to one new
# and one old rank file, and ``dcp.load`` loads that mixture of two steps without a word. Saved
# through :func:`guide.checkpoint.publishing`, the crash leaves a ``.partial`` directory and the
# previous checkpoint intact: :func:`guide.checkpoint.latest` returns it and it loads bit for bit. A
# truncated or corrupted shard, a missing ``.metadata``, a checkpoint of a model with one layer more
# or fewer or another hidden size: each fails :func:`guide.checkpoint_verify.verify`, with the file
# or the parameter named and what was expected, on every rank at once (plain DCP loads the corrupted
# shard and the smaller model silently). ``benchmarks/fault_table.py`` lists them with their
# messages.
if not guide.under_torchrun():
    shutil.rmtree(ROOT)
print("All checks passed.")
