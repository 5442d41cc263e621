"""
Mixed precision: what is bf16, and what stays fp32
==================================================

.. admonition:: Verdict
   :class: tip

   Use ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``: the
   all-gathers move :claim:`mixed_precision.bf16_fp32.sgd.all_gather_bytes <unit>` bytes, the
   gradients are still reduced in fp32, the shards stay fp32 master weights, and the loss stays
   inside one bf16 rounding of the fp32 run. Use ``reduce_dtype=torch.bfloat16`` only when the
   reduce-scatter is the bottleneck: it halves that traffic too, but sums gradients in bf16.
   Measured on CPU gloo processes (tiny models, two shared cores); this page predicts nothing.

``fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32))`` is the usual way to train in bf16 with FSDP2. It is easy to describe
it wrongly: a common summary says the parameters are "stored in bf16 at rest". They are not. This
page trains the same mini transformer in fp32 and in bf16 on gloo CPU ranks, looks at the dtype of
every tensor from inside the ranks, and **fails the docs build** unless:

* the sharded parameters stay **fp32 at rest** (they are the master weights the optimizer updates),
* the unsharded parameters each layer computes with in forward are **bf16** (seen by forward hooks),
* the reduce-scatter runs in ``reduce_dtype`` (the gradient that lands on the shard is fp32 by
  construction: torch accepts only a gradient of the parameter's own dtype, so the fp32 shard
  decides it and there is nothing separate to check),
* the bf16 loss curve stays within one bf16 rounding of the fp32 reference (a chosen tolerance,
  not a derived bound: see below).

The policy to copy comes first; then a question the rest depends on: can gloo, the CPU backend,
move bf16 at all?
"""

# %%
# The policy to copy: one per ``fully_shard`` call
# ------------------------------------------------
# Each block gets ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``. The root additionally gets
# ``output_dtype=torch.float32``: the logits leave the model in fp32, so the loss is computed from
# logits that were not rounded to bf16 on the way out (why on the root only: see below). The
# page's worker calls this very function.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def shard_mixed_precision(model: torch.nn.Module, mesh, param_dtype=torch.bfloat16,
                          reduce_dtype=torch.float32) -> torch.nn.Module:
    """``fully_shard`` every block and the root: compute in ``param_dtype``, reduce gradients
    in ``reduce_dtype``, keep fp32 shards (master weights), return fp32 logits."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                       output_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=root_policy)


# %%
# What gloo does with bf16
# ------------------------
# FSDP2 casts each shard to ``param_dtype`` *before* the all-gather and reduce-scatters gradients in
# ``reduce_dtype``, so the backend must run those collectives in bf16. Rather than trust a support
# table, every rank runs each collective on small integer-valued tensors (exact in bf16) and checks
# the result (:func:`guide.precision.collective_support`).
import math

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

import guide
from guide import checks, precision
from guide.comm import CollectiveLog
from guide.data import synthetic_batches
from guide.layout import dtype_name
from guide.model import ModelConfig, build_model
from guide.plotting import FLOOR, legend_below, style
from guide.report import show, table
from guide.training import make_optimizer, mean_over_ranks, train_steps
from guide.reference import reference_run

PAGE = guide.Page(section="Configure FSDP2", order=3, key_api="MixedPrecisionPolicy(",
                  world_size=2, supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
STEPS = 20
CFG = ModelConfig()
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab,
                            seed=0)


def probe(rank: guide.Rank) -> tuple[str, dict]:
    return rank.backend, {dtype_name(dt): precision.collective_support(dt)
                          for dt in (torch.bfloat16, torch.float32)}


# %%
# The worker
# ----------
# It shards with ``shard_mixed_precision`` (above). Without the root's ``output_dtype`` every logit
# would be rounded to bf16 (:claim:`bf16.significant_bits` significant bits) before the loss, and
# the page would partly be measuring the rounding of its own yardstick. ``output_dtype`` goes on
# the root only. On a block it would buy nothing: every
# ``fully_shard`` unit casts its floating inputs to its ``param_dtype`` before its forward
# (``cast_forward_inputs=True``, the default), so the next block would get bf16 again. Except after
# the last block: its fp32 output would go straight into the root's final LayerNorm, which computes
# with bf16 weights and is not behind a cast of its own (the root's cast ran once, on the token ids),
# and CPU LayerNorm refuses an fp32 input with bf16 weights. The page tries it (below, "Why
# ``output_dtype`` goes on the root only") and fails the build unless each step of this holds.
#
# During the first step, :class:`guide.precision.ForwardDtypes` hooks every layer and records the
# parameters it computes with, and :class:`guide.comm.CollectiveLog` records the dtype of every
# collective. Before the last step the worker keeps a copy of the fp32 shards, to ask afterwards how
# much of that step bf16 storage would have kept.


def mp_worker(rank: guide.Rank, optimizer: str, param_dtype: torch.dtype,
              reduce_dtype: torch.dtype) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = shard_mixed_precision(build_model(CFG, device=rank.device), mesh, param_dtype,
                                  reduce_dtype)
    opt = make_optimizer(optimizer, model.parameters())
    at_rest_before = precision.stored_dtypes(model)

    def train(batches):
        return train_steps(model, opt, batches, rank)

    with precision.ForwardDtypes(model) as fwd, CollectiveLog(model) as log:
        losses = train(BATCHES[:1])
    losses += train(BATCHES[1:-1])
    before = [p.detach().to_local().clone() for p in model.parameters()]
    losses += train(BATCHES[-1:])
    after = [p.detach().to_local() for p in model.parameters()]
    return {"losses": losses, "at_rest_before": at_rest_before,
            "at_rest_after": precision.stored_dtypes(model),
            "forward_params": fwd.params, "forward_kinds": fwd.param_kinds,
            "forward_shapes": fwd.param_shapes, "outputs": fwd.outputs,
            "collectives": log.records,
            "lost_in_bf16": precision.lost_update_fraction(before, after,
                                                           torch.bfloat16)}


# %%
# Four runs against the fp32 reference
# ------------------------------------
# SGD in fp32 (an all-fp32 policy: the baseline for bytes), SGD and AdamW with bf16 parameters and
# fp32 reduction (the recommended setting), and SGD with the reduction in bf16 too. The probe and the
# four runs go one after the other in the same ranks (one launch).
BF16, FP32 = torch.bfloat16, torch.float32
RUNS = {  # name: (optimizer, param_dtype, reduce_dtype)
    "fp32, SGD": ("sgd", FP32, FP32),
    "bf16/fp32, SGD": ("sgd", BF16, FP32),
    "bf16/fp32, AdamW": ("adamw", BF16, FP32),
    "bf16/bf16, SGD": ("sgd", BF16, BF16),
}


def output_dtype_on_blocks(rank: guide.Rank) -> dict:
    """One forward with ``output_dtype=torch.float32`` on every block too: the dtype
    each block returns, the dtype each block's forward receives (after FSDP2's input
    cast, whose hook runs first), the dtype the root's final LayerNorm receives, and the
    error the forward raised."""
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32,
                                  output_dtype=FP32)
    seen = {}

    def record(key):  # a hook that records its tensor's dtype and changes nothing
        def hook(_module, args, *output) -> None:
            seen.setdefault(key, dtype_name((output or args)[0].dtype))
        return hook

    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh, mp_policy=policy)
        block.register_forward_pre_hook(record(f"blocks.{i} input"))
        block.register_forward_hook(record(f"blocks.{i} output"))
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.ln_f.register_forward_pre_hook(record("ln_f input"))
    try:
        model(BATCHES[0][:2, :-1].to(rank.device))
        error = None
    except RuntimeError as err:
        error = str(err).strip().splitlines()[0]
    return {"dtypes": seen, "error": error}


def worker(rank: guide.Rank) -> dict:
    return {"probe": probe(rank),
            "output_dtype_on_blocks": output_dtype_on_blocks(rank),
            **{name: mp_worker(rank, *cfg) for name, cfg in RUNS.items()}}


def claim_key(run: str) -> str:
    """``"bf16/fp32, SGD"`` -> ``"mixed_precision.bf16_fp32.sgd"``, for claim names."""
    return "mixed_precision." + run.replace("/", "_").replace(", ", ".").lower()


SETUP = dict(model="tinylm-main", world_size=WORLD_SIZE, steps=STEPS)


per_rank = guide.launch(worker, WORLD_SIZE)
results = {name: [r[name] for r in per_rank] for name in RUNS}
REFERENCE = {opt: reference_run(CFG, opt, BATCHES)[0] for opt in ("sgd", "adamw")}

# %%
# gloo's answer, from rank 0: every collective FSDP2 needs, in bfloat16 and float32.
backend, support = per_rank[0]["probe"]
show(table([[op, *(support[dt][op] for dt in support)] for op in support["bfloat16"]],
            ["collective", *support]))
for op, result in support["bfloat16"].items():
    checks.expect("gloo bf16", f"{backend} x{WORLD_SIZE}", result == "ok",
                  f"{op} in bfloat16: {result}; the bf16 runs below depend on it.")
# A count of the table's rows, each checked "ok" just above: computed (no other value to match).
exact = PAGE.state(f"{backend}.bf16.collectives_exact", len(support["bfloat16"]),
                   "collectives", world_size=WORLD_SIZE)
print(f"\n{backend} ran every collective FSDP2 needs in bfloat16 ({exact} of them), "
      "with exact results.")

# %%
# The dtypes, checked
# -------------------
# On every rank and for every parameter: the sharded parameter is fp32 before and after training
# (so its gradient is fp32 too: torch refuses any other), and what each layer computes with in
# forward is an unsharded (plain, full-shape) tensor in ``param_dtype``. Block outputs are
# ``param_dtype``; the root's output (the logits) is fp32 because of ``output_dtype``.
full_shapes = {name: tuple(p.shape) for name, p in build_model(CFG).named_parameters()}
for name, (_, param_dtype, reduce_dtype) in RUNS.items():
    for r, res in enumerate(results[name]):
        run = f"FSDP2 x{WORLD_SIZE} {name}, rank {r}"
        precision.assert_dtypes(run, "sharded parameters at rest, before training",
                                res["at_rest_before"], FP32)
        precision.assert_dtypes(run, "sharded parameters at rest, after training",
                                res["at_rest_after"], FP32)
        precision.assert_dtypes(run, "parameters used in forward",
                                res["forward_params"], param_dtype)
        sharded_in_forward = sorted(
            p for p, k in res["forward_kinds"].items()
            if k != "Tensor" or res["forward_shapes"][p] != full_shapes[p])
        checks.expect("dtype", run, not sharded_in_forward, "parameters used in "
                      "forward were not the unsharded full tensors: "
                      f"{sharded_in_forward[:3]}.")
        blocks = {m: d for m, d in res["outputs"].items()
                  if m.startswith("blocks.") and m.count(".") == 1}
        precision.assert_dtypes(run, "block outputs", blocks, param_dtype)
        precision.assert_dtypes(run, "root output (logits)", {"": res["outputs"][""]},
                                FP32)

sample = results["bf16/fp32, SGD"][0]
SHOWN = ("tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.ln1.weight", "head.weight")
show(table([[p, dtype_name(sample["at_rest_after"][p]),
              dtype_name(sample["forward_params"][p]), str(sample["forward_shapes"][p])]
             for p in SHOWN],
            ["parameter", "at rest (shard)", "in forward", "forward shape"]))

# %%
# Why ``output_dtype`` goes on the root only
# ------------------------------------------
# Each rank also ran one forward with ``output_dtype=torch.float32`` on every block. Each block
# returned fp32, and yet each block's forward received bf16: FSDP2 cast it on the way in. The
# root's final LayerNorm, which no cast precedes, received the last block's fp32 output.
od = per_rank[0]["output_dtype_on_blocks"]
PLACES = {"block outputs": "output", "block inputs (after FSDP2's cast)": "input"}
seen = {place: sorted({od["dtypes"][f"blocks.{i} {key}"] for i in range(CFG.n_layers)})
        for place, key in PLACES.items()} | {"ln_f input": [od["dtypes"]["ln_f input"]]}
WANT = {"block outputs": ["float32"], "block inputs (after FSDP2's cast)": ["bfloat16"],
        "ln_f input": ["float32"]}
checks.expect("output_dtype", "output_dtype on every block", seen == WANT,
              f"observed {seen}, expected {WANT}.")
checks.expect("output_dtype", "CPU", od["error"] is not None or backend != "gloo",
              "the forward ran: CPU LayerNorm took an fp32 input with bf16 weights.")
ON_BLOCKS = dict(model="tinylm-main", param_dtype="bfloat16",
                 output_dtype="float32 on blocks", cast_forward_inputs=True)
KEYS = ("block_outputs", "block_inputs", "ln_f_input")
# dtype names, compared with WANT by the check above; the ledger keeps a string as computed.
show(table([[place, PAGE.state(f"mixed_precision.output_dtype_on_blocks.{key}",
                               ", ".join(dtypes), "dtype", **ON_BLOCKS)]
             for (place, dtypes), key in zip(seen.items(), KEYS)],
            ["where", "dtype"]))
print(f"\nThe forward then stopped in ln_f: {od['error'] or 'it ran (not on CPU)'}")

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
        dtypes = sorted({c.dtype for c in recs if c.kind == kind})
        checks.expect("wire dtype", f"FSDP2 x{WORLD_SIZE} {name}",
                      dtypes == [dtype_name(want)],
                      f"{kind} ran in {dtypes}, expected {want}.")
        wire[name, kind] = (sum(c.kind == kind for c in recs),
                            sum(c.bytes for c in recs if c.kind == kind))
PAGE.show("mixed_precision.wire", [[name, *wire[name, "all_gather"], *wire[name, "reduce_scatter"]]
              for name in RUNS],
             ["run", "all-gathers", "AG bytes", "reduce-scatters", "RS bytes"],
             keys=[claim_key(name).removeprefix("mixed_precision.") for name in RUNS],
             model="tinylm-main", world_size=WORLD_SIZE, step="first, rank 0")

# %%
# Relative to the fp32 run, checked against the dtypes' sizes:
KINDS = ("all_gather", "reduce_scatter")
base = [wire["fp32, SGD", kind][1] for kind in KINDS]
for name, said in (("bf16/fp32, SGD", (0.5, 1.0)), ("bf16/bf16, SGD", (0.5, 0.5))):
    got = tuple(wire[name, kind][1] / b for kind, b in zip(KINDS, base))
    checks.expect("wire bytes", f"FSDP2 x{WORLD_SIZE} {name}", got == said,
                  f"all-gather and reduce-scatter bytes are {got} of fp32's, expected "
                  f"{said}.")
    for kind, ratio, want in zip(KINDS, got, said):
        PAGE.check(f"{claim_key(name)}.{kind}_bytes", checks.expect_close(
            "wire bytes", f"FSDP2 x{WORLD_SIZE} {name}", ratio, want, 0,
            against="the dtypes' sizes"), "× fp32's", model="tinylm-main", world_size=WORLD_SIZE)
PAGE.conclude("bf16 parameters halve the all-gather bytes; only a bf16 reduce_dtype "
              "halves the reduce-scatter.")

# %%
# How close must the bf16 loss be?
# --------------------------------
# bf16 keeps :claim:`bf16.significant_bits` significant bits (one of them implicit), so
# rounding a number ``x`` to bf16 moves it by at most ``u·|x|``, with unit roundoff
# ``u = 2**-8`` (``torch.finfo(torch.bfloat16).eps`` is the spacing above one, ``2**-7``,
# twice ``u``). In the bf16 forward every weight is rounded once (the
# shard is cast before the all-gather) and every activation after each operation; the loss is a
# smooth function of all of them, so to first order its error is a weighted sum of those relative
# errors. That sum has no small worst case (the classic bound grows with the number of operations,
# ``n·u``), so what this page enforces is **a chosen tolerance, not a derived bound**: one rounding
# of the loss itself, at every step
#
# .. math:: |L_\text{bf16} - L_\text{fp32}| \le u \cdot |L_\text{fp32}|
#
# i.e. the bf16 run must agree with the fp32 run to the precision in which bf16 can even write the
# loss down. It is a heuristic: it is justified by what it accepts and rejects, measured here and
# in ``tests/test_precision.py``, not by a proof. Two facts keep a correct run far inside it.
# Rounding errors are as often up as down, so thousands of them add like a random walk, not in one
# direction. And the updates are applied to the fp32 shards, so the two runs are never separated
# by lost updates, only by gradients that differ at bf16's relative precision; over a short run
# like this one that does not compound. What the bound rejects is a run that no longer computes
# the same training step: a gradient summed instead of averaged doubles every SGD step and leaves
# it after one step (``tests/test_precision.py`` shows it).
# The step-0 gap isolates the forward's rounding: both runs start from identical weights.
u = precision.unit_roundoff(BF16)
checks.expect("unit roundoff", "bfloat16", u == 2**-8, f"u = {u}, not 2**-8.")
u = PAGE.check("bf16.unit_roundoff", checks.expect_close(
    "unit roundoff", "bfloat16", u, torch.finfo(BF16).eps / 2, 0,
    against="torch.finfo(bfloat16).eps / 2"), "relative")
bits = PAGE.check("bf16.significant_bits", checks.expect_close(
    "bf16 format", "bfloat16", 1 - math.log2(torch.finfo(BF16).eps), 8, 0,
    against="bfloat16's format: 7 stored fraction bits + 1 implicit"), "bits", fmt=".0f")
eps = PAGE.state("bf16.finfo_eps", torch.finfo(BF16).eps, "relative",
                 guard="cited: torch.finfo(torch.bfloat16).eps", fmt=".6f")
u32 = PAGE.check("fp32.unit_roundoff", checks.expect_close(
    "unit roundoff", "float32", precision.unit_roundoff(FP32), torch.finfo(FP32).eps / 2, 0,
    against="torch.finfo(float32).eps / 2"), "relative", fmt=".2e")
print(f"bf16: {bits:.0f} significant bits, u = {u:.6f} (finfo eps = {eps:.6f}); "
      f"fp32: u = {u32:.2e}")
gaps, bounds, rows = {}, {}, []
for name, (opt, param_dtype, _) in RUNS.items():
    losses = mean_over_ranks([r["losses"] for r in results[name]])
    run = f"FSDP2 x{WORLD_SIZE} {name}"
    if param_dtype == FP32:
        checks.assert_losses_match(run, REFERENCE[opt], losses, against=checks.SINGLE_PROCESS)
        continue
    bounds[name] = precision.loss_gap_bound(REFERENCE[opt], param_dtype)
    worst = precision.assert_loss_gap_within(run, REFERENCE[opt], losses, bounds[name])
    gaps[name] = [abs(a - b) for a, b in zip(losses, REFERENCE[opt])]
    rows.append([name, gaps[name][0], gaps[name][0] / bounds[name][0], max(gaps[name]),
                 checks.expect_order("loss gap bound", run, worst, 1.0,
                                     low_name="largest gap / u·L", high_name="1",
                                     strict=False)])
loss_tol = PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats")
print(f"fp32, SGD matches the reference within {loss_tol:.0e} (no bf16 anywhere).")
PAGE.show("mixed_precision.loss_gap", rows,
          ["run", "step-0 gap", "of u·L", "largest gap", "of the bound, at most"],
          formats={"step-0 gap": ".1e", "of u·L": ".1%", "largest gap": ".1e",
                   "of the bound, at most": ".1%"},
          keys=[claim_key(name).removeprefix("mixed_precision.") for name in gaps], **SETUP)

# %%
# The same, drawn: ``|loss - fp32 reference|`` per step for each bf16 run (solid, log scale), and
# that run's allowed gap (dashed, same colour); a zero gap is drawn at the floor.
RUN_COLORS = {"bf16/fp32, SGD": "#d62728", "bf16/fp32, AdamW": "#9467bd",
              "bf16/bf16, SGD": "#ff7f0e"}
style()
fig, ax = plt.subplots(figsize=(7.5, 5.0))
for name, gap in gaps.items():
    steps = range(len(gap))
    ax.plot(steps, [max(g, FLOOR) for g in gap], "o-", color=RUN_COLORS[name], ms=4,
            lw=1.4, label=f"{name}: |gap|")
    ax.plot(steps, bounds[name], "--", color=RUN_COLORS[name], lw=1.2, alpha=0.8,
            label=f"{name}: bound u·L")
ax.set_yscale("log")
ax.set_xlabel("training step")
ax.set_ylabel("|loss − fp32 loss| (nats/token)")
ax.set_title("bf16 compute stays inside one bf16 rounding of the loss")
legend_below(fig)
ax.set_ylim(bottom=min((g for gap in gaps.values() for g in gap if g > 0),
                      default=FLOOR) / 3)
ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# Why the master weights stay fp32
# --------------------------------
# If the shards were stored in bf16, an update smaller than half the bf16 spacing around a weight
# would be rounded away. The worker kept the fp32 shards before the last step: this is the share of
# that step's changed elements that would have vanished in bf16 storage.
lost = {name: [r["lost_in_bf16"] for r in results[name]]
        for name in ("bf16/fp32, SGD", "bf16/fp32, AdamW")}
for name, per_rank_lost in lost.items():
    checks.expect("master weights", f"FSDP2 x{WORLD_SIZE} {name}",
                  min(per_rank_lost) > 0,
                  "no update would be lost in bf16 "
                  "storage; the page's argument does not hold here.")
def lost_share(name: str, end: str) -> float:
    """The min over ranks is ordered above 0 (the argument needs a loss); the max has no
    independent value and stays computed."""
    share, claim = (min if end == "min" else max)(lost[name]), f"{claim_key(name)}.lost_in_bf16"
    if end == "max":
        return PAGE.state(f"{claim}.max", round(share, 2), "fraction of changed elements", **SETUP)
    return PAGE.check(f"{claim}.min", checks.expect_order(
        "master weights", f"FSDP2 x{WORLD_SIZE} {name}", 0.0, share, low_name="0",
        high_name="share lost in bf16, min over ranks", keep="high"),
        "fraction of changed elements", fmt=".2f", **SETUP)


show(table([[name, lost_share(name, "min"), lost_share(name, "max")] for name in lost],
            ["run", "lost in bf16, min over ranks", "max over ranks"],
            formats={"lost in bf16, min over ranks": ".0%", "max over ranks": ".0%"},
            title="Share of the last step's updates that bf16 storage would lose"))
print("FSDP2 keeps fp32 shards (checked above), so none of these updates is lost; only "
      "the copy it all-gathers for compute is bf16.")

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
