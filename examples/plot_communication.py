"""
Communication, counted: 2Ψ vs 3Ψ
================================

ZeRO (Rajbhandari et al., arXiv 1910.02054, §7) prices data parallelism at **2Ψ elements per rank
per step** for Ψ parameters: DDP's gradient all-reduce is a reduce-scatter plus an all-gather, Ψ each.
Full sharding (ZeRO-3, FSDP2 with ``reshard_after_forward=True``) pays **3Ψ**: an all-gather of the
parameters in forward, another in backward, and a reduce-scatter of the gradients. That is the
famous 1.5×.

The 1.5× is a ratio of *elements*. Bytes depend on dtypes: FSDP2 with bf16 parameters and an fp32
reduce-scatter moves the same bytes as DDP's fp32 all-reduce. And what a backend puts on the wire
depends on how it implements each collective. Nobody counts this; this page does, on every build:

* it records, inside each rank, every collective DDP, ZeRO-1 and four FSDP2 variants issue per
  training step (kind, dtype, elements, bytes, phase of the step);
* it **fails the build** unless each matches the analytical model (FSDP2's padding included) within
  :data:`guide.comm.ELEMENT_TOL`, and unless the bytes each rank actually wrote (``/proc/self/io``)
  match what gloo should send within :data:`guide.comm.WIRE_TOL`;
* it computes the element ratio, the byte ratio, and the bytes gloo and nccl move;
* it turns the model into a lower-bound time per step for a 70B model on NVLink and InfiniBand.
"""

# %%
# The model, with padding on purpose
# -----------------------------------
# The site's :class:`~guide.model.TinyLM`, with a vocabulary of 127 tokens: an odd number of rows in
# the token embedding and the LM head. FSDP2 shards dim 0 with ``torch.chunk`` semantics and pads the
# last shard, and its collectives move the *padded* buffers, so the model below has to get the
# padding right to pass.
import math
from collections import Counter

import matplotlib.pyplot as plt
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.optim import ZeroRedundancyOptimizer

import guide
from guide import checks, comm
from guide.comm import CollectiveLog, FSDPGroup
from guide.data import synthetic_batches
from guide.memory import PRESETS
from guide.model import ModelConfig, build_model
from guide.model_state import param_shapes
from guide.sharding import apply_ddp, apply_fsdp2
from guide.training import make_optimizer, train_steps

WORLD_SIZE = guide.world_size(2)
if WORLD_SIZE < 2:
    raise ValueError("this page compares collectives across ranks: run it on 2 or more ranks.")
WARMUP, STEPS = 1, 3  # one step to settle one-time traffic, then STEPS counted steps
CFG = ModelConfig(vocab=127, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=WARMUP + STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)

model = build_model(CFG)
shapes = param_shapes(model)
PSI = sum(math.prod(s) for s in shapes)
padded = sum(comm.fsdp2_padded_numel(s, WORLD_SIZE) for s in shapes)
print(f"Ψ = {PSI:,} parameters; FSDP2's buffers at {WORLD_SIZE} ranks hold {padded:,} elements "
      f"({padded - PSI:,} of padding, {(padded - PSI) / PSI:.3%})")

# %%
# How the counting works
# ----------------------
# :class:`guide.comm.CollectiveLog` is a context manager a worker opens around the steps it counts.
# While it is open it wraps the collectives of ``torch.distributed`` and appends one
# :class:`~guide.comm.Collective` per call. That sees FSDP2, which calls
# ``dist.all_gather_single`` and ``dist.reduce_scatter_single`` through the module, and
# ``ZeroRedundancyOptimizer``, which broadcasts each updated parameter with ``dist.broadcast``.
# It does **not** see DDP's all-reduce: DDP's reducer calls the process group from C++. Given a DDP
# model, the log therefore registers the stock ``allreduce_hook`` as DDP's communication hook
# (the same arithmetic as DDP's built-in path: divide by N, all-reduce), which all-reduces through
# Python where the wrapper sees it. C++-only traffic is still invisible to the wrappers: DDP's
# construction-time weight broadcast and its one-time bucket rebuild in the first step (hence the
# warm-up step outside the log), and DTensor's functional collectives. Phases come from autograd
# (inside ``backward``), a forward hook on the model, and the optimizer's step hooks.
#
# Independently, the log reads ``wchar`` from ``/proc/self/io`` on entry and exit: every byte the
# rank wrote, which on these ranks is the gloo traffic it sent. That is the ground truth for "on the
# wire", and it also sees what the wrappers miss. (Under ``torchrun`` with nccl, GPU traffic writes
# no file descriptor: the workers then return no wire bytes and the page skips those checks.)
#
# The workers are ordinary training code, and each counts its steps the same way: one warm-up step
# outside the log, then ``STEPS`` steps inside it. ZeRO-1 is DDP plus ``ZeroRedundancyOptimizer``,
# which shards the AdamW state and broadcasts each parameter from the rank that updated it.


def counted_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: guide.Rank) -> tuple:
    """This rank's collectives over ``STEPS`` steps after the warm-up, and the bytes it wrote."""
    train_steps(model, opt, BATCHES[:WARMUP], rank.rank, rank.world_size, rank.device)
    with CollectiveLog(model) as log:
        train_steps(model, opt, BATCHES[WARMUP:], rank.rank, rank.world_size, rank.device)
    return log.records, log.wire_bytes if rank.backend == "gloo" else None  # nccl: see above


def ddp_worker(rank: guide.Rank, zero1: bool) -> tuple:
    model = apply_ddp(build_model(CFG, device=rank.device), rank)
    if zero1:
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2,
                                      weight_decay=0.01)
    else:
        opt = make_optimizer("adamw", model.parameters())
    comm.count_ddp_allreduce(model)  # route the bucket all-reduce through Python, before any step
    return counted_steps(model, opt, rank)


# %%
# FSDP2 runs four ways: ``reshard_after_forward`` True (ZeRO-3: free the gathered parameters after
# forward, gather them again in backward) or False (keep them until backward: ZeRO-2's traffic),
# each with fp32 parameters or with ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32)``. The flag is given to the root ``fully_shard`` too, so that every
# parameter follows it (FSDP2's own default keeps the root's parameters until backward).


def fsdp2_worker(rank: guide.Rank, reshard: bool, bf16: bool) -> tuple:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                              reduce_dtype=torch.float32)
    apply_fsdp2(model, mesh, reshard_after_forward=reshard, mp_policy=mp)
    return counted_steps(model, make_optimizer("adamw", model.parameters()), rank)


RUNS = {  # name -> (worker, its arguments)
    "DDP": (ddp_worker, (False,)),
    "ZeRO-1": (ddp_worker, (True,)),
    "FSDP2 reshard, fp32": (fsdp2_worker, (True, False)),
    "FSDP2 keep, fp32": (fsdp2_worker, (False, False)),
    "FSDP2 reshard, bf16": (fsdp2_worker, (True, True)),
    "FSDP2 keep, bf16": (fsdp2_worker, (False, True)),
}


def all_runs(rank: guide.Rank) -> dict:
    """Every run above, one after the other in the same ranks (one launch, not one per run)."""
    return {name: worker(rank, *args) for name, (worker, args) in RUNS.items()}


per_rank = guide.launch(all_runs, WORLD_SIZE)
results = {name: [r[name] for r in per_rank] for name in RUNS}

# %%
# The analytical model
# --------------------
# :func:`guide.comm.ddp_step`, :func:`~guide.comm.zero1_step` and :func:`~guide.comm.fsdp2_step`
# list one step's collectives from the parameter shapes alone. FSDP2's groups are the units
# ``fully_shard`` was applied to (:func:`~guide.comm.fsdp2_groups`): the root (embeddings, final
# norm, head), and each block.
# Element counts follow ZeRO: the full buffer of each call (an all-gather's output, a
# reduce-scatter's input, an all-reduce's tensor).


def fsdp2_model(reshard: bool, bf16: bool) -> list[comm.Collective]:
    return comm.fsdp2_step(comm.fsdp2_groups(model, reshard), WORLD_SIZE,
                           torch.bfloat16 if bf16 else torch.float32, torch.float32)


MODELS = {
    "DDP": comm.ddp_step(shapes, WORLD_SIZE),
    "ZeRO-1": comm.zero1_step(shapes, WORLD_SIZE),
    **{name: fsdp2_model(*RUNS[name][1]) for name in RUNS if name.startswith("FSDP2")},
}

# %%
# The checks that fail the build
# ------------------------------
# For every run and every (kind, dtype): rank 0's measured elements per step against the model
# (and the call count, except DDP's all-reduce, whose bucketing is DDP's choice), then every rank's
# ``wchar`` bytes per step against what gloo should send: the ring cost of each call, with gloo's
# reduce-scatter priced as the full all-reduce gloo actually runs.
table = {}
for name, ranks in results.items():
    run = f"{name} x{WORLD_SIZE}"
    records = ranks[0][0]
    gaps = comm.check_volume(run, records, MODELS[name], STEPS)
    gloo_model = sum(comm.gloo_bytes(c) for c in MODELS[name])
    wires = [w for _, w in ranks]
    if None in wires:  # nccl under torchrun: GPU traffic writes no file descriptor, nothing to read
        wire = [math.nan]
    else:
        wire = comm.check_wire(run, wires, gloo_model, STEPS)
    table[name] = {
        "calls": Counter(c.kind for c in records),
        "gap": max(g for *_, g in gaps.values()),
        "zero_elems": sum(comm.zero_volume(c) for c in records) / STEPS,
        "asked_bytes": sum(comm.zero_bytes(c) for c in records) / STEPS,
        "gloo_wire": sum(wire) / len(wire),
        "gloo_model": gloo_model,
        "nccl_model": sum(comm.ring_bytes(c) for c in MODELS[name]),
        "phases": Counter((c.kind, c.phase) for c in records),
    }

print(f"Per rank per step, {WORLD_SIZE} ranks, Ψ = {PSI:,}. 'ZeRO elements' counts an all-reduce "
      "twice (reduce-scatter + all-gather); 'bytes asked' is the same count in bytes (dtype-aware); "
      "'gloo wire' is measured (wchar, mean over ranks); the models are the ring cost per rank.\n")
print(f"{'run':<20}{'AG':>4}{'RS':>4}{'AR':>4}{'BC':>4}{'ZeRO elems':>12}{'model gap':>10}"
      f"{'bytes asked':>13}{'gloo wire':>11}{'gloo model':>11}{'nccl model':>11}")
for name, row in table.items():
    c = row["calls"]
    print(f"{name:<20}" + "".join(f"{c[k] / STEPS:>4g}" for k in
                                  ("all_gather", "reduce_scatter", "all_reduce", "broadcast"))
          + f"{row['zero_elems'] / PSI:>11.3f}Ψ{row['gap']:>10.2%}{row['asked_bytes']:>13,.0f}"
          f"{row['gloo_wire']:>11,.0f}{row['gloo_model']:>11,.0f}{row['nccl_model']:>11,.0f}")
print("\nAll checks passed: every run issued the collectives the model predicts, and every rank "
      "wrote the bytes gloo should send.")

# %%
# Where in the step each collective runs, as the log labelled it (calls per step): FSDP2 gathers
# in forward and, when it reshards, again in backward; ZeRO-1's broadcasts run inside the
# optimizer's step.
for name, row in table.items():
    print(f"{name:<20}" + ", ".join(f"{kind} in {phase}: {n / STEPS:g}"
                                    for (kind, phase), n in sorted(row["phases"].items())))

# %%
# 2Ψ vs 3Ψ: elements, bytes, and the wire
# ---------------------------------------
# Ratios to DDP, all computed from the counts above. Elements are ZeRO's measure; bytes add the
# dtypes; the last two columns are what each rank sends on gloo (measured) and what a backend with a
# native reduce-scatter, such as nccl, would send (ring model).
ddp = table["DDP"]
print(f"{'run':<20}{'elements':>10}{'bytes':>8}{'gloo wire':>11}{'nccl wire':>11}")
for name, row in table.items():
    print(f"{name:<20}{row['zero_elems'] / ddp['zero_elems']:>9.3f}×"
          f"{row['asked_bytes'] / ddp['asked_bytes']:>7.3f}×{row['gloo_wire'] / ddp['gloo_wire']:>10.3f}×"
          f"{row['nccl_model'] / ddp['nccl_model']:>10.3f}×")
fp32, bf16 = table["FSDP2 reshard, fp32"], table["FSDP2 reshard, bf16"]
CLAIMS = [  # (the claim this page makes, the measured ratio, the ratio the claim says)
    ("FSDP2 resharding asks for 1.5x DDP's elements (3Ψ vs 2Ψ)",
     fp32["zero_elems"] / ddp["zero_elems"], 1.5),
    ("FSDP2 bf16 all-gathers + fp32 reduce-scatter move DDP's fp32 bytes",
     bf16["asked_bytes"] / ddp["asked_bytes"], 1.0),
    ("FSDP2 without resharding asks for DDP's elements (2Ψ)",
     table["FSDP2 keep, fp32"]["zero_elems"] / ddp["zero_elems"], 1.0),
    ("on gloo FSDP2 resharding sends 2x DDP's bytes, not 1.5x",
     fp32["gloo_wire"] / ddp["gloo_wire"], 2.0),
]
for claim, measured, said in CLAIMS:
    if not math.isnan(measured) and abs(measured / said - 1) > comm.ELEMENT_TOL:
        raise checks.CheckFailed(f"[comm ratio] {claim}: measured {measured:.3f}x at "
                                 f"{WORLD_SIZE} ranks, more than {comm.ELEMENT_TOL:.0%} from {said}x.")
print(f"\nFSDP2 with resharding asks for {fp32['zero_elems'] / ddp['zero_elems']:.3f}× DDP's "
      f"elements: ZeRO's 3Ψ/2Ψ, plus {padded / PSI - 1:.3%} of padding. In fp32 that is also "
      f"{fp32['asked_bytes'] / ddp['asked_bytes']:.3f}× the bytes; with bf16 all-gathers and an fp32 "
      f"reduce-scatter it is {bf16['asked_bytes'] / ddp['asked_bytes']:.3f}× the bytes. "
      f"On gloo, which runs the reduce-scatter as a full all-reduce, the fp32 run sent "
      f"{fp32['gloo_wire'] / ddp['gloo_wire']:.3f}× DDP's bytes; with nccl's native reduce-scatter "
      f"the ring model gives {fp32['nccl_model'] / ddp['nccl_model']:.3f}×. Without resharding "
      f"FSDP2 asks for {table['FSDP2 keep, fp32']['zero_elems'] / ddp['zero_elems']:.3f}× (ZeRO-2's "
      f"2Ψ). torch's ZeRO-1 asks for {table['ZeRO-1']['zero_elems'] / ddp['zero_elems']:.3f}×, more "
      f"than the paper's P_os, which costs what DDP costs: it keeps DDP's full all-reduce and adds a "
      f"broadcast of every parameter, where P_os would reduce-scatter and all-gather.")

# %%
# The same, drawn: bars are the bytes one rank sends per step under the ring model, stacked by
# collective; diamonds are what gloo actually wrote. The gap between a diamond and its bar is
# gloo's reduce-scatter-as-all-reduce; DDP's and ZeRO-1's sit on their bars.
fig = comm.bytes_chart(MODELS, {n: row["gloo_wire"] for n, row in table.items()}, WORLD_SIZE)
plt.show()

# %%
# What this means at 70B: a lower bound
# -------------------------------------
# The same model, applied to Llama-3-70B's parameter shapes (:data:`guide.memory.PRESETS`), priced
# with the ring cost :func:`guide.comm.ring_bytes`, ``(N-1)/N·S`` per all-gather or
# reduce-scatter and twice that per all-reduce, divided by the bandwidth of one GPU's link:
# 8 GPUs on NVLink at 450 GB/s per direction (H100/H200 SXM: 900 GB/s bidirectional), or 64 GPUs
# with one 400 Gb/s InfiniBand NIC each. This is a **lower bound**: no latency, perfect bandwidth,
# no overlap, and nccl's real bus bandwidth is below the link rate. Next to it, the compute of one
# step, ``6·Ψ·tokens``, at a stated fraction of the H100's dense bf16 peak. Communication that
# FSDP2 overlaps with compute hides only while it is shorter than the compute.
ARCH = PRESETS["llama-3-70b"]
big = ARCH.param_shapes()
LINKS = [comm.Link("NVLink, 8 GPUs", 450e9, 8), comm.Link("IB 400 Gb/s, 64 GPUs", 400e9 / 8, 64)]
TOKENS_PER_GPU = 8192  # tokens each GPU processes per step (e.g. 2 sequences of 4,096)
PEAK, FRACTION = 989e12, 0.40  # H100 SXM dense bf16 FLOP/s; a typical 40 % of it
BIG = {  # strategy -> one step's collectives at N ranks
    "DDP, fp32 grads": lambda n: comm.ddp_step(big, n),
    "ZeRO-1, fp32": lambda n: comm.zero1_step(big, n),
    "FSDP2 reshard, fp32": lambda n: comm.fsdp2_step([FSDPGroup.of(big, True)], n),
    "FSDP2 reshard, bf16 AG + fp32 RS": lambda n: comm.fsdp2_step(
        [FSDPGroup.of(big, True)], n, torch.bfloat16, torch.float32),
    "FSDP2 reshard, bf16 AG + bf16 RS": lambda n: comm.fsdp2_step(
        [FSDPGroup.of(big, True)], n, torch.bfloat16, torch.bfloat16),
    "FSDP2 keep, bf16 AG + fp32 RS": lambda n: comm.fsdp2_step(
        [FSDPGroup.of(big, False)], n, torch.bfloat16, torch.float32),
}
compute = comm.compute_seconds(ARCH.n_params, TOKENS_PER_GPU, PEAK, FRACTION)
print(f"Llama-3-70B: Ψ = {ARCH.n_params / 1e9:.2f}e9. Lower bound on communication per step "
      f"(seconds), ring cost at link rate:\n")
print(f"{'strategy':<34}" + "".join(f"{link.name:>24}" for link in LINKS))
seconds = {name: [comm.lower_bound_seconds(step(link.world_size), link) for link in LINKS]
           for name, step in BIG.items()}
for name, row in seconds.items():
    print(f"{name:<34}" + "".join(f"{t:>24.2f}" for t in row))
print(f"\nCompute per step: 6 × Ψ × {TOKENS_PER_GPU:,} tokens per GPU at {FRACTION:.0%} of "
      f"{PEAK / 1e12:,.0f} TFLOP/s = {compute:.2f} s.")
nv, ib = seconds["FSDP2 reshard, bf16 AG + fp32 RS"]
print(f"Inside a node FSDP2's traffic (bf16 gathers, fp32 reduce-scatter) needs at least "
      f"{nv / compute:.0%} of the compute time; across {LINKS[1].world_size} GPUs on InfiniBand "
      f"at least {ib / compute:.0%}" + (
          ", so even perfect overlap leaves it communication-bound there: why large runs shard "
          "within a node (HSDP) or add tensor parallelism." if ib > compute else
          ", which perfect overlap could still hide behind compute."))
