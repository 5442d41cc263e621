"""
Memory, measured: what each rank holds under DDP, ZeRO-1 and FSDP2
===================================================================

.. admonition:: Verdict
   :class: tip

   To divide the memory of the model state by N, use FSDP2: at N = 4 its fullest rank holds
   :claim:`memory-model-state.fsdp2.widest.model_state_vs_ddp` of DDP's model state (1/N plus
   padding). ZeRO-1 divides only the optimizer state and DDP nothing, and DDP adds its gradient
   buckets on top. Budget :claim:`adamw.fp32.bytes_per_param` bytes per parameter for fp32 AdamW.

Measured on CPU gloo processes (tensor storage of a tiny model); the calculator applies the same,
checked prediction to GPU-sized models, labelled predicted.

The code to copy comes first; the page then trains a small model for one step under each strategy
on several ranks, reads the tensor storage every rank really holds, and **fails the build** if any
rank, strategy or part differs from the prediction of :mod:`guide.memory.predicted`.
"""

# %%
# The code to copy
# ----------------
# Three ways to spread one model over N ranks. **DDP** keeps parameters, gradients and optimizer
# state on every rank, plus a second copy of the gradients in its reducer's buckets
# (``gradient_as_bucket_view=False``, the default; the buckets are not model state, so every table
# shows them apart). **ZeRO-1** is DDP with a ``ZeroRedundancyOptimizer``: each rank keeps the
# optimizer state of whole parameters of its own. **FSDP2** splits all three along dim 0 of every
# tensor. ``reshard_after_forward=False`` keeps each block's gathered parameters from forward to
# backward; an optional ``MixedPrecisionPolicy`` computes in bf16 over fp32 shards.
import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def shard_fsdp2(model: torch.nn.Module, mesh: DeviceMesh, reshard_after_forward: bool = True,
                mp_policy: MixedPrecisionPolicy | None = None) -> torch.nn.Module:
    """FSDP2: each block one unit, then the root."""
    options = dict(reshard_after_forward=reshard_after_forward)
    if mp_policy is not None:
        options["mp_policy"] = mp_policy
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)  # fault-point: shard-root
    return model


def zero1_optimizer(ddp_model: DDP, optimizer_class: type) -> ZeroRedundancyOptimizer:
    """ZeRO-1: DDP's model, each rank keeping the optimizer state of its share of parameters."""
    return ZeroRedundancyOptimizer(ddp_model.parameters(), optimizer_class=optimizer_class)


BF16_MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

# %%
# A model with awkward shapes
# ---------------------------
# The model is :class:`guide.model.TinyLM` with ``vocab=127`` and ``max_seq=30``, so that the
# embeddings and the LM head do not split evenly over 2 or 4 ranks. FSDP2 shards a tensor
# like ``torch.chunk``: ``ceil(dim0/N)`` rows per rank until the rows run out, so the last ranks
# get what is left, possibly nothing. It *pads* every rank's storage to ``ceil(dim0/N)`` rows, and
# the prediction must account for that padding. With AdamW every parameter costs an fp32 weight,
# an fp32 gradient and two fp32 moments; bf16 compute with fp32 master weights costs the same
# (PyTorch keeps the fp32 weight as the master copy); pure bf16 halves it (ZeRO, arXiv 1910.02054).
# What this page measures is tensor storage on CPU: the CUDA caching allocator's rounding, the CUDA
# context and fragmentation are neither measured here nor predicted. The
# :doc:`memory calculator <../pages/memory_calculator>` applies the same prediction to public
# models, up to Llama-3.1-405B.
import itertools
import math

import matplotlib.pyplot as plt

import guide
from guide import checks, memory
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.report import show, table
from guide.sharding import Strategy
from guide.training import make_optimizer, train_steps
from guide.optimizers import OPTIMIZERS

CFG = ModelConfig(vocab=127, d_model=64, n_layers=2, n_heads=4, d_mlp=256, max_seq=30)
BATCHES = synthetic_batches(steps=1, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)
STRATEGIES = (Strategy.DDP, Strategy.ZERO1, Strategy.FSDP2, Strategy.FSDP2_NO_RESHARD)
#: The world sizes measured: under torchrun, torchrun's WORLD_SIZE alone.
PAGE = guide.Page(section="Memory", order=1, key_api="fully_shard(", world_size=4,
                  supports=(2, 4, 8))
WORLD_SIZES = (PAGE.world_size,) if guide.under_torchrun() else (1, 2, 4)  # fault-point: sizes
N = WORLD_SIZES[-1]  # the widest, which the sentences below quote
#: (precision, optimizer) combinations measured on every (strategy, N).
RUNS = (("fp32", "adamw"), ("bf16_mixed", "adamw"), ("bf16", "sgd_momentum"))  # fault-point: runs
TOLERANCE = 0.005  # the prediction is meant to be exact to the byte
MiB = 2**20

MODEL = dict(model=repr(CFG))
SHAPES = memory.param_shapes(build_model(CFG))
n_params = PAGE.state("tinylm.awkward.params", sum(math.prod(s) for s in SHAPES),
                      "parameters", **MODEL)
uneven = sorted({s[0] for s in SHAPES if s[0] % 4}, reverse=True)  # split unevenly over 4
PAGE.show("tinylm.awkward", [["TinyLM, awkward", n_params, len(SHAPES), *uneven]],
          ["model", "parameters", "tensors", *(f"uneven dim 0, #{i + 1}"
                                               for i in range(len(uneven)))],
          formats={"parameters": ","}, keys=["shapes"],
          **MODEL)

# %%
# One worker, every strategy
# --------------------------
# The worker builds the model, wraps it with the functions above, trains one step (the optimizer
# creates its state on the first ``step()``) and measures, for every (strategy, precision,
# optimizer). ``bf16_mixed`` is bf16 compute with fp32 master weights: ``torch.autocast`` for DDP
# and ZeRO-1, the ``MixedPrecisionPolicy`` for FSDP2. ``bf16`` is the whole model cast to bfloat16.


def wrapped(strategy: Strategy, precision: str, rank: guide.Rank) -> torch.nn.Module:
    model = build_model(CFG, device=rank.device)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if not strategy.is_fsdp2:  # ZeRO-1 is DDP underneath
        return DDP(model)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return shard_fsdp2(model, mesh, reshard_after_forward=strategy is Strategy.FSDP2,
                       mp_policy=BF16_MIXED if precision == "bf16_mixed" else None)


def worker(rank: guide.Rank) -> dict:
    out = {}
    for strategy, (precision, optimizer) in itertools.product(STRATEGIES, RUNS):
        model = wrapped(strategy, precision, rank)
        if strategy is Strategy.ZERO1:
            opt = zero1_optimizer(model, OPTIMIZERS[optimizer].factory)
        else:
            opt = make_optimizer(optimizer, model.parameters())
        autocast = precision == "bf16_mixed" and not strategy.is_fsdp2
        with torch.autocast(rank.device.type, dtype=torch.bfloat16, enabled=autocast):
            train_steps(model, opt, BATCHES, rank)
        # after step(), before the next zero_grad()
        result = {"held": memory.measure(model, opt)}
        if strategy.is_fsdp2:  # a forward alone: what stays gathered until backward
            with torch.no_grad():
                model(BATCHES[0][:1, :-1].to(rank.device))
            result["after_forward"] = memory.storage_bytes(model.parameters())
        out[strategy, precision, optimizer] = result
        del model, opt
    return out


by_n = {n: guide.launch(worker, n) for n in WORLD_SIZES}
measured = {(s, n): [{run: res[(s, *run)] for run in RUNS} for res in by_n[n]]
            for s in STRATEGIES for n in WORLD_SIZES}

# %%
# The checks that fail the build
# ------------------------------
# For every strategy, N, rank, precision and optimizer, each part measured (parameters, gradients,
# optimizer state, DDP's buckets) must equal :func:`guide.memory.state_bytes_by_rank` with
# ``ddp_buckets=True`` (DDP's default) within the tolerance. And FSDP2's promise itself: a rank's
# model state may not exceed DDP's divided by N by more than the padding, which is
# ``(ceil(dim0/N) - dim0/N)`` rows of every tensor in parameters, gradients and moments, plus
# AdamW's 4-byte ``step`` counter, which every rank keeps for every tensor it holds a shard of.
PARTS = ("params", "grads", "optimizer", "buckets")


def padding_bytes(n: int, precision: str, optimizer: str) -> float:
    """What FSDP2 may hold above an exact 1/N of DDP's model state (from the shapes)."""
    pr, opt = memory.PRECISIONS[precision], OPTIMIZERS[optimizer]
    per_elem = pr.param + pr.grad + pr.master + opt.moments * pr.moment
    pad = sum((math.ceil(s[0] / n) - s[0] / n) * math.prod(s[1:]) for s in SHAPES)
    return pad * per_elem + opt.step_bytes * len(SHAPES) * (1 - 1 / n)


def gap(got: int, want: int) -> float:
    return abs(got - want) / max(want, 1)


pairs = []  # (measured, predicted) of every part checked below
for (strategy, n), ranks in measured.items():
    for precision, optimizer in RUNS:
        predicted = memory.state_bytes_by_rank(SHAPES, strategy, n, precision,
                                               optimizer, ddp_buckets=True)
        ddp = measured[Strategy.DDP, n]
        for r, (result, want) in enumerate(zip(ranks, predicted)):
            got = result[precision, optimizer]["held"]
            run = f"{strategy} at N={n}, rank {r}, {precision} {optimizer}"
            for part in PARTS:
                g, w = getattr(got, part), getattr(want, part)
                pairs.append((g, w))
                checks.expect("model-state bytes", run, gap(g, w) <= TOLERANCE,
                              f"{part} measured {g:,} B, predicted {w:,} B "
                              f"({TOLERANCE:.1%} allowed)")
            if strategy.is_fsdp2:
                bound = (ddp[r][precision, optimizer]["held"].model_state / n
                         + padding_bytes(n, precision, optimizer))
                checks.expect("FSDP2 <= DDP/N + padding", run, got.model_state <= bound,
                              f"{got.model_state:,} B > {bound:,.0f} B")

n_checks = sum(len(r) for r in measured.values()) * len(RUNS) * len(PARTS)
tol = PAGE.state("tolerance.memory_prediction", TOLERANCE, "fraction")
worst = PAGE.check("memory-model-state.worst_prediction_gap", checks.expect_close(
    "model-state bytes", f"{n_checks} measurements", *zip(*pairs), TOLERANCE, rel=True,
    against="guide.memory from the shapes"), "fraction", fmt=".6f",
    world_sizes=WORLD_SIZES, checks=n_checks, **MODEL)
show(table([[f"{n_checks} measurements", worst, tol]],
           ["(strategy, N, rank, precision, optimizer, part)", "largest gap to prediction",
            "tolerance"], formats={"largest gap to prediction": ".4%", "tolerance": ".1%"}))

# %%
# Bytes per parameter
# -------------------
# DDP's model state on one rank over the parameter count, measured, against ZeRO's formula
# (:func:`guide.memory.state_bytes_for_count`: weights, gradients, master copy and moments per
# parameter). The measurement also holds AdamW's 4-byte ``step`` per tensor, which the formula
# leaves out: a gap far inside the tolerance.
per_param = {}
for precision, optimizer in RUNS:
    got = measured[Strategy.DDP, N][0][precision, optimizer]["held"].model_state / n_params
    want = memory.state_bytes_for_count(1, "ddp", 1, precision, optimizer,
                                        ddp_buckets=False).model_state
    per_param[precision, optimizer] = PAGE.check(
        f"{optimizer}.{precision}.bytes_per_param", checks.expect_close(
            "bytes per parameter", f"DDP at N={N}, {precision} {optimizer}", got, want,
            TOLERANCE, rel=True, unit="bytes per parameter", against="ZeRO's formula"),
        fmt=".0f", counts="model state (no DDP buckets)")
show(table([(memory.PRECISIONS[p].label, o, b) for (p, o), b in per_param.items()],
           ["precision", "optimizer", "model state bytes per parameter"],
           formats={"model state bytes per parameter": ".0f"}))

# %%
# Measured per rank, fp32 AdamW
# -----------------------------
# For each (strategy, N) the table shows the rank that holds the most, found in the measurements
# (not assumed): FSDP2's ceil-sized chunks favour the first ranks; ZeRO-1 splits whole parameters,
# largest first onto the least-filled rank, so the tensors that come last decide the fullest. Two ratios to DDP, because there are two
# honest answers: *model state* (parameters, gradients, optimizer: ZeRO's accounting) and *held*
# (plus DDP's buckets, what the rank really keeps between steps with DDP's defaults).
fullest = {key: max(range(len(ranks)), key=lambda r, ranks=ranks:
                    (ranks[r]["fp32", "adamw"]["held"].total, -r))
           for key, ranks in measured.items()}
held = {key: measured[key][fullest[key]]["fp32", "adamw"]["held"] for key in measured}


def predicted_fullest(strategy: Strategy, n: int) -> memory.StateBytes:
    """The prediction for the rank the measurements found fullest."""
    return memory.state_bytes_by_rank(SHAPES, strategy, n, "fp32", "adamw",
                                      ddp_buckets=True)[fullest[strategy, n]]


def vs_ddp(strategy: Strategy, n: int, what: str) -> checks.Checked | str:
    """The fullest rank's ``what`` ("model_state" or "total") over DDP's, checked; DDP's own row
    is the reference (a ratio of DDP by itself is refused: it is 1 by construction)."""
    if strategy is Strategy.DDP:
        return "reference"
    got = checks.ratio(f"{what} ratio", getattr(held[strategy, n], what),
                       getattr(held[Strategy.DDP, n], what), of=f"{strategy.label} at N={n}",
                       over=f"{Strategy.DDP.label} at N={n}")
    want = [getattr(predicted_fullest(k, n), what) for k in (strategy, Strategy.DDP)]
    return checks.expect_close(  # each side is checked above: their ratio too
        "model-state bytes", f"{strategy} vs DDP at N={n}, fullest rank", got,
        want[0] / want[1], 2 * TOLERANCE, f"{what} ratio", rel=True,
        against="the predicted bytes' ratio")


rows, keys = [], []
for (s, n), h in held.items():
    rows.append((s.label, n, fullest[s, n], h.params, h.grads, h.optimizer, h.buckets, h.total,
                 vs_ddp(s, n, "model_state"), vs_ddp(s, n, "total")))
    keys.append(f"{s.value}.n{n}")
COLS = ["strategy", "N", "rank", "params", "grads", "optimizer", "buckets", "held",
        "state÷DDP", "held÷DDP"]
with PAGE.scope(precision="fp32", optimizer="adamw", ddp_buckets=True, **MODEL):
    PAGE.show("memory-model-state", rows, COLS, formats={"state÷DDP": ".1%", "held÷DDP": ".1%"},
              title="measured bytes on the fullest rank, fp32 AdamW (held = model state + "
                    "DDP's buckets)", keys=keys)
    fsdp_state = PAGE.check("memory-model-state.fsdp2.widest.model_state_vs_ddp",
                            vs_ddp(Strategy.FSDP2, N, "model_state"), fmt=".1%",
                            world_size=N)
    fsdp_held = PAGE.check("memory-model-state.fsdp2.widest.held_vs_ddp",
                           vs_ddp(Strategy.FSDP2, N, "total"), fmt=".1%", world_size=N)

# %%
# ZeRO-1's optimizer state per rank at the widest N, measured, against the shares the prediction
# gives from the shapes. It splits whole parameters, largest first, each onto the least-filled rank:
# the largest tensor sets a floor, and which rank ends fullest is decided by the tensors that follow.
zero_n = [r["fp32", "adamw"]["held"].optimizer for r in measured[Strategy.ZERO1, N]]
zero_want = [p.optimizer for p in memory.state_bytes_by_rank(
    SHAPES, Strategy.ZERO1, N, "fp32", "adamw", ddp_buckets=True)]
shares = [checks.expect_close("model-state bytes", f"ZeRO-1 at N={N}, rank {r}",
                              z / sum(zero_n), w / sum(zero_want), TOLERANCE, "optimizer share",
                              rel=True, against="the predicted partition")
          for r, (z, w) in enumerate(zip(zero_n, zero_want))]
most = max(range(N), key=lambda r: (shares[r], -r))
with PAGE.scope(world_size=N, precision="fp32", optimizer="adamw", **MODEL):
    PAGE.show(f"memory-model-state.zero1.n{N}",
              [[f"rank {r}", z, s] for r, (z, s) in enumerate(zip(zero_n, shares))],
              ["ZeRO-1", "optimizer bytes", "share"], formats={"share": ".1%"},
              keys=[f"rank{r}" for r in range(N)])
PAGE.conclude(f"At N={N} the fullest FSDP2 rank holds {fsdp_state:.1%} of DDP's model state "
              f"(the rest of 1/N is padding and step counters) and {fsdp_held:.1%} of what a "
              f"DDP rank holds with its buckets. Under ZeRO-1, rank {most} holds the largest "
              f"optimizer share ({shares[most]:.1%}).")
PAGE.state(f"memory-model-state.zero1.n{N}.fullest_rank", most, "rank", shown=str(most),
           world_size=N, **MODEL)

# %%
# Both FSDP2 rows are the same because ``reshard_after_forward=False`` changes what a rank holds
# *during* the step, not between steps: it keeps each block's gathered, unsharded parameters from
# the forward to the backward (saving the backward all-gather), then reshards them after backward.
# The worker also ran one forward alone and read the parameter storage the model exposes at that
# point: with resharding, the shards; without, every parameter whole, in the compute dtype
# (:func:`guide.memory.unsharded_param_bytes`), held *in addition to* the shards.
for (strategy, n), ranks in measured.items():
    if not strategy.is_fsdp2:
        continue
    for (precision, optimizer), (r, result) in itertools.product(RUNS,
                                                                 enumerate(ranks)):
        m = result[precision, optimizer]
        run = f"{strategy} at N={n}, rank {r}, {precision} {optimizer}"
        want = (m["held"].params if strategy is Strategy.FSDP2
                else memory.unsharded_param_bytes(SHAPES, n, precision))
        got = m["after_forward"]
        checks.expect("parameters held after forward", run, got == want,
                      f"measured {got:,} B, predicted {want:,} B")
no_reshard = measured[Strategy.FSDP2_NO_RESHARD, N][0]["fp32", "adamw"]
with PAGE.scope(world_size=N, precision="fp32", optimizer="adamw", **MODEL):
    unsharded = PAGE.check(
        f"memory-model-state.fsdp2_no_reshard.n{N}.unsharded_params", checks.expect_close(
            "parameters held after forward", f"FSDP2 no reshard at N={N}, rank 0",
            no_reshard["after_forward"], memory.unsharded_param_bytes(SHAPES, N, "fp32"),
            TOLERANCE, rel=True, unit="bytes", against="guide.memory from the shapes"),
        fmt=",")
    times = PAGE.state(f"memory-model-state.fsdp2_no_reshard.n{N}.unsharded_vs_state",
                       unsharded / held[Strategy.FSDP2, N].model_state, "x", fmt=".1f")
print(f"reshard_after_forward=False at N={N} additionally holds {unsharded:,.0f} B of "
      f"unsharded fp32 parameters between forward and backward ({times:.1f}x the "
      "rank's model state).")

# %%
# The picture
# -----------
# One bar per (strategy, N): the fullest rank's measured bytes (its rank under the bar), stacked by
# part; the black tick is the prediction for that same rank. DDP's bar does not shrink with N;
# ZeRO-1's optimizer segment does; FSDP2's whole bar does.
style()
fig, ax = plt.subplots(figsize=(9, 4.8))
shades = {"params": 1.0, "grads": 0.65, "optimizer": 0.35}
x, ticks, ticklabels = 0.0, [], []
for strategy in STRATEGIES:
    for n in WORLD_SIZES:
        h, bottom = held[strategy, n], 0.0
        for part, alpha in shades.items():
            v = getattr(h, part) / MiB
            ax.bar(x, v, bottom=bottom, color=strategy.color, alpha=alpha, width=0.8,
                   edgecolor="white")
            bottom += v
        if h.buckets:
            ax.bar(x, h.buckets / MiB, bottom=bottom, color="white",
                   edgecolor=strategy.color, hatch="///", width=0.8)
        pred = predicted_fullest(strategy, n)
        ax.plot([x - 0.45, x + 0.45], [pred.total / MiB] * 2, color="black", lw=2)
        ticks.append(x)
        ticklabels.append(f"N={n}\nr{fullest[strategy, n]}")
        x += 1
    ax.text(x - (len(WORLD_SIZES) + 1) / 2, -0.16, strategy.label, ha="center",
            va="top", fontsize=10, color=strategy.color, fontweight="bold",
            transform=ax.get_xaxis_transform())
    x += 0.6
ax.set_xticks(ticks, ticklabels, fontsize=9)
ax.set_ylabel("bytes held by the fullest rank (MiB)")
ax.set_title("Measured per rank, fp32 AdamW: only FSDP2 divides it all")
handles = [plt.Rectangle((0, 0), 1, 1, color="gray", alpha=a) for a in shades.values()]
handles += [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="gray",
                          hatch="///"), plt.Line2D([], [], color="black", lw=2)]
ax.legend(handles, ["parameters", "gradients", "AdamW state", "DDP gradient buckets",
                    "predicted (same rank)"], loc="upper right", fontsize=9, ncol=3)
ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
