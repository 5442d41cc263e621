"""
``reshard_after_forward``: ZeRO-3, ZeRO-2 and in between
========================================================

After a ``fully_shard`` unit's forward, FSDP2 can free the parameters it all-gathered (and gather them
again for backward) or keep them until backward. ``fully_shard(module, reshard_after_forward=...)``
picks:

* ``True``: free after forward, all-gather again in backward (ZeRO-3, FSDP1's ``FULL_SHARD``);
* ``False``: keep the unsharded parameters until backward, no backward all-gather (ZeRO-2,
  ``SHARD_GRAD_OP``);
* an integer ``k``: after forward, keep them sharded over ``k`` ranks instead of all ``N``, so
  backward all-gathers over a group of ``k`` (for example the GPUs of one node);
* ``None`` (the default): ``True`` for every unit except the root, which gets ``False``, since the
  root's parameters are needed again as soon as backward starts.

This page trains one model four ways on 4 gloo ranks, counts the all-gathers of a step by phase,
measures each rank's memory and step time, and **fails the docs build** unless the counts are what the
semantics require and the four runs compute the same losses.
"""

# %%
# Setup
# -----
# A wider version of the site's model (d_model 256, 4 blocks), so that the parameters a block keeps
# unsharded are megabytes, visible above the noise of a process's resident memory. An integer
# ``reshard_after_forward`` must divide the number of ranks (``fully_shard``'s docstring asks for a
# divisor other than 1 and N), so this page runs 4 ranks to show ``2``.
import statistics
import time

import matplotlib.pyplot as plt
import torch
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checks, comm, dtensor, knob_plots
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.sharding import apply_fsdp2
from guide.peak_memory import MMAP_THRESHOLD, prepare
from guide.steps import measured_step, next_token_loss
from guide.training import make_optimizer, mean_over_ranks, train_steps

WORLD_SIZE = guide.world_size(4)
CFG = ModelConfig(d_model=256, n_heads=4, d_mlp=1024, n_layers=4)
TIMED = 2
BATCHES = synthetic_batches(steps=3 + TIMED, batch_size=32, seq_len=16, vocab=CFG.vocab, seed=0)
SETTINGS = {"True": True, "False": False, "2": 2, "None (default)": None}
model = build_model(CFG)
n_params = sum(p.numel() for p in model.parameters())
print(f"{n_params:,} parameters ({n_params * 4 / 2**20:.1f} MiB fp32), {WORLD_SIZE} ranks")

# %%
# The worker
# ----------
# The only line that changes between runs is the ``fully_shard`` call. Step 0 is a warm-up that also
# records what the parameters *are* between forward and backward. Step 1 is measured for memory
# (:func:`guide.steps.measured_step`: what the forward leaves behind, and the step's peak), step 2
# for collectives (:class:`guide.comm.CollectiveLog`, which labels each call forward or backward),
# and the rest for time.


def worker(rank: guide.Rank, reshard_after_forward) -> dict:
    prepare()  # make freed memory leave the process, so resident memory tracks tensors
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    kwargs = {} if reshard_after_forward is None else {
        "reshard_after_forward": reshard_after_forward}
    apply_fsdp2(model, mesh, **kwargs)
    opt = make_optimizer("sgd", model.parameters())
    tokens = [rank_slice(b, rank.rank, rank.world_size).to(rank.device) for b in BATCHES]

    loss = next_token_loss(model, tokens[0])  # warm-up step, looking between forward and backward
    between = dtensor.param_layouts(model, rank.rank)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses = [loss.item()]
    memory = measured_step(model, opt, tokens[1])
    losses.append(memory.loss)
    with CollectiveLog(model) as log:
        losses += train_steps(model, opt, BATCHES[2:3], rank.rank, rank.world_size, rank.device)
    times = []
    for batch in BATCHES[3:]:
        start = time.perf_counter()
        losses += train_steps(model, opt, batch[None], rank.rank, rank.world_size, rank.device)
        times.append(time.perf_counter() - start)
    return {"losses": losses, "between": between, "memory": memory, "collectives": log.records,
            "step_s": statistics.median(times)}


results = {name: guide.launch(worker, WORLD_SIZE, raf) for name, raf in SETTINGS.items()}

# %%
# What the parameters are between forward and backward
# ----------------------------------------------------
# ``True`` leaves ``Shard(0)`` DTensors; ``False`` leaves plain full-size tensors; ``2`` leaves
# DTensors on a 2-D mesh, ``(Replicate(), Shard(0))``, holding half of each parameter; the default
# treats the root (embeddings, final norm, head) like ``False`` and the blocks like ``True``.
shown = ("blocks.0.fc1.weight", "head.weight")
print(f"{'reshard_after_forward':<22}" + "".join(f"{p:>40}" for p in shown))
for name, res in results.items():
    lay = {lay.name: lay for lay in res[0]["between"]}
    print(f"{name:<22}" + "".join(
        f"{(lay[p].placements if lay[p].is_dtensor else 'plain tensor') + ' ' + str(lay[p].local_shape):>40}"
        for p in shown))
root_default = {lay.name: lay for lay in results["None (default)"][0]["between"]}
if root_default["head.weight"].is_dtensor or not root_default["blocks.0.fc1.weight"].is_dtensor:
    raise checks.CheckFailed("[default] None: expected the root's parameters unsharded (False) and "
                             "the blocks' resharded (True) between forward and backward.")
print("\nThe default (None) keeps the root's parameters unsharded after forward "
      "(reshard_after_forward=False for the root) and reshards every block (True).")

# %%
# All-gathers per step, checked against the semantics
# ---------------------------------------------------
# Every unit all-gathers once in forward. In backward a unit that resharded all-gathers again (over
# all N ranks for ``True``, over a group of 2 for ``2``); one that kept its parameters does not.
# For ``True``, ``False`` and the default, the expected list of calls, with their sizes, comes from
# :func:`guide.comm.fsdp2_step` over the units :func:`guide.comm.fsdp2_groups` says the setting
# makes; the measured calls must equal it.
n_units = len(model.blocks) + 1  # each block, and the root
counts, bwd_sizes = {}, {}
for name, res in results.items():
    recs = [c for c in res[0]["collectives"] if c.kind == "all_gather"]
    counts[name] = {ph: sum(c.phase == ph for c in recs) for ph in ("forward", "backward")}
    bwd_sizes[name] = sorted({c.group_size for c in recs if c.phase == "backward"})
    run = f"FSDP2 x{WORLD_SIZE}, reshard_after_forward={name}"
    if type(SETTINGS[name]) is not int:  # True, False or None (an integer is handled below)
        groups = comm.fsdp2_groups(model, SETTINGS[name])
        want = sorted((c.phase, c.numel) for c in comm.fsdp2_step(groups, WORLD_SIZE)
                      if c.kind == "all_gather")
        got = sorted((c.phase, c.numel) for c in recs)
        if got != want:
            raise checks.CheckFailed(f"[all-gathers] {run}: measured (phase, elements) {got}, "
                                     f"the semantics require {want}.")
    else:  # an integer: forward over all ranks, backward over groups of that size
        k = SETTINGS[name]
        fwd = sorted({c.group_size for c in recs if c.phase == "forward"})
        if counts[name] != {"forward": n_units, "backward": n_units} or \
                fwd != [WORLD_SIZE] or bwd_sizes[name] != [k]:
            raise checks.CheckFailed(f"[all-gathers] {run}: {counts[name]}, group sizes forward "
                                     f"{fwd} backward {bwd_sizes[name]}; expected one per unit in "
                                     f"each phase, backward over groups of {k}.")
for name, c in counts.items():
    sizes = bwd_sizes[name]
    print(f"reshard_after_forward={name:<15} all-gathers per step: {c['forward']} forward + "
          f"{c['backward']} backward" + (f" (over groups of {sizes})" if sizes else ""))

# %%
# Same arithmetic, whatever the setting
# -------------------------------------
# Resharding moves parameters, not numbers: all four runs must produce the same losses.
losses = {name: mean_over_ranks([r["losses"] for r in res]) for name, res in results.items()}
for name in SETTINGS:
    gap = checks.assert_losses_match(f"FSDP2 x{WORLD_SIZE}, reshard_after_forward={name}",
                                     losses["True"], losses[name])
    print(f"reshard_after_forward={name:<15} max |loss − loss(True)| = {gap:.1e}"
          + ("  (bitwise equal)" if gap == 0 else ""))

# %%
# Memory and time
# ---------------
# Between forward and backward a unit that did not reshard keeps its all-gathered parameters: all of
# them for ``False``, half of them for ``2`` (each rank holds one of 2 shards). The forward's
# leftover (activations plus those parameters) must exceed ``True``'s by exactly that many bytes,
# computed from the padded shapes (:func:`guide.comm.fsdp2_padded_numel`), within 10 % plus the
# tensors below glibc's mmap threshold (which can reuse resident heap pages unseen) plus ``NOISE``,
# the run-to-run spread of resident memory read between two runs; the table prints each setting's
# allowance. The default keeps only the root's parameters, less than its allowance: this resolution
# cannot tell them from nothing, which is why the default's layout is asserted from the parameters
# themselves, above. The step's
# peak moves less than that: with ``True`` the backward re-gathers a unit (and prefetches the next)
# at the same time as it holds that unit's full gradient. Step time is measured too, but on two shared
# CPU cores running four ranks it is dominated by scheduling, so it is shown, not asserted.
MiB = 2**20
NOISE = MiB // 4  # resolution of "resident after forward" between two separate runs
padded = [comm.fsdp2_padded_numel(p.shape, WORLD_SIZE) * 4 for p in model.parameters()]  # bytes
root = comm.fsdp2_groups(model)[0]  # the root unit comes first
kept = {"True": [], "False": padded, "2": [b // 2 for b in padded],
        "None (default)": [comm.fsdp2_padded_numel(s, WORLD_SIZE) * 4 for s in root.shapes]}
held = {name: statistics.mean(r["memory"].held_after_forward_bytes for r in res)
        for name, res in results.items()}
extra_mib, peak_mib, step_ms = {}, {}, {}
print(f"{'setting':<16}{'kept after fwd':>16}{'expected':>10}{'allowed ±':>11}{'step peak':>11}"
      f"{'step time':>11}")
for name, res in results.items():
    extra, want = held[name] - held["True"], sum(kept[name])
    # Tensors under glibc's mmap threshold may reuse heap pages that were already resident:
    # they can go unseen (never double-counted), so they widen the tolerance.
    small = sum(b for b in kept[name] if b < MMAP_THRESHOLD)
    allowed = 0.1 * want + small + NOISE
    extra_mib[name] = extra / MiB
    peak_mib[name] = max(r["memory"].peak_bytes for r in res) / MiB
    step_ms[name] = statistics.median(r["step_s"] for r in res) * 1e3
    if not abs(extra - want) <= allowed:
        raise checks.CheckFailed(
            f"[memory] FSDP2 x{WORLD_SIZE}, reshard_after_forward={name}: the forward left "
            f"{extra / MiB:.2f} MiB more than True's, expected {want / MiB:.2f} MiB (the parameters "
            f"it keeps unsharded) within 10 % + {small / MiB:.2f} MiB of small tensors + "
            f"{NOISE / MiB:.2f} MiB of measurement spread.")
    print(f"{name:<16}{extra / MiB:>12.2f} MiB{want / MiB:>6.2f} MiB{allowed / MiB:>7.2f} MiB"
          f"{peak_mib[name]:>7.1f} MiB{step_ms[name]:>8.0f} ms")

# %%
# The trade-off in one figure
# ---------------------------
fig = knob_plots.reshard_tradeoff(counts, extra_mib, peak_mib, step_ms, WORLD_SIZE)
plt.show()

# %%
# Offloading to the CPU (``CPUOffloadPolicy``)
# --------------------------------------------
# ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` keeps the sharded parameters, gradients and
# optimizer state in host memory and copies them to the GPU for compute. Its default
# ``pin_memory=True`` needs an accelerator: on a machine without one ``fully_shard`` raises
# ``RuntimeError: Cannot access accelerator device when none is available.`` (checked below, on
# this machine). With ``pin_memory=False`` it runs on CPU, but the parameters already live on the
# CPU, so it moves nothing anywhere: there is nothing to show on this page's gloo ranks. Under
# ``torchrun`` on CUDA GPUs the script below measures what it saves; it was **not** executed in this
# build (no GPU here).
from torch.distributed.fsdp import CPUOffloadPolicy  # noqa: E402


def offload_worker(rank: guide.Rank, offload: bool) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    kwargs = {"offload_policy": CPUOffloadPolicy()} if offload else {}  # pin_memory=True
    try:
        apply_fsdp2(model, mesh, **kwargs)
        opt = make_optimizer("adamw", model.parameters())
        train_steps(model, opt, BATCHES[:2], rank.rank, rank.world_size, rank.device)
    except RuntimeError as exc:
        return {"error": str(exc).strip().splitlines()[0]}
    gpu = torch.cuda.memory_allocated(rank.device) if rank.device.type == "cuda" else 0
    return {"state_device": str(next(model.parameters()).to_local().device),
            "gpu_bytes_between_steps": gpu}


if guide.under_torchrun() and torch.cuda.is_available():  # a GPU run: measure the saving
    for offload in (False, True):
        res = guide.launch(offload_worker, WORLD_SIZE, offload)[0]
        print(f"CPUOffloadPolicy {'on ' if offload else 'off'}: sharded state on "
              f"{res['state_device']}, {res['gpu_bytes_between_steps'] / MiB:.1f} MiB of GPU memory "
              "allocated between steps (rank 0)")
else:
    offload = guide.launch(offload_worker, WORLD_SIZE, True)[0]
    if "accelerator" not in offload.get("error", ""):
        raise checks.CheckFailed(f"[CPU offload] without an accelerator, CPUOffloadPolicy() was "
                                 f"expected to fail; got {offload}.")
    print(f"CPUOffloadPolicy() on this CPU-only machine: RuntimeError: {offload['error']}")
