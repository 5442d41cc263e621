"""
Mixed precision: what is bf16, and what stays fp32
==================================================

``fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32))`` is the usual way to train in bf16 with FSDP2. It is easy to describe
it wrongly: a common summary says the parameters are "stored in bf16 at rest". They are not. This
page trains the same mini transformer in fp32 and in bf16 on gloo CPU ranks, looks at the dtype of
every tensor from inside the ranks, and **fails the docs build** unless:

* the sharded parameters stay **fp32 at rest** (they are the master weights the optimizer updates),
* the unsharded parameters each layer computes with in forward are **bf16** (seen by forward hooks),
* the gradients land on the shard in **fp32**, and the reduce-scatter runs in ``reduce_dtype``,
* the bf16 loss curve stays within a bound derived from bf16's precision of the fp32 reference.

First, a question the rest depends on: can gloo, the CPU backend, move bf16 at all?
"""

# %%
# What gloo does with bf16
# ------------------------
# FSDP2 casts each shard to ``param_dtype`` *before* the all-gather and reduce-scatters gradients in
# ``reduce_dtype``, so the backend must run those collectives in bf16. Rather than trust a support
# table, every rank runs each collective on small integer-valued tensors (exact in bf16) and checks
# the result (:func:`guide.precision.collective_support`).
import matplotlib.pyplot as plt
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import guide
from guide import checks, knob_plots, precision
from guide.comm import CollectiveLog, dtype_name
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, mean_over_ranks, reference_run, train_steps

WORLD_SIZE = guide.world_size(2)
STEPS = 20
CFG = ModelConfig()
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)


def probe_worker(rank: guide.Rank) -> tuple[str, dict]:
    return rank.backend, {dtype_name(dt): precision.collective_support(dt)
                          for dt in (torch.bfloat16, torch.float32)}


backend, support = guide.launch(probe_worker, WORLD_SIZE)[0]
print(f"{'collective':<22}" + "".join(f"{dt:>12}" for dt in support))
for op in support["bfloat16"]:
    print(f"{op:<22}" + "".join(f"{support[dt][op]:>12}" for dt in support))
for op, result in support["bfloat16"].items():
    if result != "ok":
        raise checks.CheckFailed(f"[gloo bf16] {backend} x{WORLD_SIZE}: {op} in bfloat16: {result}; "
                                 "the bf16 runs below depend on it.")
print(f"\n{backend} ran every collective FSDP2 needs in bfloat16, with exact results.")

# %%
# The worker: one policy per ``fully_shard`` call
# -----------------------------------------------
# Each block gets ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``. The root additionally gets
# ``output_dtype=torch.float32``: the head's output leaves the model in fp32, so the loss is computed
# from logits that were not rounded on the way out. Without it every logit would be rounded to bf16
# (8 significant bits) before the loss, and the page would partly be measuring the rounding of its
# own yardstick. (``output_dtype``
# goes on the root only: on the blocks it would hand fp32 activations to the next block's bf16
# LayerNorm, which CPU LayerNorm rejects.)
#
# During the first step, :class:`guide.precision.ForwardDtypes` hooks every layer and records the
# parameters it computes with, and :class:`guide.comm.CollectiveLog` records the dtype of every
# collective. Before the last step the worker keeps a copy of the fp32 shards, to ask afterwards how
# much of that step bf16 storage would have kept.


def mp_worker(rank: guide.Rank, optimizer: str, param_dtype: torch.dtype,
              reduce_dtype: torch.dtype) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                       output_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=root_policy)
    opt = make_optimizer(optimizer, model.parameters())
    at_rest_before = precision.stored_dtypes(model)

    def train(batches):
        return train_steps(model, opt, batches, rank.rank, rank.world_size, rank.device)

    with precision.ForwardDtypes(model) as fwd, CollectiveLog(model) as log:
        losses = train(BATCHES[:1])
    grads = precision.grad_dtypes(model)  # step 0's gradients, still on the shards
    losses += train(BATCHES[1:-1])
    before = [p.detach().to_local().clone() for p in model.parameters()]
    losses += train(BATCHES[-1:])
    after = [p.detach().to_local() for p in model.parameters()]
    return {"losses": losses, "at_rest_before": at_rest_before,
            "at_rest_after": precision.stored_dtypes(model), "grads": grads,
            "forward_params": fwd.params, "forward_kinds": fwd.param_kinds,
            "forward_shapes": fwd.param_shapes, "outputs": fwd.outputs,
            "collectives": log.records,
            "lost_in_bf16": precision.lost_update_fraction(before, after, torch.bfloat16)}


# %%
# Four runs against the fp32 reference
# ------------------------------------
# SGD in fp32 (an all-fp32 policy: the baseline for bytes), SGD and AdamW with bf16 parameters and
# fp32 reduction (the recommended setting), and SGD with the reduction in bf16 too.
BF16, FP32 = torch.bfloat16, torch.float32
RUNS = {  # name: (optimizer, param_dtype, reduce_dtype)
    "fp32, SGD": ("sgd", FP32, FP32),
    "bf16/fp32, SGD": ("sgd", BF16, FP32),
    "bf16/fp32, AdamW": ("adamw", BF16, FP32),
    "bf16/bf16, SGD": ("sgd", BF16, BF16),
}
REFERENCE = {opt: reference_run(CFG, opt, BATCHES)[0] for opt in ("sgd", "adamw")}
results = {name: guide.launch(mp_worker, WORLD_SIZE, *cfg) for name, cfg in RUNS.items()}

# %%
# The dtypes, checked
# -------------------
# On every rank and for every parameter: the sharded parameter is fp32 before and after training,
# the gradient on the shard is fp32, and what each layer computes with in forward is an unsharded
# (plain, full-shape) tensor in ``param_dtype``. Block outputs are ``param_dtype``; the root's output
# (the logits) is fp32 because of ``output_dtype``.
full_shapes = {name: tuple(p.shape) for name, p in build_model(CFG).named_parameters()}
for name, (_, param_dtype, reduce_dtype) in RUNS.items():
    for r, res in enumerate(results[name]):
        run = f"FSDP2 x{WORLD_SIZE} {name}, rank {r}"
        precision.assert_dtypes(run, "sharded parameters at rest, before training",
                                res["at_rest_before"], FP32)
        precision.assert_dtypes(run, "sharded parameters at rest, after training",
                                res["at_rest_after"], FP32)
        precision.assert_dtypes(run, "gradients on the shard", res["grads"], FP32)
        precision.assert_dtypes(run, "parameters used in forward", res["forward_params"],
                                param_dtype)
        sharded_in_forward = {p: k for p, k in res["forward_kinds"].items()
                              if k != "Tensor" or res["forward_shapes"][p] != full_shapes[p]}
        if sharded_in_forward:
            raise checks.CheckFailed(f"[dtype] {run}: parameters used in forward were not the "
                                     f"unsharded full tensors: {sorted(sharded_in_forward)[:3]}.")
        precision.assert_dtypes(run, "block outputs",
                                {m: d for m, d in res["outputs"].items() if m.startswith("blocks.")
                                 and m.count(".") == 1}, param_dtype)
        precision.assert_dtypes(run, "root output (logits)", {"": res["outputs"][""]}, FP32)

sample = results["bf16/fp32, SGD"][0]
print(f"{'parameter':<22}{'at rest (shard)':>17}{'in forward':>12}{'forward shape':>15}"
      f"{'grad (shard)':>14}")
for p in ("tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.ln1.weight", "head.weight"):
    print(f"{p:<22}{dtype_name(sample['at_rest_after'][p]):>17}"
          f"{dtype_name(sample['forward_params'][p]):>12}{str(sample['forward_shapes'][p]):>15}"
          f"{dtype_name(sample['grads'][p]):>14}")

# %%
# What went over the wire
# -----------------------
# One step's collectives on rank 0, by kind and dtype. The all-gather carries ``param_dtype``:
# bf16 halves its bytes. The reduce-scatter carries ``reduce_dtype``: with fp32 reduction it moves as
# many bytes as the fp32 run (FSDP2 up-casts the bf16 gradients before reducing, so the sum over
# ranks is taken in fp32); only ``reduce_dtype=bf16`` halves it too.
wire = {}
for name, (_, param_dtype, reduce_dtype) in RUNS.items():
    recs = results[name][0]["collectives"]
    for kind, want in (("all_gather", param_dtype), ("reduce_scatter", reduce_dtype)):
        dtypes = {c.dtype for c in recs if c.kind == kind}
        if dtypes != {dtype_name(want)}:
            raise checks.CheckFailed(f"[wire dtype] FSDP2 x{WORLD_SIZE} {name}: {kind} ran in "
                                     f"{sorted(dtypes)}, expected {want}.")
        wire[name, kind] = (sum(c.kind == kind for c in recs), sum(c.bytes for c in recs
                                                                    if c.kind == kind))
print(f"{'run':<20}{'all-gathers':>12}{'bytes':>10}{'reduce-scatters':>17}{'bytes':>10}")
for name in RUNS:
    (ag, ag_b), (rs, rs_b) = wire[name, "all_gather"], wire[name, "reduce_scatter"]
    print(f"{name:<20}{ag:>12}{ag_b:>10,}{rs:>17}{rs_b:>10,}")
base_ag, base_rs = wire["fp32, SGD", "all_gather"][1], wire["fp32, SGD", "reduce_scatter"][1]
for name, ag_ratio, rs_ratio in (("bf16/fp32, SGD", 0.5, 1.0), ("bf16/bf16, SGD", 0.5, 0.5)):
    got = (wire[name, "all_gather"][1] / base_ag, wire[name, "reduce_scatter"][1] / base_rs)
    if got != (ag_ratio, rs_ratio):
        raise checks.CheckFailed(f"[wire bytes] FSDP2 x{WORLD_SIZE} {name}: all-gather and "
                                 f"reduce-scatter bytes are {got} of fp32's, expected "
                                 f"{(ag_ratio, rs_ratio)}.")
print("\nbf16 parameters halve the all-gather bytes; only a bf16 reduce_dtype halves the "
      "reduce-scatter.")

# %%
# How close must the bf16 loss be?
# --------------------------------
# bf16 keeps 8 significant bits (7 stored, one implicit), so rounding a number ``x`` to bf16 moves it
# by at most ``u·|x|``, with unit roundoff ``u = 2**-8`` (``torch.finfo(torch.bfloat16).eps`` is the
# spacing above 1.0, ``2**-7``, twice ``u``). In the bf16 forward every weight is rounded once (the
# shard is cast before the all-gather) and every activation after each operation; the loss is a
# smooth function of all of them, so its error is a weighted sum of relative errors no larger than
# ``u``. The bound this page enforces is **one rounding of the loss itself**: at every step
#
# .. math:: |L_\text{bf16} - L_\text{fp32}| \le u \cdot |L_\text{fp32}|
#
# i.e. the bf16 run must agree with the fp32 run to the precision in which bf16 can even write the
# loss down. Two facts keep a correct run far inside it. Rounding errors are as often up as down, so
# thousands of them add like a random walk, not in one direction. And the updates are applied to the
# fp32 shards, so the two runs are never separated by lost updates, only by gradients that differ at
# bf16's relative precision; over a short run like this one that does not compound. What the bound
# rejects is a run that no longer computes the same training step: a gradient summed instead of
# averaged doubles every SGD step and leaves it after one step (``tests/test_knobs.py`` shows it).
# The step-0 gap isolates the forward's rounding: both runs start from identical weights.
u = precision.unit_roundoff(BF16)
print(f"bf16: u = 2**-8 = {u:.6f} (finfo eps = {torch.finfo(BF16).eps:.6f}); "
      f"fp32: u = {precision.unit_roundoff(FP32):.2e}")
gaps, bounds = {}, {}
for name, (opt, param_dtype, _) in RUNS.items():
    losses = mean_over_ranks([r["losses"] for r in results[name]])
    run = f"FSDP2 x{WORLD_SIZE} {name}"
    if param_dtype == FP32:
        checks.assert_losses_match(run, REFERENCE[opt], losses)
        continue
    bounds[name] = precision.loss_gap_bound(REFERENCE[opt], param_dtype)
    worst = precision.assert_loss_gap_within(run, REFERENCE[opt], losses, bounds[name])
    gaps[name] = [abs(a - b) for a, b in zip(losses, REFERENCE[opt])]
    print(f"{name:<18} step-0 gap {gaps[name][0]:.1e} "
          f"({gaps[name][0] / bounds[name][0]:.1%} of u·L), "
          f"largest gap {max(gaps[name]):.1e}, at most {worst:.1%} of the bound")
print(f"fp32, SGD          matches the reference within {checks.LOSS_TOL:.0e} (no bf16 anywhere)")

fig = knob_plots.gap_vs_bound(gaps, bounds)
plt.show()

# %%
# Why the master weights stay fp32
# --------------------------------
# If the shards were stored in bf16, an update smaller than half the bf16 spacing around a weight
# would be rounded away. The worker kept the fp32 shards before the last step: this is the share of
# that step's changed elements that would have vanished in bf16 storage.
for name in ("bf16/fp32, SGD", "bf16/fp32, AdamW"):
    lost = [r["lost_in_bf16"] for r in results[name]]
    print(f"{name:<18} {min(lost):.0%}–{max(lost):.0%} of the last step's updates (per rank) "
          "would be lost in bf16 storage")
    if not min(lost) > 0:
        raise checks.CheckFailed(f"[master weights] FSDP2 x{WORLD_SIZE} {name}: no update would be "
                                 "lost in bf16 storage; the page's argument does not hold here.")
print("FSDP2 keeps fp32 shards (checked above), so none of these updates is lost; only the copy it "
      "all-gathers for compute is bf16.")
