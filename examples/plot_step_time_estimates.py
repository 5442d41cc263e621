"""
Step time at scale, predicted
=============================

.. admonition:: Verdict
   :class: tip

   For Llama-3-70B on 8-GPU H100 nodes, use FSDP2 (or HSDP with a shard group of four nodes or
   more) with full activation checkpointing; these never fit:
   :claim:`step_time.llama-3-70b.never_fits`. At a 4M-token batch, switch from FSDP2 to HSDP
   (shard 32, the smallest group that holds the model with FSDP2's buffers) from
   :claim:`step_time.hsdp_shard32.beats_fsdp2_from <nodes>` on: at the largest scale scanned its
   predicted communication is :claim:`step_time.hsdp_shard32.comm_share.128_nodes` of compute,
   FSDP2's :claim:`step_time.fsdp2.comm_share.128_nodes`.

Nothing on this page is measured: every GPU number is **predicted** from cited link rates and
labelled so.

The :ref:`communication page <sphx_glr_auto_examples_plot_communication.py>` counts, on CPU ranks,
every byte DDP and FSDP2 send. What those bytes cost on a GPU cluster cannot be measured on this
machine, so this page **estimates** it, for Llama-3-70B on nodes of 8 H100 GPUs, with
:mod:`guide.comm.cost`: a hierarchical model of NCCL's collectives (NVLink inside a node, one ring
per NIC between nodes), checked against published nccl-tests bus bandwidths. Every time below is an
estimate from link rates, and every configuration says first whether it fits in a GPU's memory
(:mod:`guide.memory`'s model): a configuration that does not fit gets no time.

Nothing here runs on several ranks: it is arithmetic on parameter shapes.
"""

# %%
# The configurations priced, in plain PyTorch
# -------------------------------------------
# What the page prices for a GPU run: ``fully_shard`` on each block and the root, bf16 compute with
# fp32 gradient reduction, over one flat mesh (FSDP2) or a 2-D mesh that shards inside a group of
# ``shard`` GPUs and replicates across groups (HSDP). ``reshard_after_forward=False`` is the
# "no reshard" row. The pricing below reads its dtypes from this ``MP`` policy.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

MP = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_for_gpus(model: torch.nn.Module, gpus: int, shard: int | None = None,
                   reshard_after_forward: bool = True) -> torch.nn.Module:
    """FSDP2 over ``gpus`` GPUs, or HSDP with shard groups of ``shard`` GPUs."""
    mesh = (init_device_mesh("cuda", (gpus,)) if shard is None else
            init_device_mesh("cuda", (gpus // shard, shard), mesh_dim_names=("dp", "shard")))
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=MP, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh, mp_policy=MP)


# %%
# The hardware, as cited constants
# --------------------------------
# The model's inputs are link rates and NCCL's own latency constants, each from a published source
# (the table below prints them; each one's source is in the "Every number" ledger, and in
# :data:`guide.constants.CONSTANTS`). The throughput of one GPU is an assumption, a
# fraction of the H100's dense bf16 peak ("MFU"): the high end of the range torchtitan reports for
# Llama-3.1-8B on H100 without Float8 (also in the table). The high end is the cautious choice
# here: the faster the compute, the less of it there is to hide communication behind. torchtitan's
# MFU counts model FLOPs its own way (``get_num_flop_per_token``): ``6Ψ`` per token with Ψ the
# parameters without the input embedding, plus ``12 · layers · hidden · seq_len`` for attention,
# recomputation not counted. This page prices compute with that same count
# (:func:`guide.comm.model_flops_per_token`), so the MFU applies to the FLOPs it was measured on.
import math

import matplotlib.pyplot as plt

import guide
from guide import checks, comm
from guide.comm import H100_NODE
from guide.constants import CONSTANTS
from guide.memory import (GPU_MEMORY_CONSTANTS, GPU_TOTAL_MEMORY_GIB, PRECISIONS, PRESETS, GiB,
                          activation_bytes, fsdp2_buffer_bytes, unsharded_param_bytes)
from guide.memory.fit import per_gpu
from guide.plotting import style
from guide.sharding import Strategy

# It starts no job: every rank computes the same estimates, at any world size.
PAGE = guide.Page(section="Communication and time", order=2, key_api="reshard_after_forward=",
                  world_size=1, supports=(1, 2, 4, 8))
CITED = ["dgx_h100.gpus", "h100.nvlink_bandwidth", "dgx_h100.nics", "ndr.nic_bandwidth",
         "nccl.tuning.base_latency", "nccl.tuning.nvlink_step_latency",
         "nccl.tuning.network_step_latency", "h100.dense_bf16_flops",
         "h100.memory_total", "torchtitan.llama3-8b.mfu.low",
         "torchtitan.llama3-8b.mfu.high"]
PAGE.show("step_time.constants", [[name, PAGE.cite(name), CONSTANTS[name].unit]
            for name in CITED], ["constant", "value", "unit"],
           formats={"value": ",.15g"})
# %%
PEAK_FLOPS = CONSTANTS["h100.dense_bf16_flops"].value
MFU = CONSTANTS["torchtitan.llama3-8b.mfu.high"].value  # assumed (see above)
GPU = "H100 (80 GB)"
CAPACITY = GPU_TOTAL_MEMORY_GIB[GPU] * GiB
NODE = H100_NODE
TFLOPS = PAGE.state("step_time.h100.assumed_tflops_per_gpu",
                    round(PEAK_FLOPS * MFU / 1e12), "TFLOP/s", mfu=MFU)
print(f"\nAssumed: {MFU:.0%} of the dense bf16 peak, {TFLOPS:,} TFLOP/s per GPU.")

# %%
# The model, checked against nccl-tests
# -------------------------------------
# Inside a node a ring runs over NVLink at its full rate per GPU. Between nodes NCCL runs one ring per
# NIC: each ring crosses the node's 8 GPUs over NVLink and leaves through its own NIC, so a node's
# traffic to the next node is shared by all its NICs (:func:`guide.comm.bus_bandwidth`). Bus bandwidth
# is nccl-tests' measure (``busbw``: the time of a collective is its ring bytes per rank over it).
# The model prices links at their nominal rate, so it must never predict *less* than nccl-tests
# measured, and the build fails unless it stays within :data:`guide.comm.BUSBW_FACTOR` of each
# published figure (the same check runs in ``tests/comm/test_cost.py``). Each figure's source (an
# nccl or nccl-tests issue) is in :data:`guide.comm.PUBLISHED_BUS_BANDWIDTH` and in the ledger.
rows = []
for pub in comm.PUBLISHED_BUS_BANDWIDTH:
    model = comm.bus_bandwidth(pub.topology, pub.nodes * pub.topology.gpus_per_node,
                               algorithm=pub.algorithm)
    published = f"{pub.low / 1e9:.0f}-{pub.high / 1e9:.0f}"  # in the check's text
    top = comm.BUSBW_FACTOR * pub.high  # allowed: from the published low to FACTOR x high
    band = checks.expect_close(
        "busbw model", pub.what, model, (pub.low + top) / 2, (top - pub.low) / 2,
        "bus bandwidth", unit="bytes/s",
        against=f"published {published} GB/s, up to {comm.BUSBW_FACTOR}x ({pub.source})")
    gpu = {NODE: "h100", comm.A100_NODE: "a100"}[pub.topology]
    PAGE.check(
        f"comm.busbw_model.all_reduce.{gpu}.{pub.nodes}x{pub.topology.gpus_per_node}",
        band, "bytes/s", hardware=pub.topology.name)
    rows.append([pub.what, pub.nodes, pub.low / 1e9, pub.high / 1e9, model / 1e9,
                 model / pub.high])
PAGE.show("step_time.busbw", rows, ["setup (all_reduce, large messages)", "nodes", "published low GB/s",
                  "published high GB/s", "model GB/s", "model/published"],
           formats={"published low GB/s": ".0f", "published high GB/s": ".0f",
                    "model GB/s": ".0f", "model/published": ".2f"}, keys=[f"{r[0]}.{r[1]}" for r in rows])
# %%
G = NODE.gpus_per_node
one_nic = comm.Topology("one NIC per node", G, NODE.nvlink_bytes_per_s, 1,
                        NODE.nic_bytes_per_s)
two_nodes = next(p for p in comm.PUBLISHED_BUS_BANDWIDTH
                 if p.nodes == 2 and p.topology is NODE)
one_nic_gbs = PAGE.state(f"comm.busbw_one_nic.all_reduce.h100.2x{G}",
                         round(comm.bus_bandwidth(one_nic, 2 * G) / 1e9), "GB/s",
                         hardware=one_nic.name)
below = PAGE.state(f"comm.busbw_one_nic.all_reduce.h100.2x{G}.below_published",
                   round(two_nodes.low / 1e9 / one_nic_gbs, 1), "x", hardware=one_nic.name)
print(f"\nPricing every hop at one NIC's rate, as this site's earlier 'lower bound' "
      f"did, gives {one_nic_gbs} GB/s on 2 nodes: {below:.1f}x below what nccl-tests "
      "measures there.")

# %%
# Does it fit? Llama-3-70B, per GPU
# ---------------------------------
# Each configuration's memory per GPU, with the site's memory model
# (:func:`guide.memory.fit.per_gpu`, the calculator's): model state for bf16 compute with fp32
# master weights and AdamW (DDP's gradient buckets where DDP is underneath), what
# ``reshard_after_forward=False`` keeps unsharded, autocast's bf16 weight copies (DDP), FSDP2's
# transient buffers (the root gathered from forward to backward with its gradients, two blocks
# gathered in backward, one block's gradients and reduce-scatter input), and the activations of one
# sequence with the logits and their gradient (:func:`guide.memory.activation_bytes`): without
# recomputation, with torchtitan's selective (op) checkpointing, or with full checkpointing, which
# keeps each block's input and, while a block is recomputed in backward, that block's activations.
# HSDP holds what FSDP2 holds at its shard-group size. A configuration fits when all of it fits.
ARCH = PRESETS["llama-3-70b"]
SHAPES = ARCH.param_shapes()
UNITS = ARCH.fsdp2_units()
SEQ = 8192  # tokens per sequence; one sequence per GPU per micro-batch
PRECISION, OPTIMIZER = "bf16_mixed", "adamw"
BF16, FP32 = MP.param_dtype, MP.reduce_dtype  # the policy above


ACT_BYTES = MP.param_dtype.itemsize  # activations in the compute dtype
checks.expect("memory model", "dtypes", PRECISIONS[PRECISION].compute == ACT_BYTES
              and PRECISIONS[PRECISION].grad == FP32.itemsize,
              f"{PRECISION} is not the MP policy above.")
ACS = (("fits", "none"), ("fits with selective AC", "selective"), ("fits with full AC", "full"))


def held_bytes(strategy: Strategy, n: int, seq: int, checkpointing: str) -> int:
    """Everything one GPU holds at the step's peak (the calculator's total)."""
    act = activation_bytes(ARCH, seq, 1, checkpointing=checkpointing,
                           bytes_per_element=ACT_BYTES)
    return per_gpu(ARCH, strategy.value, n, PRECISION, OPTIMIZER, activations=act,
                   ddp_buckets=True).total


def fit(strategy: Strategy, n: int, seq: int) -> tuple[str, float, bool]:
    """(verdict, headroom in bytes, whether it recomputes) for a ``seq``-token one."""
    for label, checkpointing in ACS:
        headroom = CAPACITY - held_bytes(strategy, n, seq, checkpointing)
        if headroom >= 0:
            return label, headroom, checkpointing != "none"
    return "does not fit", headroom, True


def flops_per_token(seq: int) -> float:
    """torchtitan's model FLOPs per token (the count its MFU is measured on)."""
    return comm.model_flops_per_token(ARCH.n_params - ARCH.vocab * ARCH.hidden, ARCH.layers,
                                      ARCH.hidden, seq)


ATTENTION_SHARE = PAGE.state(
    "step_time.llama-3-70b.attention_flops_share", round(
        1 - 6 * (ARCH.n_params - ARCH.vocab * ARCH.hidden) / flops_per_token(SEQ), 3),
    "of model FLOPs", seq_len=SEQ, counts="torchtitan get_num_flop_per_token")
BUFFERS = fsdp2_buffer_bytes(ARCH, "fsdp2", PRECISION)
# The same count written out from the shapes and the MP policy: an independent check.
root, block = (sum(math.prod(s) for s in unit) for unit in UNITS[:2])
checks.expect_close("memory model", "FSDP2 buffers", BUFFERS,
                    root * 2 * BF16.itemsize + block * (3 * BF16.itemsize + FP32.itemsize), 0,
                    against="root + two blocks gathered, one block's grads, written out")
PARAMS = PAGE.state("llama-3-70b.params", ARCH.n_params, "parameters")
ACT = {ac: PAGE.state(
           f"llama-3-70b.activations_per_gpu.s{SEQ}"
           + {"none": "", "full": ".full_ac", "selective": ".selective_ac"}[ac],
           round(activation_bytes(ARCH, SEQ, 1, checkpointing=ac,
                                  bytes_per_element=ACT_BYTES) / GiB, 1), "GiB",
           seq_len=SEQ, micro_batch=1, checkpointing=ac, norm="fused")
       for ac in ("none", "selective", "full")}
BUFFERS_GIB = PAGE.state("llama-3-70b.fsdp2.transient_buffers_per_gpu",
                         round(BUFFERS / GiB, 1), "GiB", precision=PRECISION,
                         counts="root + two blocks gathered, one block's gradients")
print(f"{PARAMS / 1e9:.2f}e9 parameters; activations of one {SEQ:,}-token sequence: "
      f"{ACT['none']:,.1f} GiB without recomputation, {ACT['selective']:.1f} GiB with "
      f"selective and {ACT['full']:.1f} GiB with full activation checkpointing (logits "
      f"included); FSDP2's transient buffers: {BUFFERS_GIB:.1f} GiB, in every FSDP2 and "
      "HSDP total below.\n")

# %%
# Step time estimates, one long sequence per GPU
# ----------------------------------------------
# For ``k`` nodes (``N = 8k`` GPUs): DDP, FSDP2 with and without resharding, and HSDP, which shards
# over a group of ``s`` GPUs (a node, or two) and replicates across the ``N/s`` groups. Communication
# is one step's collectives (:mod:`guide.comm.expected`: bf16 all-gathers, fp32 reduce-scatters and
# all-reduces, as ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` issues them) priced
# one after another (:func:`guide.comm.step_seconds`). Compute is torchtitan's FLOP count per token
# (``6Ψ`` without the input embedding, plus attention's ``12 · layers · hidden · seq_len``), a third
# more with full checkpointing (the forward runs twice), at the MFU above
# (:func:`guide.comm.compute_seconds`).
# The step estimate assumes FSDP2's prefetching hides communication behind compute completely: it
# is the larger of the two, a lower bound on the real step.
NODES = (1, 2, 4, 8, 16, 64)
HSDP_SHARDS = (16, 32)
GROUPS = comm.fsdp2_unit_groups(UNITS)  # fully_shard's default: only the root kept
NO_RESHARD = comm.fsdp2_unit_groups(UNITS, reshard_after_forward=False)


def comm_seconds(config: str, n: int) -> float:
    """One step's communication, estimated, for ``config`` on ``n`` GPUs."""
    if config == Strategy.DDP.label:
        return comm.step_seconds(comm.ddp_step(SHAPES, n, FP32), NODE)
    if config == Strategy.FSDP2.label:
        return comm.step_seconds(comm.fsdp2_step(GROUPS, n, BF16, FP32), NODE)
    if config == Strategy.FSDP2_NO_RESHARD.label:
        return comm.step_seconds(comm.fsdp2_step(NO_RESHARD, n, BF16, FP32), NODE)
    shard = int(config.removeprefix("HSDP, shard "))
    return comm.step_seconds(comm.hsdp_step(GROUPS, shard, n // shard, BF16, FP32),
                             NODE, all_reduce_stride=shard)


def memory_strategy(config: str) -> tuple[Strategy, int]:
    """The strategy and world size whose model state ``config`` holds."""
    if config.startswith("HSDP"):
        return Strategy.FSDP2, int(config.removeprefix("HSDP, shard "))
    return Strategy.parse(config), 0


CONFIGS = [Strategy.DDP.label, Strategy.FSDP2.label, Strategy.FSDP2_NO_RESHARD.label,
           *(f"HSDP, shard {s}" for s in HSDP_SHARDS)]
rows, priced = [], {}
for config in CONFIGS:
    for k in NODES:
        n = G * k
        strategy, shard = memory_strategy(config)
        if shard and n <= shard:  # HSDP needs 2+ replicas of its shard group
            continue
        verdict, headroom, recompute = fit(strategy, shard or n, SEQ)
        row = {"configuration": config, "nodes": k, "GPUs": n, "memory": verdict,
               "headroom GiB": headroom / GiB, "comm s": None,
               "compute s": None, "step s": None, "comm/compute": None}
        if verdict != "does not fit":
            communication = comm_seconds(config, n)
            compute = comm.compute_seconds(ARCH.n_params, SEQ, PEAK_FLOPS, MFU,
                                           recompute, flops_per_token=flops_per_token(SEQ))
            priced[config, k] = (communication, compute)
            row |= {"comm s": communication, "compute s": compute,
                    "step s": max(communication, compute),
                    "comm/compute": communication / compute}
        rows.append(row)
PAGE.show("step_time.llama-3-70b.table", rows,
          formats={"headroom GiB": ".1f", "comm s": ".2f", "compute s": ".2f", "step s": ".2f",
                   "comm/compute": ".0%"},
          title="Llama-3-70B per GPU, one 8,192-token sequence (predicted)",
          keys=[f"{r['configuration']}.{r['nodes']}" for r in rows])
# %%
# The table's own checks: nothing that does not fit is priced, and every "never" has a reason.
RUN = "70B time table"
checks.expect("feasibility", RUN,
              all(r["step s"] is None for r in rows if r["memory"] == "does not fit"),
              "a configuration that does not fit was priced.")
checks.expect("feasibility", RUN, not any(r["memory"] == "fits" for r in rows),
              f"a {SEQ:,}-token sequence fits without recomputing, against the prose.")
never = [c for c in CONFIGS if all(r["memory"] == "does not fit"
                                   for r in rows if r["configuration"] == c)]
# Each "never" has a reason that needs no search over N: what every GPU holds at any N
# (HSDP: its shard group's FSDP2 state, with the activations of full checkpointing).
kept = unsharded_param_bytes(SHAPES, 1, PRECISION)
at_any_n = {Strategy.DDP.label: held_bytes(Strategy.DDP, 1, SEQ, "full"),
            Strategy.FSDP2_NO_RESHARD.label: kept,
            **{f"HSDP, shard {s}": held_bytes(Strategy.FSDP2, s, SEQ, "full")
               for s in HSDP_SHARDS}}
checks.expect("feasibility", RUN, all(at_any_n.get(c, 0) > CAPACITY for c in never),
              f"{never} never fit, but not all hold more than {CAPACITY / GiB:.1f} GiB "
              "at any N.")
ESTIMATE = dict(model="llama-3-70b", seq_len=SEQ, micro_batch=1, precision=PRECISION,
                hardware=NODE.name, mfu=MFU, nodes=", ".join(map(str, NODES)))
never = PAGE.state("step_time.llama-3-70b.never_fits", "; ".join(never),  # a text
                   "configurations", **ESTIMATE)
fsdp2 = [priced[Strategy.FSDP2.label, k] for k in NODES
         if (Strategy.FSDP2.label, k) in priced]
hidden = all(c < t for c, t in fsdp2)
low, high, compute = (
    PAGE.state(f"step_time.llama-3-70b.fsdp2.{name}", round(v, digits),
               "s per step (predicted)", **ESTIMATE)
    for name, v, digits in (("comm_s.min", min(c for c, _ in fsdp2), 2),
                            ("comm_s.max", max(c for c, _ in fsdp2), 2),
                            ("compute_s", fsdp2[0][1], 1)))
print(f"\nNever fits: {never}. No sequence of {SEQ:,} tokens fits without "
      "recomputation. Where FSDP2 fits, its communication estimate is "
      f"{low:.2f}-{high:.2f} s per step against {compute:.1f} s of compute: "
      + ("at one long sequence per GPU, its collectives can hide behind compute."
         if hidden else
         "communication exceeds compute somewhere, overlap cannot hide it all."))

# %%
# When HSDP beats FSDP2
# ---------------------
# Real runs fix the global batch: ``BATCH_TOKENS`` tokens per optimizer step (an assumption, like
# the sequence length). On ``N`` GPUs each GPU then runs ``M = BATCH_TOKENS / (N · SEQ_SCAN)``
# micro-batches of one ``SEQ_SCAN``-token sequence per step and accumulates their gradients.
# Neither FSDP2 nor HSDP can skip the reduce-scatter between micro-batches here: skipping it
# (``set_requires_gradient_sync(False)``) keeps every gradient unsharded until the last micro-batch
# (printed below: it does not fit; with ``reduce_dtype=torch.float32`` they accumulate in fp32).
# So each micro-batch gathers every parameter twice and
# reduce-scatters every gradient, over all ``N`` GPUs for FSDP2 and over a shard group of ``s`` GPUs
# for HSDP; HSDP then all-reduces each GPU's gradient shard across the ``N/s`` replicas **once per
# step**, skipping it on the other micro-batches with ``set_requires_all_reduce(False)``
# (:func:`guide.comm.hsdp_step`). Between nodes both move the same bytes per collective; FSDP2's
# rings are longer (more ring steps, each with its latency) and it pays them on every micro-batch,
# HSDP's all-reduce is paid once. The shard group must hold the model with FSDP2's buffers: the
# scan keeps the groups of 16, 32 and 64 GPUs that do (printed below).
BATCH_TOKENS = 2**22  # 4M tokens per optimizer step
SEQ_SCAN = 4096
SCAN_NODES = [2**i for i in range(1, 8) if G * 2**i * SEQ_SCAN <= BATCH_TOKENS]
CANDIDATES = (16, 32, 64)
SCAN_SHARDS = tuple(s for s in CANDIDATES if fit(Strategy.FSDP2, s, SEQ_SCAN)[0] != "does not fit")
for s in CANDIDATES:
    verdict, headroom, _ = fit(Strategy.FSDP2, s, SEQ_SCAN)
    headroom = PAGE.state(f"step_time.hsdp_shard{s}.s{SEQ_SCAN}.headroom", headroom / GiB,
                          "GiB", fmt=".1f", seq_len=SEQ_SCAN, model="llama-3-70b",
                          precision=PRECISION)
    print(f"HSDP shard {s}, {SEQ_SCAN:,} tokens: {verdict}, headroom {headroom:.1f} GiB "
          "(FSDP2's buffers included)")
# The verdict at the top names the smallest shard group that holds the model: rewrite it if not.
smallest = PAGE.state("step_time.hsdp.smallest_shard_group", SCAN_SHARDS[0], "GPUs",
                      seq_len=SEQ_SCAN, model="llama-3-70b", precision=PRECISION)
checks.expect("verdict", "HSDP scan", smallest == 32,
              f"the smallest shard group that fits is {smallest}; the verdict says 32.")
# With gradient sync skipped, FSDP2 accumulates the unsharded gradients in ``reduce_dtype``
# (``MixedPrecisionPolicy``'s docstring; ``FSDPParam.to_accumulated_grad_if_needed``): fp32 here,
# one fp32 element per parameter (checked against twice the bf16 unsharded parameters of the
# memory model, an independent count).
grad_bytes = ARCH.n_params * FP32.itemsize
checks.expect_close("feasibility", "HSDP scan", grad_bytes / GiB,
                    2 * unsharded_param_bytes(SHAPES, 1, PRECISION) / GiB, 0.01,
                    "unsharded fp32 gradients", rel=True, unit="GiB",
                    against="twice the bf16 unsharded parameters (guide.memory)")
# If they fit, skipping the reduce-scatter between micro-batches is an option.
unsharded = PAGE.check("llama-3-70b.unsharded_fp32_grads_per_gpu", checks.expect_order(
    "feasibility", "HSDP scan", CAPACITY / GiB, grad_bytes / GiB, low_name="the GPU's memory",
    high_name="the unsharded fp32 gradients", unit="GiB", keep="high"), fmt=".1f",
    precision=PRECISION, reduce_dtype="float32")
capacity_gib = PAGE.state(f"{GPU_MEMORY_CONSTANTS[GPU].split('.')[0]}"
                          ".memory_total_gib", round(CAPACITY / GiB, 1), "GiB")
print("Unsharded gradients of the whole model, accumulated in reduce_dtype=float32 "
      f"(predicted): {unsharded:,.1f} GiB per GPU, more than the "
      f"{capacity_gib:.1f} GiB of an {GPU}: every micro-batch reduce-scatters.\n")


def scan_seconds(config: str, k: int) -> tuple[float, float]:
    """(communication, compute) per optimizer step on ``k`` nodes, estimated."""
    n = G * k
    micro = BATCH_TOKENS // (n * SEQ_SCAN)
    compute = micro * comm.compute_seconds(ARCH.n_params, SEQ_SCAN, PEAK_FLOPS, MFU, True,
                                           flops_per_token=flops_per_token(SEQ_SCAN))
    if config == Strategy.FSDP2.label:
        return micro * comm_seconds(config, n), compute
    shard = int(config.removeprefix("HSDP, shard "))
    per_micro = comm.step_seconds(comm.fsdp2_step(GROUPS, shard, BF16, FP32), NODE)
    step = comm.hsdp_step(GROUPS, shard, n // shard, BF16, FP32)
    once = comm.step_seconds([c for c in step if c.kind == "all_reduce"], NODE,
                             all_reduce_stride=shard)
    return micro * per_micro + once, compute


def share_of_compute(config: str, k: int) -> float | None:
    """Communication over compute per step; ``None`` where HSDP has one replica, or where the
    configuration does not fit (FSDP2 on too few GPUs)."""
    if config.startswith("HSDP") and G * k <= int(config.split()[-1]):
        return None
    if config == FSDP2 and fit(Strategy.FSDP2, G * k, SEQ_SCAN)[0] == "does not fit":
        return None
    communication, compute = scan_seconds(config, k)
    return communication / compute


FSDP2 = Strategy.FSDP2.label
SCAN_CONFIGS = [FSDP2, *(f"HSDP, shard {s}" for s in SCAN_SHARDS)]
share = {c: [share_of_compute(c, k) for k in SCAN_NODES] for c in SCAN_CONFIGS}
PAGE.show("step_time.hsdp_scan", [[k, G * k, BATCH_TOKENS // (G * k * SEQ_SCAN), scan_seconds(FSDP2, k)[1],
             *(share[c][i] for c in SCAN_CONFIGS)] for i, k in enumerate(SCAN_NODES)],
           ["nodes", "GPUs", "micro-batches", "compute s/step", *SCAN_CONFIGS],
           formats={"compute s/step": ".1f", **dict.fromkeys(SCAN_CONFIGS, ".1%")},
           title="Communication per optimizer step as a share of compute (predicted)")


# %%
def beats_from(config: str) -> int | None:
    """The smallest node count from which ``config``'s estimate stays below FSDP2's."""
    for i, k in enumerate(SCAN_NODES):
        if all(h is not None and (f is None or h < f)
               for h, f in zip(share[config][i:], share[FSDP2][i:])):
            return k
    return None


def claim_key(config: str) -> str:
    """``"HSDP, shard 16"`` -> ``"hsdp_shard16"``, for claim names."""
    return config.lower().replace(", ", "_").replace(" ", "")


SCAN = dict(model="llama-3-70b", batch_tokens=f"{BATCH_TOKENS:,}", seq_len=SEQ_SCAN,
            hardware=NODE.name, mfu=MFU)
wins = {c: PAGE.state(f"step_time.{claim_key(c)}.beats_fsdp2_from",
                      beats_from(c) or "never", "nodes", guard="computed", **SCAN)
        for c in SCAN_CONFIGS[1:]}
# The figure's title: at the largest scale of the scan, every HSDP estimate is below
# FSDP2's.
def share_claim(c: str, value: float | checks.Checked) -> float:
    """Record a share at the largest scale: FSDP2's computed, each HSDP's ordered below it."""
    name = f"step_time.{claim_key(c)}.comm_share.{SCAN_NODES[-1]}_nodes"
    if isinstance(value, checks.Checked):
        return PAGE.check(name, value, "of compute (predicted)", fmt=".3f", **SCAN)
    return PAGE.state(name, value, "of compute (predicted)", fmt=".3f", **SCAN)


last = {FSDP2: share_claim(FSDP2, share[FSDP2][-1])}
last |= {c: share_claim(c, checks.expect_order(
    "HSDP scan", f"{SCAN_NODES[-1]} nodes", share[c][-1], share[FSDP2][-1],
    low_name=f"{c}'s share", high_name="FSDP2's share")) for c in SCAN_CONFIGS[1:]}
bound = [k for k, r in zip(SCAN_NODES, share[FSDP2]) if r is not None and r > 1]
print("\nPredicted: "
      + "; ".join(f"{c} never beats FSDP2 in this scan" if k == "never" else
                  f"{c} beats FSDP2 from {k} nodes on" for c, k in wins.items())
      + ". " + (f"FSDP2 is communication-bound from {bound[0]} nodes." if bound else
                "Communication stays below compute throughout: with perfect overlap "
                "none of them slows the step; HSDP leaves less communication to hide, "
                "which counts where overlap is imperfect."))

# %%
# The scan, drawn: the share of compute time each configuration spends communicating.
style()
fig, ax = plt.subplots(figsize=(7.5, 4.4))
HSDP_COLORS = {16: "#ff7f0e", 32: "#2ca02c", 64: "#8c564b"}
for c in SCAN_CONFIGS:
    fsdp2 = c == FSDP2
    color = Strategy.FSDP2.color if fsdp2 else HSDP_COLORS[int(c.split()[-1])]
    ax.plot(SCAN_NODES, [math.nan if r is None else 100 * r for r in share[c]],
            "o-" if fsdp2 else "s--", color=color, lw=2 if fsdp2 else 1.3, ms=5,
            label=c)
ax.set_xscale("log", base=2)
ax.set_xticks(SCAN_NODES, [str(k) for k in SCAN_NODES])
ax.set_ylim(bottom=0)
ax.set_xlabel(f"nodes of {NODE.name}")
ax.set_ylabel("communication / compute per step (%)")
ax.set_title(f"Llama-3-70B, {BATCH_TOKENS / 2**20:.0f}M tokens per step: HSDP needs "
             "less communication at scale (predicted)", fontsize=11)
ax.legend(loc="upper left", fontsize=9)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# What the estimate leaves out
# ----------------------------
# Estimates from link rates: real collectives reach somewhat less (the table above), and
# congestion in the network, stragglers, message sizes below the bus bandwidth's plateau and
# NVLink SHARP are not modelled. Overlap is assumed perfect, and only one all-reduce per step is
# priced for HSDP (with gradient accumulation, ``set_requires_all_reduce(False)`` skips it on all
# but the last micro-batch, while every micro-batch still gathers). Compute counts FLOPs the way
# torchtitan does (attention included, causal masking not halved: attention is
# :claim:`step_time.llama-3-70b.attention_flops_share` of them at the sequence length priced
# here). Memory leaves out
# the CUDA context, NCCL's buffers and fragmentation. Large runs of this model also add tensor
# parallelism inside the node, which cuts
# both the state each GPU holds and the bytes FSDP2 gathers; this page prices data parallelism alone.

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
