"""
CPU offload: what CPUOffloadPolicy moves, and what it costs
===========================================================

.. admonition:: Verdict
   :class: tip

   ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` keeps every rank's parameter shards,
   gradient shards and optimizer state in host memory and steps the optimizer on the CPU. In
   exchange each step copies the parameter shards in before every all-gather (twice for a block
   that reshards after forward) and the gradient shards out after every reduce-scatter: counted
   here, :claim:`offload.to_device.bytes <unit>` in and :claim:`offload.to_host.bytes <unit>` out
   per rank per step, as the shapes predict. For Llama-3-8B on
   :claim:`offload.llama.world_size` GPUs (bf16 compute, AdamW) that is
   :claim:`offload.llama.gpu_saved <unit>` less on each GPU, the same amount of host RAM per
   rank, and :claim:`offload.llama.to_device <unit>` in and :claim:`offload.llama.to_host <unit>`
   out per GPU per step: GPU-only, predicted. Offload when the model state does not fit and the
   host link has time to spare.
   The copies, placement and losses are measured on CPU gloo processes, where host and device are
   one memory; the GPU effects are predicted from shapes.

FSDP2 shards the model state over N GPUs; on a few GPUs a large model still does not fit. The
``offload_policy`` of ``fully_shard`` moves the shards themselves to the CPU: the GPU then holds
only what it computes with (the gathered units, the unsharded gradients of the unit in backward,
the activations). This page runs it on CPU ranks and checks:

1. the training is the same: losses and parameters match one process, and FSDP2 without offload;
2. what lives where: parameter shards, gradient shards and AdamW's state are host tensors, and the
   optimizer step runs on them;
3. what moves, counted: every copy FSDP2 asks for between host and device, per step, equals the
   bytes predicted from the parameter shapes (:func:`guide.memory.offload.offload_traffic`);
4. the cost for a named model, from the site's memory model: GPU bytes saved, host RAM needed and
   host-device bytes per step (GPU-only, predicted).
"""

# %%
# The code to copy
# ----------------
# One policy object for every ``fully_shard`` call (units with and without offload cannot be
# mixed). ``pin_memory=True`` (the default) page-locks the host shards so the copies can overlap
# the compute; it needs a GPU, so a CPU-only process passes ``False``. Nothing else changes: the
# optimizer is built on ``model.parameters()`` as usual, and its state follows the (host) shards.
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard


def shard_offloaded(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """One FSDP2 unit per block, then the root, all with their shards on the host."""
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, offload_policy=policy)  # fault-point: offload-blocks
    return fully_shard(model, mesh=mesh, offload_policy=policy)  # fault-point: offload-root


def train_step(model, opt, tokens, loss_fn) -> float:
    """One step: forward and backward on the device, ``opt.step()`` on the host shards."""
    loss = loss_fn(model, tokens)
    loss.backward()  # each gradient shard is copied to the host after its reduce-scatter
    opt.step()  # AdamW on CPU tensors: the parameter shards, gradient shards and moments
    opt.zero_grad(set_to_none=True)
    return loss.item()


# %%
# The runs
# --------
# The same model and data on N ranks, sharded with and without offload, three AdamW steps each.
# Step 1 runs inside :class:`guide.host_copies.HostDeviceCopies`, which counts the copies FSDP2
# asks for between host and device (on a CPU rank each copy returns its input: the calls and
# bytes are what a GPU rank would move). Before the step, each rank records where its shards,
# gradients and optimizer state are.
import matplotlib.pyplot as plt
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checks, sharding
from guide.data import rank_slice, synthetic_batches
from guide.host_copies import HostDeviceCopies
from guide.layout import full_state, local_tensor
from guide.memory import PRESETS, GiB
from guide.memory.fit import per_gpu
from guide.memory.offload import offload_memory, offload_traffic
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.reference import reference_run
from guide.training import make_optimizer, mean_over_ranks, next_token_loss

PAGE = guide.Page(section="Memory", order=5, key_api="CPUOffloadPolicy(",
                  world_size=2, supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
STEPS, BATCH = 3, 8
CFG = ModelConfig(d_model=256, n_heads=4, d_mlp=1024, n_layers=4)
BATCHES = synthetic_batches(steps=STEPS, batch_size=BATCH, seq_len=16, vocab=CFG.vocab, seed=0)
SETUP = dict(model="tinylm-wide", optimizer="adamw", world_size=WORLD_SIZE, steps=STEPS,
             batch=BATCH)


def devices(tensors) -> list[str]:
    """The device type of each tensor's local part (a DTensor's shard)."""
    return sorted({local_tensor(t).device.type for t in tensors})


def run(rank: guide.Rank, offload: bool) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    if offload:
        shard_offloaded(model, mesh)
    else:
        sharding.apply_fsdp2(model, mesh)
    opt = make_optimizer("adamw", model.parameters())
    out: dict = {"losses": []}
    for i in range(STEPS):
        tokens = rank_slice(BATCHES[i], rank.rank, rank.world_size)
        if i != 1:
            out["losses"].append(train_step(model, opt, tokens, next_token_loss))
            continue
        with HostDeviceCopies() as copies:
            loss = next_token_loss(model, tokens)
            loss.backward()
            out["grads"] = devices(p.grad for p in model.parameters())
            opt.step()
            opt.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
    out["shards"] = devices(model.parameters())
    out["state"] = devices(v for s in opt.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor))
    out["elements"] = sum(local_tensor(p).numel() for p in model.parameters())
    return out | {"params": full_state(model), "to_device": (copies.count("to_device"),
                                                            copies.bytes("to_device")),
                  "to_host": (copies.count("to_host"), copies.bytes("to_host"))}


def pinning_error(rank: guide.Rank) -> str:
    """What ``CPUOffloadPolicy(pin_memory=True)`` does on a rank without a GPU."""
    model = build_model(CFG, device=rank.device)
    try:
        sharding.apply_fsdp2(model, init_device_mesh(rank.device.type, (rank.world_size,)),
                             offload_policy=CPUOffloadPolicy(pin_memory=True))
    except RuntimeError as err:
        return str(err)
    return ""


def worker(rank: guide.Rank) -> dict:
    out = {offload: run(rank, offload) for offload in (False, True)}
    if rank.device.type == "cpu":
        out["pinning"] = pinning_error(rank)
    return out


per_rank = guide.launch(worker, WORLD_SIZE)
REF_LOSSES, REF_PARAMS = reference_run(CFG, "adamw", BATCHES)

# %%
# 1. The same training
# --------------------
# With offload the losses and final parameters must equal one process taking the whole batch
# (AdamW's tolerance, :data:`guide.checks.PARAM_TOL`) and FSDP2 without offload.
rows = []
plain, off = ([r[flag] for r in per_rank] for flag in (False, True))
for name, res in (("FSDP2", plain), ("FSDP2 + CPUOffloadPolicy", off)):
    run_name = f"{name} x{WORLD_SIZE}"
    losses = mean_over_ranks([r["losses"] for r in res])
    dl = checks.assert_losses_match(run_name, REF_LOSSES, losses, against=checks.SINGLE_PROCESS)
    dp = checks.assert_params_match(run_name, REF_PARAMS, res[0]["params"],
                                    checks.PARAM_TOL["adamw"], against=checks.SINGLE_PROCESS)
    key = "offload" if res is off else "plain"
    rows.append([name, PAGE.check(f"offload.{key}.loss_gap", dl, fmt=".1e", **SETUP),
                 PAGE.check(f"offload.{key}.param_gap", dp, fmt=".1e", **SETUP)])
between = checks.assert_params_match(
    f"FSDP2 + CPUOffloadPolicy x{WORLD_SIZE}", plain[0]["params"], off[0]["params"],
    checks.PARAM_TOL["adamw"], against="FSDP2 without offload (same ranks)")
rows.append(["offload vs without", "",
             PAGE.check("offload.vs_plain.param_gap", between, fmt=".1e", **SETUP)])
PAGE.show("offload.training", rows, ["run", "max |Δloss|", "max |Δparam|"],
          formats={"max |Δloss|": ".1e", "max |Δparam|": ".1e"}, **SETUP)

# %%
# 2. What lives where
# -------------------
# With the policy, every parameter shard, every gradient shard (read after backward, before the
# step) and every tensor of AdamW's state is a host tensor, and the optimizer step ran on them.
# On these CPU ranks the device is the host too, so placement alone cannot tell the two runs
# apart: section 3 shows what differs. On a rank without a GPU, pinning fails with torch's error.
for r, res in enumerate(off):
    checks.expect("offload placement", f"rank {r}",
                  res["shards"] == res["grads"] == res["state"] == ["cpu"],
                  f"shards on {res['shards']}, gradients on {res['grads']}, optimizer state on "
                  f"{res['state']}: CPUOffloadPolicy keeps all three on the host.")
pinning = [r.get("pinning", "") for r in per_rank]
if per_rank[0].get("pinning") is not None:
    checks.expect("offload placement", "pin_memory=True without a GPU", all(pinning),
                  "CPUOffloadPolicy(pin_memory=True) did not fail on a CPU-only rank.")
    print(f"CPUOffloadPolicy(pin_memory=True) on a CPU-only rank: RuntimeError: {pinning[0]}")
PAGE.show(None, [["parameter shards", *off[0]["shards"]], ["gradient shards", *off[0]["grads"]],
                 ["AdamW state", *off[0]["state"]]], ["tensor (with offload)", "device"])

# %%
# 3. What moves, counted
# ----------------------
# Per rank over one step (one micro-batch): every parameter shard is copied in before each of its
# unit's all-gathers (the root's once, each block's twice: for its forward and, resharded after
# it, again for its backward), and every gradient shard out after its reduce-scatter. Predicted
# from the shapes by :func:`guide.memory.offload.offload_traffic` (padded shards in, this rank's
# real rows out, fp32 here), checked per rank to the byte; without offload FSDP2 asks for none.
MiB = 2**20
units = [[tuple(p.shape) for p in unit] for unit in sharding.fsdp2_units(build_model(CFG))]
rows, keys = [], []
for r, (res_off, res_plain) in enumerate(zip(off, plain)):
    want = offload_traffic(units, WORLD_SIZE, "fp32", rank=r)  # fault-point: predicted-copies
    for direction, count, nbytes in (("to_device", want.to_device_copies, want.to_device),
                                     ("to_host", want.to_host_copies, want.to_host)):
        got_n, got_b = res_off[direction]
        checks.expect_close("offload copies", f"rank {r} {direction}", got_n, count, 0,
                            what="copies per step", unit="copies",
                            against="offload_traffic from the shapes")
        checked = checks.expect_close("offload copies", f"rank {r} {direction}", got_b, nbytes, 0,
                                      what="bytes per step", unit="B",
                                      against="offload_traffic from the shapes")
        checks.expect("offload copies", f"rank {r} without offload",
                      res_plain[direction] == (0, 0),
                      f"FSDP2 without offload asked for {res_plain[direction]} {direction} copies.")
        if r == 0:
            PAGE.check(f"offload.{direction}.bytes", checked.scaled(1 / MiB, "MiB"),
                       fmt=".2f", **SETUP)
            PAGE.state(f"offload.{direction}.copies", got_n, "copies", **SETUP)
        rows.append([f"rank {r}", direction.replace("_", " "), got_n, got_b / MiB,
                     nbytes / MiB])
        keys.append(f"rank_{r}_{direction}")
PAGE.show("offload.copies", rows, ["rank", "direction", "copies", "MiB (counted)",
                                  "MiB (predicted)"],
          formats={"MiB (counted)": ".2f", "MiB (predicted)": ".2f"}, keys=keys, **SETUP)
PAGE.conclude(
    f"Per rank per step (N={WORLD_SIZE}): {off[0]['to_device'][0]} parameter-shard copies in, "
    f"{off[0]['to_host'][0]} gradient-shard copies out, each as predicted from the shapes; "
    "without offload, none.")

# %%
# 4. The cost for Llama-3-8B, predicted
# -------------------------------------
# GPU-only, predicted: from :mod:`guide.memory` (shapes of the published config, bf16 compute with
# fp32 master parameters and gradients, AdamW). Without offload a GPU holds FSDP2's shards and its
# transient buffers (:func:`guide.memory.fit.per_gpu`, activations left out); with it the shards
# go to the host, which needs the same bytes per rank (eight times that per node of eight GPUs).
# The traffic is one step of one micro-batch: with ``K`` micro-batches and the sync every time it
# is ``K`` times that in, and ``K`` times out. The CPU optimizer step is priced in the host memory
# it streams; its time is that over the host's memory bandwidth, shared by the node's ranks.
N_LLAMA, PRECISION = 8, "bf16_mixed"
arch = PRESETS["llama-3-8b"]
LLAMA = dict(model="llama-3-8b", world_size=N_LLAMA, precision=PRECISION, optimizer="adamw",
             estimate="GPU-only, predicted from shapes")
GB = 10**9
gpu = per_gpu(arch, "fsdp2", N_LLAMA, PRECISION, "adamw", activations=0, ddp_buckets=False)
moved = offload_memory(arch, N_LLAMA, PRECISION, "adamw")
traffic = offload_traffic(arch.fsdp2_units(), N_LLAMA, PRECISION)
# AdamW on the host reads each shard element's parameter, gradient and two moments and writes the
# parameter and both moments back: seven fp32 values per element of the rank's shard.
adamw_host_bytes = 7 * 4 * (moved.params // 4)
PAGE.state("offload.llama.world_size", N_LLAMA, "GPUs", **LLAMA)
rows = [["GPU, model state + buffers, no offload", PAGE.state(
            "offload.llama.gpu_without", round(gpu.total / GiB, 2), "GiB", **LLAMA)],
        ["GPU saved by offload", PAGE.state(
            "offload.llama.gpu_saved", round(moved.gpu_saved / GiB, 2), "GiB", **LLAMA)],
        ["GPU, buffers left with offload", PAGE.state(
            "offload.llama.gpu_with", round((gpu.total - moved.gpu_saved) / GiB, 2), "GiB",
            **LLAMA)],
        ["host RAM per rank", PAGE.state(
            "offload.llama.host", round(moved.host / GiB, 2), "GiB", **LLAMA)],
        ["host RAM per node of eight GPUs", PAGE.state(
            "offload.llama.host_node", round(8 * moved.host / GiB, 1), "GiB", **LLAMA)],
        ["host to device per step", PAGE.state(
            "offload.llama.to_device", round(traffic.to_device / GB, 2), "GB", **LLAMA)],
        ["device to host per step", PAGE.state(
            "offload.llama.to_host", round(traffic.to_host / GB, 2), "GB", **LLAMA)],
        ["host memory the CPU AdamW step reads and writes", PAGE.state(
            "offload.llama.adamw_host_bytes", round(adamw_host_bytes / GB, 2), "GB", **LLAMA)]]
UNITS = ["GiB"] * 5 + ["GB"] * 3
PAGE.show("offload.llama.table",
          [[name, value, unit] for (name, value), unit in zip(rows, UNITS)],
          ["per GPU (GPU-only, predicted)", "value", "unit"], formats={"value": ".2f"}, **LLAMA)
PAGE.conclude(
    f"Llama-3-8B on {N_LLAMA} GPUs (GPU-only, predicted): offload frees "
    f"{rows[1][1]:.2f} GiB per GPU and needs as much host RAM per rank; each step "
    f"copies {rows[5][1]:.2f} GB in and {rows[6][1]:.2f} GB out per GPU.")

# %%
# Where the bytes go, per GPU, for Llama-3-8B on 8 GPUs (GPU-only, predicted; activations not
# included).
style()
fig, ax = plt.subplots(figsize=(7.5, 3.6))
parts = [("parameter shards", moved.params), ("gradient shards", moved.grads),
         ("AdamW state", moved.optimizer), ("FSDP2 buffers", gpu.buffers)]
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f"]
for i, label in enumerate(["GPU, no offload", "GPU, offload", "host, offload"]):
    left = 0.0
    for (part, nbytes), color in zip(parts, colors):
        on = (part == "FSDP2 buffers") != (i == 2) if i else True
        if not on:
            continue
        ax.barh(i, nbytes / GiB, left=left, color=color, label=part if i == 0 else None)
        left += nbytes / GiB
    ax.text(left, i, f" {left:.1f}", va="center", fontsize=9)
ax.set_yticks(range(3), ["GPU, no offload", "GPU, offload", "host, offload"])
ax.invert_yaxis()
ax.margins(x=0.15)
ax.set_xlabel("GiB per rank (predicted)")
ax.set_title("CPUOffloadPolicy moves the shards to the host (Llama-3-8B, N=8)")
ax.legend(loc="lower right", fontsize=8)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held.
print("All checks passed.")
