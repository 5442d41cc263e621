"""
Memory, measured: what each rank holds under DDP, ZeRO-1 and FSDP2
===================================================================

Data parallelism multiplies the *work* by N; whether it divides the *memory* depends on what every
rank keeps between steps. That is the **model state**: parameters, their gradients and the optimizer
state (ZeRO, arXiv 1910.02054 §3.1). With AdamW every parameter costs 4 (fp32 weight) + 4 (fp32
gradient) + 8 (two fp32 moments) = **16 bytes**; with bf16 compute and fp32 master weights it is
still 16 (PyTorch keeps the fp32 weight as the master copy); pure bf16 halves it to 8.

* **DDP** keeps all of it on every rank, plus a second copy of the gradients in its reducer's buckets.
* **ZeRO-1** (DDP + :class:`~torch.distributed.optim.ZeroRedundancyOptimizer`) splits the optimizer
  state, parameter by parameter.
* **FSDP2** (``fully_shard``) splits all three along dim 0 of every tensor.

:mod:`guide.memory` predicts these bytes per rank, exactly, from the parameter shapes alone.
This page trains a small model for one step under each strategy on N = 1, 2 and 4 gloo ranks,
reads the tensors every rank really holds (:func:`guide.model_state.measure`), and **fails the
build** if any rank, strategy or component differs from the prediction by more than 0.5 %. Then it
applies the same model to a 70B-parameter model, which no one can train on a laptop.
"""

# %%
# A model with awkward shapes
# ---------------------------
# The model is :class:`guide.model.TinyLM` with a vocabulary of 127 tokens and 30 positions, so that
# the embeddings and the LM head do not split evenly over 2 or 4 ranks. FSDP2 shards a tensor
# like ``torch.chunk`` (``ceil(dim0/N)`` rows per rank, the remainder on the last) and *pads* every
# rank's storage to the full ``ceil(dim0/N)`` rows; the model must account for that padding.
import itertools
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import memory, plotting
from guide.sharding import apply_fsdp2
from guide.checks import CheckFailed
from guide.data import synthetic_batches
from guide.memory import GB, GiB
from guide.model import ModelConfig, build_model
from guide.model_state import ddp_bucket_bytes, measure, param_shapes, storage_bytes
from guide.training import train_steps

CFG = ModelConfig(vocab=127, d_model=64, n_layers=2, n_heads=4, d_mlp=256, max_seq=30)
BATCHES = synthetic_batches(steps=1, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)
STRATEGIES = ("ddp", "zero1", "fsdp2", "fsdp2_no_reshard")
LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "fsdp2": "FSDP2",
          "fsdp2_no_reshard": "FSDP2 no reshard"}
WORLD_SIZES = (1, 2, 4)
#: (precision, optimizer) combinations measured on every (strategy, N).
RUNS = (("fp32", "adamw"), ("bf16_mixed", "adamw"), ("bf16", "sgd_momentum"))
TOLERANCE = 0.005  # the 0.5 %; the model is meant to be exact to the byte

SHAPES = param_shapes(build_model(CFG))
n_params = sum(math.prod(s) for s in SHAPES)
print(f"{n_params:,} parameters in {len(SHAPES)} tensors "
      f"({n_params * 4 / 2**20:.3f} MiB in fp32); uneven dim 0: "
      + ", ".join(sorted({f"{s[0]} rows" for s in SHAPES if s[0] % 4})))

# %%
# The three ways to wrap the model
# --------------------------------
# One worker runs every (strategy, precision, optimizer) combination on N ranks: it builds the
# model, wraps it, trains one step (the optimizer creates its state on the first ``step()``) and
# measures.
# ``bf16_mixed`` is bf16 compute with fp32 master weights: ``torch.autocast`` for DDP and ZeRO-1, a
# :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` for FSDP2. ``bf16`` is the whole model cast
# to bfloat16. ZeRO-1 takes the optimizer's class and arguments instead of an optimizer.
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1}),
              "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 1e-2})}


def wrap(model, strategy, precision, optimizer, rank):
    """The model and optimizer as ``strategy`` trains them."""
    opt_class, opt_kwargs = OPTIMIZERS[optimizer]
    if strategy in ("ddp", "zero1"):
        model = DDP(model)  # gradient_as_bucket_view=False, the default
        if strategy == "zero1":
            return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=opt_class,
                                                  **opt_kwargs)
        return model, opt_class(model.parameters(), **opt_kwargs)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    options = {"reshard_after_forward": strategy == "fsdp2"}
    if precision == "bf16_mixed":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                    reduce_dtype=torch.float32)
    apply_fsdp2(model, mesh, **options)
    return model, opt_class(model.parameters(), **opt_kwargs)


def worker(rank: guide.Rank) -> dict:
    out = {}
    for strategy, (precision, optimizer) in itertools.product(STRATEGIES, RUNS):
        model = build_model(CFG, device=rank.device)
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        model, opt = wrap(model, strategy, precision, optimizer, rank)
        autocast = precision == "bf16_mixed" and strategy in ("ddp", "zero1")
        with torch.autocast(rank.device.type, dtype=torch.bfloat16, enabled=autocast):
            train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
        out[strategy, precision, optimizer] = {
            "state": measure(model, opt),  # after step(), before the next zero_grad()
            "buckets": ddp_bucket_bytes(model) if isinstance(model, DDP) else 0,
        }
        if strategy.startswith("fsdp2"):  # a forward alone: what stays gathered until backward
            with torch.no_grad():
                model(BATCHES[0][:1, :-1].to(rank.device))
            out[strategy, precision, optimizer]["after_forward"] = storage_bytes(model.parameters())
        del model, opt
    return out


by_n = {n: guide.launch(worker, n) for n in WORLD_SIZES}
measured = {(s, n): [{run: res[(s, *run)] for run in RUNS} for res in by_n[n]]
            for s in STRATEGIES for n in WORLD_SIZES}

# %%
# The checks that fail the build
# ------------------------------
# For every strategy, N, rank, precision and optimizer, each component measured must equal
# :func:`guide.memory.state_bytes_by_rank` within 0.5 %; DDP's reducer buckets (read from DDP's
# own logging data) must equal :func:`guide.memory.ddp_bucket_bytes`. And FSDP2's promise itself:
# a rank's state may not exceed DDP's divided by N by more than the padding, which is
# ``(ceil(dim0/N) - dim0/N)`` rows of every tensor in parameters, gradients and moments, plus
# AdamW's 4-byte ``step`` counter, which every rank keeps for every tensor it holds a shard of.
COMPONENTS = ("params", "grads", "optimizer")


def padding_bytes(shapes, n, precision, optimizer):
    """What FSDP2 may hold above an exact 1/N of DDP's state, from the shapes alone."""
    pr = memory.PRECISIONS[precision]
    per_elem = pr.param + pr.grad + pr.master + memory.OPTIMIZERS[optimizer] * pr.moment
    pad = sum((math.ceil(s[0] / n) - s[0] / n) * math.prod(s[1:]) for s in shapes)
    step = 4 * len(shapes) * (1 - 1 / n) if optimizer == "adamw" else 0
    return pad * per_elem + step


worst = 0.0
for (strategy, n), ranks in measured.items():
    for precision, optimizer in RUNS:
        predicted = memory.state_bytes_by_rank(SHAPES, strategy, n, precision, optimizer)
        for r, result in enumerate(ranks):
            got, want = result[precision, optimizer]["state"], predicted[r]
            for comp in COMPONENTS:
                g, w = getattr(got, comp), getattr(want, comp)
                gap = abs(g - w) / max(w, 1)
                worst = max(worst, gap)
                if gap > TOLERANCE:
                    raise CheckFailed(
                        f"model-state bytes: {LABELS[strategy]} at N={n}, rank {r}, {precision} "
                        f"{optimizer}: {comp} measured {g:,} B, model {w:,} B ({gap:.2%} off, "
                        f"tolerance {TOLERANCE:.1%})")
            if strategy in ("ddp", "zero1"):
                g = result[precision, optimizer]["buckets"]
                w = memory.ddp_bucket_bytes(SHAPES, precision)
                if abs(g - w) > TOLERANCE * w:
                    raise CheckFailed(f"DDP buckets: {LABELS[strategy]} at N={n}, rank {r}, "
                                      f"{precision} {optimizer}: measured {g:,} B, model {w:,} B")
            if strategy.startswith("fsdp2"):
                ddp = measured["ddp", n][r][precision, optimizer]["state"]
                bound = ddp.total / n + padding_bytes(SHAPES, n, precision, optimizer)
                if got.total > bound:
                    raise CheckFailed(
                        f"FSDP2 <= DDP/N + padding: {LABELS[strategy]} at N={n}, rank {r}, "
                        f"{precision} {optimizer}: {got.total:,} B > {bound:,.0f} B "
                        f"(DDP {ddp.total:,} B / {n} + padding)")

n_checks = sum(len(r) for r in measured.values()) * len(RUNS) * len(COMPONENTS)
print(f"{n_checks} (strategy, N, rank, precision, optimizer, component) measurements; "
      f"largest gap to the model: {worst:.4%} (tolerance {TOLERANCE:.1%}).")

# %%
# Measured per rank, fp32 AdamW
# -----------------------------
# The rank that holds the most (rank 0: it gets the ceil-sized chunks and, under ZeRO-1, the
# largest parameter). ``buckets`` is DDP's reducer copy of the gradients, outside ``param.grad``.
print(f"{'strategy':<18}{'N':>3}{'params':>10}{'grads':>10}{'optim':>10}{'buckets':>10}"
      f"{'total':>10}{'vs DDP':>8}   bytes, rank 0")
for (strategy, n), ranks in measured.items():
    m = ranks[0]["fp32", "adamw"]
    s, b = m["state"], m["buckets"]
    ddp = measured["ddp", n][0]["fp32", "adamw"]
    ratio = (s.total + b) / (ddp["state"].total + ddp["buckets"])
    print(f"{LABELS[strategy]:<18}{n:>3}{s.params:>10,}{s.grads:>10,}{s.optimizer:>10,}{b:>10,}"
          f"{s.total + b:>10,}{ratio:>8.1%}")

fsdp4 = measured["fsdp2", 4][0]["fp32", "adamw"]["state"].total
ddp4 = measured["ddp", 4][0]["fp32", "adamw"]["state"].total
zero4 = [r["fp32", "adamw"]["state"].optimizer for r in measured["zero1", 4]]
print(f"\nAt N=4 one FSDP2 rank holds {fsdp4 / ddp4:.1%} of DDP's model state (1/4 = 25%; the rest "
      f"is padding and step counters). ZeRO-1's optimizer shares over the 4 ranks are "
      + ", ".join(f"{z / sum(zero4):.1%}" for z in zero4)
      + ": it splits whole parameters, so the largest tensor sets the floor.")

# %%
# Both FSDP2 rows are the same because ``reshard_after_forward=False`` changes what a rank holds
# *during* the step, not between steps: it keeps each block's gathered, unsharded parameters from
# the forward to the backward (saving the backward all-gather), then reshards them after backward.
# The worker also ran one forward alone and read the parameter storage the model exposes at that
# point: with resharding, the shards; without, every parameter whole, in the compute dtype
# (:func:`guide.memory.unsharded_param_bytes`), held *in addition to* the shards.
COMPUTE_BYTES = {"fp32": 4, "bf16_mixed": 2, "bf16": 2}
for (strategy, n), ranks in measured.items():
    if not strategy.startswith("fsdp2"):
        continue
    for (precision, optimizer), r in itertools.product(RUNS, range(n)):
        m = ranks[r][precision, optimizer]
        want = (m["state"].params if strategy == "fsdp2"
                else memory.unsharded_param_bytes(SHAPES, n, COMPUTE_BYTES[precision]))
        if m["after_forward"] != want:
            raise CheckFailed(
                f"parameters held after forward: {LABELS[strategy]} at N={n}, rank {r}, "
                f"{precision} {optimizer}: measured {m['after_forward']:,} B, model {want:,} B")
unsharded = memory.unsharded_param_bytes(SHAPES, 4)
print(f"reshard_after_forward=False at N=4 additionally holds {unsharded:,} B of unsharded fp32 "
      f"parameters between forward and backward ({unsharded / fsdp4:.1f}x the rank's model state); "
      f"for Llama-3-70B in bf16 that is "
      f"{memory.unsharded_param_bytes(memory.PRESETS['llama-3-70b'].param_shapes(), 64, 2) / GiB:,.1f}"
      f" GiB per rank at any N.")

# %%
# The picture
# -----------
# One bar per (strategy, N): rank 0's bytes, stacked by component; the black tick is the model's
# prediction for the same total. DDP's bar does not shrink with N; ZeRO-1's optimizer segment does;
# FSDP2's whole bar does.
plotting.style()
fig, ax = plt.subplots(figsize=(9, 4.6))
shades = {"params": 1.0, "grads": 0.65, "optimizer": 0.35}
x, ticks, ticklabels = 0.0, [], []
for strategy in STRATEGIES:
    color = plotting.COLORS[LABELS[strategy].split(" ")[0]]
    for n in WORLD_SIZES:
        m = measured[strategy, n][0]["fp32", "adamw"]
        bottom = 0.0
        for comp, alpha in shades.items():
            v = getattr(m["state"], comp) / 2**20
            ax.bar(x, v, bottom=bottom, color=color, alpha=alpha, width=0.8, edgecolor="white")
            bottom += v
        if m["buckets"]:
            ax.bar(x, m["buckets"] / 2**20, bottom=bottom, color="white", edgecolor=color,
                   hatch="///", width=0.8)
        pred = memory.per_rank_total_bytes(SHAPES, strategy, n, "fp32", "adamw")
        ax.plot([x - 0.45, x + 0.45], [pred / 2**20] * 2, color="black", lw=2)
        ticks.append(x)
        ticklabels.append(f"N={n}")
        x += 1
    ax.text(x - 2, -0.08, LABELS[strategy], ha="center", va="top", fontsize=10, color=color,
            fontweight="bold", transform=ax.get_xaxis_transform())
    x += 0.6
ax.set_xticks(ticks, ticklabels, fontsize=9)
ax.set_ylabel("bytes held by rank 0 (MiB)")
ax.set_title(f"Model state per rank, fp32 AdamW, {n_params:,} parameters")
handles = [plt.Rectangle((0, 0), 1, 1, color="gray", alpha=a) for a in shades.values()]
handles += [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="gray", hatch="///"),
            plt.Line2D([], [], color="black", lw=2)]
ax.legend(handles, ["parameters", "gradients", "AdamW state", "DDP gradient buckets",
                    "model's prediction"], loc="upper right", fontsize=9, ncol=3)
ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
plt.show()

# %%
# The same model at 70 billion parameters
# ---------------------------------------
# What was just verified byte for byte on a toy scales with the shapes. Here is Llama-3-70B's
# shapes (:data:`guide.memory.PRESETS`) per rank against the world size, for model state alone
# (no activations, no all-gather buffers, no CUDA context). fp32 AdamW and bf16 with fp32 master
# weights are both 16 B/param and draw one line; pure bf16 is 8 B/param. The horizontal lines are
# what ``nvidia-smi`` reports for an H100 80 GB and an H200 141 GB, in GiB.
ARCH = memory.PRESETS["llama-3-70b"]
BIG = ARCH.param_shapes()
NS = np.unique(np.round(np.geomspace(1, 64, 25)).astype(int))
lines = {("DDP", "16"): ("ddp", "bf16_mixed"), ("DDP", "8"): ("ddp", "bf16"),
         ("ZeRO-1", "16"): ("zero1", "bf16_mixed"),
         ("FSDP2", "16"): ("fsdp2", "bf16_mixed"), ("FSDP2", "8"): ("fsdp2", "bf16")}
curves = {key: [memory.per_rank_state_bytes(BIG, s, int(n), p, "adamw").total / GiB for n in NS]
          for key, (s, p) in lines.items()}

fig, ax = plt.subplots(figsize=(8, 5))
for (name, bpp), ys in curves.items():
    ax.plot(NS, ys, color=plotting.COLORS[name], ls="-" if bpp == "16" else "--", lw=2,
            label=f"{name}, {'fp32 or bf16 + fp32 master' if bpp == '16' else 'pure bf16'} "
                  f"({bpp} B/param)")
for (gpu, cap), ls in zip(memory.GPU_CAPACITY_GIB.items(), (":", "-.")):
    ax.axhline(cap, color="gray", ls=ls, lw=1.5)
    ax.text(64, cap * 1.04, f"{gpu}: {cap:.1f} GiB", ha="right", va="bottom", fontsize=9,
            color="dimgray")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
ax.set_xlabel("world size N (ranks)")
ax.set_ylabel("model state per rank (GiB)")
ax.set_title(f"Llama-3-70B ({ARCH.n_params / 1e9:.1f}B params), AdamW: only sharding fits")
ax.legend(fontsize=8.5, loc="lower left")
plt.show()


def first_fit(strategy, precision, cap_gib):
    """Smallest power-of-two N at which the model state alone fits under ``cap_gib``."""
    for n in (1, 2, 4, 8, 16, 32, 64):
        if memory.per_rank_state_bytes(BIG, strategy, n, precision, "adamw").total / GiB < cap_gib:
            return n
    return None


for gpu, cap in memory.GPU_CAPACITY_GIB.items():
    fits = {p: first_fit("fsdp2", p, cap) for p in ("bf16_mixed", "bf16")}
    ddp16 = memory.per_rank_state_bytes(BIG, "ddp", 1, "bf16_mixed", "adamw").total / GiB
    print(f"{gpu}: FSDP2 model state fits from N={fits['bf16_mixed']} (16 B/param) and "
          f"N={fits['bf16']} (8 B/param); DDP needs {ddp16:,.1f} GiB on every GPU at any N, "
          f"{ddp16 / cap:.1f}x its capacity.")

# %%
# ZeRO's own numbers
# ------------------
# The model reproduces Figure 1 of the ZeRO paper: Ψ = 7.5B parameters, N = 64, mixed-precision
# Adam with K = 12 (``zero_mixed``: fp16 weights and gradients, fp32 master + moments in the
# optimizer), in decimal GB. Stage 2 has no PyTorch wrapper and is analytic only.
for stage, strategy in (("baseline DP", "ddp"), ("P_os (ZeRO-1)", "zero1"),
                        ("P_os+g (ZeRO-2)", "zero2"), ("P_os+g+p (ZeRO-3, FSDP)", "fsdp2")):
    sb = memory.state_bytes_for_count(7_500_000_000, strategy, 64, "zero_mixed", "adamw")
    print(f"{stage:<26}{sb.total / GB:8.1f} GB per device")

# %%
# What the seed notebook got wrong
# --------------------------------
# This site grew out of a notebook whose memory section was analytic only, and inconsistent: its
# ``per_rank_mem`` counted 8 bytes per parameter (right only for pure bf16 AdamW, with no fp32
# master weights), while its prose quoted numbers that assume 16 and mixed up GB and GiB. Recomputed
# with :func:`guide.memory.state_bytes_for_count` for 70 × 10⁹ parameters:
PSI = 70_000_000_000


def gib(strategy, n, precision):
    return memory.state_bytes_for_count(PSI, strategy, n, precision, "adamw").total / GiB


seed_code = gib("ddp", 1, "bf16")
right_ddp = gib("ddp", 1, "bf16_mixed")
right_n8 = gib("fsdp2", 8, "bf16_mixed")
print(f"seed code, DDP:          {seed_code:,.1f} GiB  (8 B/param: pure bf16, no fp32 master)")
print(f"seed prose, DDP:         '1.1 TiB'    -> 16 B/param is {PSI * 16 / GB:,.0f} GB = "
      f"{right_ddp:,.1f} GiB = {right_ddp / 1024:.2f} TiB")
print(f"seed prose, FSDP2 N=8:   '~140 GiB'   -> {PSI * 16 / 8 / GB:,.0f} GB = {right_n8:,.1f} GiB "
      f"(140 is GB, not GiB)")
print(f"\nSo the code under-counts bf16-mixed or fp32 AdamW by {right_ddp / seed_code:.0f}x, the "
      f"prose's '1.1 TiB' is {right_ddp / 1024:.2f} TiB, and at N=8 a rank needs "
      f"{right_n8:.1f} GiB, not 140: less than an H200's "
      f"{memory.GPU_CAPACITY_GIB['H200 (141 GB)']:.1f} GiB, but with only "
      f"{memory.GPU_CAPACITY_GIB['H200 (141 GB)'] - right_n8:.1f} GiB left for activations.")
