"""
HSDP: shard inside a node, replicate across nodes
=================================================

.. admonition:: Verdict
   :class: tip

   Use HSDP instead of FSDP2 when the model state fits in a shard group (one node, or a few) and
   the links between nodes are the bottleneck: only one all-reduce of gradient shards crosses the
   nodes. The price is memory: a rank holds :claim:`hsdp.2x2.model_state_per_rank <unit>` here,
   against FSDP2's :claim:`tinylm.main.fsdp2.model_state_per_rank <unit>` over all ranks. With
   gradient accumulation add ``set_requires_all_reduce(False)``: the cross-node traffic then falls
   to one all-reduce per optimizer step. Stay with FSDP2 when the state does not fit a shard group.
   Measured on CPU gloo processes (tiny models, two shared cores); bytes on the wire are priced by
   the ring model, not measured, and labelled so.

Large FSDP2 runs often do not shard over every GPU. They use *hybrid sharding* (HSDP): a 2-D device
mesh whose inner dimension shards each parameter over the GPUs of one node, where NVLink is fast (or
of a few nodes, when one node cannot hold the model's shards), and whose outer dimension replicates
those shards across nodes, as DDP would. Each step then all-gathers and reduce-scatters only inside
a shard group; what crosses between the replicas is one all-reduce of each gradient *shard*. The
price is memory: a rank holds the model state divided by the GPUs of its shard group, not by all
the GPUs.

The mesh is the whole API: ``fully_shard(module, mesh=mesh)`` with a 2-D mesh is HSDP. This page
builds it on 4 CPU ranks as a ``(2, 2)`` mesh (two "nodes" of two ranks) and **fails the docs build**
unless:

1. every parameter on every rank is a ``DTensor`` placed ``(Replicate(), Shard(dim=0))`` whose local
   shard is its shard position's chunk of dim 0;
2. the ranks holding the same shard in the two replicas hold equal shards after every step;
3. training matches one process on the full batch, with SGD and AdamW, at the main page's tolerances;
4. each rank holds the model state of FSDP2 over its shard group, to the byte the model predicts;
5. each step issues exactly the collectives the model lists, inside the shard group and across the
   replicas;
6. under gradient accumulation, ``set_requires_all_reduce(False)`` skips only the cross-replica
   all-reduce and ``set_requires_gradient_sync(False)`` skips the reduce-scatter too.

When HSDP beats plain FSDP2 on real clusters is a question of link speeds, ring lengths and
gradient accumulation; the
:ref:`step-time estimates page <sphx_glr_auto_examples_plot_step_time_estimates.py>` estimates it
(from link rates, not measured) for Llama-3-70B on H100 nodes.
"""

# %%
# The code to copy: the mesh
# --------------------------
# ``init_device_mesh(device, (2, 2), mesh_dim_names=("replicate", "shard"))`` arranges the ranks
# row-major: rank 0 and rank 1 form replica 0, rank 2 and rank 3 replica 1, and rank 0 and rank 2
# hold the same shard. ``mesh["shard"]`` is the 2-rank group a rank all-gathers and reduce-scatters with (inside
# a node), ``mesh["replicate"]`` the group it all-reduces gradient shards with (across nodes). Under
# ``torchrun`` with more ranks the shard dimension grows: ``--nproc-per-node=8`` makes a ``(2, 4)``
# mesh. The rest is FSDP2 as usual: ``fully_shard`` on each block, then on the root, with the 2-D mesh.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def apply_hsdp(model: torch.nn.Module, replicas: int, shards: int,
               device_type: str = "cpu") -> torch.nn.Module:
    """Shard ``model`` over ``shards`` ranks, replicated ``replicas`` times (HSDP)."""
    mesh = init_device_mesh(device_type, (replicas, shards),
                            mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# %%
# The setup: 4 ranks as two "nodes" of two, the main page's model and its single-process reference.
import dataclasses

import matplotlib.pyplot as plt

import guide
from guide import checks, comm, plotting, report
from guide.comm import CollectiveLog
from guide.data import micro_batches, rank_slice, synthetic_batches
from guide.layout import full_state, local_tensor, param_layouts
from guide.memory import StateBytes, measure, param_shapes, state_bytes_by_rank
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, mean_over_ranks, next_token_loss, train_steps
from guide.reference import reference_run

PAGE = guide.Page(section="Operate: checkpoints, clusters", order=1, key_api="init_device_mesh(",
                  world_size=4, supports=(4, 8),
                  why="HSDP needs a 2-D mesh, 2 replicas x N/2 shards: an even N >= 4")
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
REPLICAS = 2
SHARDS = WORLD_SIZE // REPLICAS
STEPS = 4
# the main page's model
CFG = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256)
BATCHES = synthetic_batches(steps=STEPS, batch_size=4 * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab, seed=0)  # 4 sequences per rank
REFERENCE = {opt: reference_run(CFG, opt, BATCHES) for opt in ("sgd", "adamw")}
PARAMS = PAGE.state("tinylm.main.params",
                    sum(p.numel() for p in build_model(CFG).parameters()),
                    "parameters", model=repr(CFG))
HSDP = dict(model="tinylm-main", world_size=WORLD_SIZE, replicas=REPLICAS,
            shards=SHARDS, global_batch=BATCHES.shape[1], steps_counted=STEPS - 1)
print(f"{WORLD_SIZE} ranks as a {REPLICAS} x {SHARDS} mesh (replicate, shard); {STEPS} "
      f"global batches of {BATCHES.shape[1]} sequences; the main page's model, "
      f"{PARAMS:,} parameters")


def hsdp_model(rank: guide.Rank) -> torch.nn.Module:
    return apply_hsdp(build_model(CFG, device=rank.device), REPLICAS, SHARDS, rank.device.type)


# %%
# Training, and what each rank keeps
# ----------------------------------
# The training step is the plain loop of every page (:func:`guide.training.train_steps`): each rank
# takes its own 1/N slice of every global batch. After every step the worker keeps a copy of its local
# shards, so that the two replicas can be compared step by step. The second step onwards runs inside
# :class:`guide.comm.CollectiveLog`, which records every collective and the size of the group it
# spans; after the last step :func:`guide.memory.measure` reads the bytes of parameters, gradients
# and optimizer state the rank holds.


def train(model, opt, rank: guide.Rank,
          batches: torch.Tensor) -> tuple[list[float], list[dict]]:
    """This rank's loss per step, and its local shards after each step."""
    losses, shards = [], []
    for batch in batches:
        losses += train_steps(model, opt, batch[None], rank)
        shards.append({n: local_tensor(p).detach().clone()
                       for n, p in model.named_parameters()})
    return losses, shards


@dataclasses.dataclass(frozen=True)
class HSDPRun:
    """One rank's HSDP training run: losses, its local shards after each step, the full parameters,
    the state it holds, its layouts, the collectives after step 1, its mesh coordinate."""

    losses: list[float]
    shards: list[dict]
    params: dict
    state: StateBytes  # guide.memory.measure's record
    layouts: list
    collectives: list
    coordinate: tuple


@dataclasses.dataclass(frozen=True)
class AccumulationRun:
    """One rank's accumulation run: losses, full parameters, collectives after step 0."""

    losses: list[float]
    params: dict
    collectives: list


def training_run(rank: guide.Rank, optimizer: str) -> HSDPRun:
    model = hsdp_model(rank)
    opt = make_optimizer(optimizer, model.parameters())  # after fully_shard: DTensors
    losses, shards = train(model, opt, rank, BATCHES[:1])
    with CollectiveLog(model) as log:
        more_losses, more_shards = train(model, opt, rank, BATCHES[1:])
    return HSDPRun(losses + more_losses, shards + more_shards, full_state(model),
                   measure(model, opt), param_layouts(model, rank.rank), log.records,
                   tuple(next(model.parameters()).device_mesh.get_coordinate()))


# %%
# Gradient accumulation: two switches
# -----------------------------------
# Accumulating ``K`` micro-batches per optimizer step, HSDP can skip work on the first ``K - 1``:
#
# * ``model.set_requires_all_reduce(False)``: reduce-scatter inside the shard group as usual, but
#   keep the reduced shards and all-reduce them across the replicas only on the last micro-batch.
#   Gradients stay sharded; only the traffic between nodes is saved.
# * ``model.set_requires_gradient_sync(False)``: no reduction at all until the last micro-batch;
#   each rank accumulates *unsharded* gradients, as the gradient-accumulation page measures.
#
# Both flags apply to every ``fully_shard`` module under ``model``, and both must be set back to
# ``True`` for the last micro-batch. Left at ``False`` for every step, ``set_requires_all_reduce``
# trains nothing, silently: FSDP2 keeps the reduce-scattered shards in a buffer of its own until an
# all-reduce runs (``foreach_reduce`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``),
# so ``.grad`` stays empty and the optimizer skips every parameter (``tests/test_hsdp.py`` shows the
# parameters never move). Each loss is divided by ``K``, so
# ``K`` micro-batches of a ``K``-th of the batch make one step on the whole batch: the same
# reference.
K = 4
MICRO = micro_batches(BATCHES, K)  # (steps, K, batch / K, T + 1): one sequence per rank
SKIPS = {"sync every micro-batch": None,
         "set_requires_all_reduce(False)": "all_reduce",
         "set_requires_gradient_sync(False)": "gradient_sync"}


def accumulation_step(model, opt, step_micro: torch.Tensor, rank: guide.Rank,
                      skip: str | None):
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    for m, micro in enumerate(step_micro):
        last = m == K - 1
        if skip == "all_reduce":
            model.set_requires_all_reduce(last)
        elif skip == "gradient_sync":
            model.set_requires_gradient_sync(last)
        tokens = rank_slice(micro, rank.rank, rank.world_size)
        micro_loss = next_token_loss(model, tokens) / K
        micro_loss.backward()
        loss += micro_loss.item()
    opt.step()
    return loss


def accumulation_run(rank: guide.Rank, skip: str | None) -> AccumulationRun:
    model = hsdp_model(rank)
    opt = make_optimizer("sgd", model.parameters())
    losses = [accumulation_step(model, opt, MICRO[0], rank, skip)]
    with CollectiveLog(model) as log:
        losses += [accumulation_step(model, opt, step, rank, skip)
                   for step in MICRO[1:]]
    return AccumulationRun(losses, full_state(model), log.records)


# %%
# One job runs everything: the two training runs, then the three accumulation runs, on the same
# ranks (:func:`guide.launch` starts them once).


def all_runs(rank: guide.Rank) -> dict:
    runs = {opt: training_run(rank, opt) for opt in ("sgd", "adamw")}
    runs |= {name: accumulation_run(rank, skip) for name, skip in SKIPS.items()}
    return runs


per_rank = guide.launch(all_runs, WORLD_SIZE)
results = {name: [r[name] for r in per_rank] for name in per_rank[0]}

# %%
# 1. Placement, replicas and equivalence
# --------------------------------------
# Every parameter must be a ``DTensor`` placed ``(Replicate(), Shard(dim=0))`` holding the rows of
# its shard position (:func:`guide.checks.assert_hsdp_sharded`); the two ranks at each shard
# position must hold equal shards after every step (:func:`guide.checks.assert_replicas_identical`);
# the global loss of every step and the final parameters must match the single-process reference
# within :data:`guide.checks.LOSS_TOL` and :data:`guide.checks.PARAM_TOL`; and the reference must
# learn (:func:`guide.checks.assert_learns`), so that agreeing with it means something. The checks
# take rank ``r`` to sit at ``(r // SHARDS, r % SHARDS)`` on the mesh; each rank's mesh says so first.
coordinates = [r.coordinate for r in results["sgd"]]  # (replica, shard), by mesh
checks.expect("HSDP mesh", "init_device_mesh",
              coordinates == [(r // SHARDS, r % SHARDS) for r in range(WORLD_SIZE)],
              f"ranks sit at {coordinates}, not row-major as the checks assume")


def measured(name: str, value: float, unit: str, check: str) -> float:
    """Record a measured number as printed (a gap: 2 digits), with its check."""
    if isinstance(value, checks.Checked):  # a gap: guarded by the check that measured it
        return PAGE.check(name, value, unit, fmt=".1e", steps=STEPS, **HSDP)
    return PAGE.state(name, value, unit, steps=STEPS, **HSDP)  # a count: computed


rows = []
for opt in ("sgd", "adamw"):
    run, ranks = f"HSDP {REPLICAS}x{SHARDS}, {opt}", results[opt]
    ref_losses, ref_params = REFERENCE[opt]
    checks.assert_learns(f"reference, {opt}", ref_losses)
    checks.assert_hsdp_sharded(run, [lay for r in ranks for lay in r.layouts],
                               REPLICAS, SHARDS)
    compared = checks.assert_replicas_identical(run, [r.shards for r in ranks],
                                                REPLICAS, SHARDS)
    losses = mean_over_ranks([r.losses for r in ranks])
    dloss = checks.assert_losses_match(run, ref_losses, losses, against=checks.SINGLE_PROCESS)
    dparam = checks.assert_params_match(run, ref_params, ranks[0].params,
                                        checks.PARAM_TOL[opt], against=checks.SINGLE_PROCESS)
    rows.append({
        "run": run,
        "shards compared": measured(f"hsdp.{opt}.shards_compared", compared, "shards",
                                    "HSDP replicas"),
        "max |Δloss|": measured(f"hsdp.{opt}.loss_gap", dloss, "nats",
                                "loss equivalence"),
        "loss tol": PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats"),
        "max |Δparam|": measured(f"hsdp.{opt}.param_gap", dparam, "absolute",
                                 "parameter equivalence"),
        "param tol": PAGE.state(f"tolerance.param.{opt}", checks.PARAM_TOL[opt],
                                "absolute")})
report.show(report.table(
    rows, formats={"max |Δloss|": ".1e", "loss tol": ".0e", "max |Δparam|": ".1e",
                   "param tol": ".0e"}))

# %%
# Where each parameter's rows live: the local shard shapes on every rank, with the rank's
# coordinate as its own mesh reports it.
layout = {(lay.name, lay.rank): lay for r in results["sgd"] for lay in r.layouts}
report.show(report.table(
    [[name, str(layout[name, 0].global_shape), layout[name, 0].placements,
      *(str(layout[name, r].local_shape) for r in range(WORLD_SIZE))]
     for name in ("tok_emb.weight", "blocks.0.qkv.weight", "blocks.0.ln1.bias")],
    ["parameter", "global", "placements",
     *(f"rank {r} {coordinates[r]}" for r in range(WORLD_SIZE))],
    title="Local shard shapes; each rank's (replica, shard) coordinate from its mesh"))

# %%
# 4. Memory: FSDP2 over the shard group
# -------------------------------------
# Sharding happens only inside a shard group, so a rank holds what FSDP2 over ``SHARDS`` ranks would
# hold: :func:`guide.memory.state_bytes_by_rank` for ``"fsdp2"`` at ``SHARDS`` ranks, rank ``r``
# taking the share of shard position ``r % SHARDS``. The measured bytes must equal it exactly (AdamW:
# parameters, gradients, two moments and a ``step`` per parameter). The predictions for DDP and for
# plain FSDP2 over all ranks are printed for comparison; "model state" leaves DDP's gradient
# buckets out, "total" counts them.
shapes = param_shapes(build_model(CFG))
ADAMW = ("fp32", "adamw")
predicted = state_bytes_by_rank(shapes, "fsdp2", SHARDS, *ADAMW, ddp_buckets=False)
for r, result in enumerate(results["adamw"]):
    got, want = result.state, predicted[r % SHARDS]
    checks.expect("HSDP memory", f"rank {r}", got == want,
                  f"measured {got}, model {want}")

adamw = dict(model="tinylm-main", precision="fp32", optimizer="adamw",
             world_size=WORLD_SIZE)
ddp = state_bytes_by_rank(shapes, "ddp", WORLD_SIZE, *ADAMW, ddp_buckets=True)
fsdp2 = state_bytes_by_rank(shapes, "fsdp2", WORLD_SIZE, *ADAMW, ddp_buckets=False)
hsdp = results["adamw"][0].state
compare = {  # label: (claim, bytes held by rank 0)
    "DDP (predicted)": ("tinylm.main.ddp", ddp[0]),
    f"HSDP {REPLICAS}x{SHARDS} (measured, rank 0)": (f"hsdp.{REPLICAS}x{SHARDS}", hsdp),
    f"FSDP2 x{WORLD_SIZE} (predicted)": ("tinylm.main.fsdp2", fsdp2[0])}


def state_claim(name: str, what: str, held: StateBytes) -> int:
    """Rank 0's bytes: HSDP's measured, matched exactly to FSDP2 over the shard group; the
    others predicted (computed)."""
    value = getattr(held, what)
    claim = f"{name}.{'model_state' if what == 'model_state' else 'total_with_buckets'}_per_rank"
    if held is not hsdp:
        return PAGE.state(claim, value, "bytes", **adamw)
    return PAGE.check(claim, checks.expect_close(
        "HSDP memory", "rank 0", value, getattr(predicted[0], what), 0, what=what, unit="bytes",
        against=f"guide.memory.state_bytes_by_rank('fsdp2', {SHARDS})"), **adamw)


PAGE.show("hsdp.state",
          [[label, s.params, s.grads, s.optimizer, state_claim(name, "model_state", s),
            s.buckets, state_claim(name, "total", s) if s.buckets else s.total]
           for label, (name, s) in compare.items()],
          ["AdamW, per rank (bytes)", "params", "grads", "optimizer", "model state", "DDP buckets",
           "total"], formats={"model state": ",.0f", "total": ",.0f"},
          keys=["ddp", "hsdp", "fsdp2"], **adamw)
PAGE.conclude(f"Measured = model on all {WORLD_SIZE} ranks: each holds the model state of "
              f"FSDP2 over its shard group of {SHARDS} ranks.")

# %%
# 5. Communication: inside the shard group, and across the replicas
# -----------------------------------------------------------------
# :func:`guide.comm.hsdp_step` lists one step's collectives from the parameter shapes: FSDP2's
# all-gathers and reduce-scatters over the ``SHARDS`` ranks of the shard group, then one all-reduce
# per ``fully_shard`` unit over the ``REPLICAS`` ranks holding the same shard, of the reduced shard
# only: ``1/SHARDS`` of the unit's gradients. :func:`guide.checks.check_volume` compares elements
# and calls per step with rank 0's records; the group each collective spanned must match too.
groups = comm.fsdp2_groups(build_model(CFG))  # the root (kept for backward), each block
HSDP_STEP = comm.hsdp_step(groups, SHARDS, REPLICAS)


def spans(records) -> set[tuple[str, int]]:
    return {(c.kind, c.group_size) for c in records}


records = results["sgd"][0].collectives
checks.check_volume(f"HSDP {REPLICAS}x{SHARDS}", records, HSDP_STEP, STEPS - 1,
                    exact_calls=("all_gather", "reduce_scatter", "all_reduce"))
checks.expect("HSDP groups", "rank 0", spans(records) == spans(HSDP_STEP),
              f"collectives spanned {sorted(spans(records))}, "
              f"model {sorted(spans(HSDP_STEP))}")


def counted(kind: str) -> list[int]:
    """Rank 0's calls and elements of ``kind`` per step, each matched exactly to the model's
    list (:func:`guide.comm.hsdp_step`) and recorded with that check."""
    model = [c for c in HSDP_STEP if c.kind == kind]
    calls = sum(c.kind == kind for c in records) / (STEPS - 1)
    numel = sum(c.numel for c in records if c.kind == kind) / (STEPS - 1)
    run, against = f"HSDP {REPLICAS}x{SHARDS}, rank 0, {kind}", "guide.comm.hsdp_step"
    return [PAGE.check(f"hsdp.step.{kind}.calls", checks.expect_close(
                "comm calls", run, calls, len(model), 0, what="calls per step", unit="calls",
                against=against), fmt=".0f", **HSDP),
            PAGE.check(f"hsdp.step.{kind}.elements", checks.expect_close(
                "comm volume", run, numel, sum(c.numel for c in model), 0,
                what="elements per step", unit="elements", against=against), fmt=",.0f", **HSDP)]


report.show(report.table(
    [[kind, ranks, *counted(kind), sum(c.numel for c in HSDP_STEP if c.kind == kind)]
     for kind, ranks in sorted(spans(HSDP_STEP))],
    ["collective", "group size", "calls", "elements (measured)", "elements (model)"],
    title=f"One step on rank 0 ({STEPS - 1} steps counted)"))

# %%
# 6. Gradient accumulation, counted
# ---------------------------------
# Per optimizer step of ``K`` micro-batches the model is: syncing every micro-batch, ``K`` HSDP
# steps; skipping the all-reduce, ``K - 1`` FSDP2 steps inside the shard group plus one HSDP step;
# skipping gradient sync, the all-gathers of ``K - 1`` steps plus one HSDP step. All three must
# also train to the reference's parameters.
FSDP2_STEP = comm.fsdp2_step(groups, SHARDS)
GATHERS = [c for c in FSDP2_STEP if c.kind == "all_gather"]
ACCUMULATION_MODEL = {
    "sync every micro-batch": K * HSDP_STEP,
    "set_requires_all_reduce(False)": (K - 1) * FSDP2_STEP + HSDP_STEP,
    "set_requires_gradient_sync(False)": (K - 1) * GATHERS + HSDP_STEP,
}
ref_losses, ref_params = REFERENCE["sgd"]
sent = {}
for name, expected in ACCUMULATION_MODEL.items():
    run, ranks = f"HSDP {REPLICAS}x{SHARDS}, K={K}, {name}", results[name]
    records = ranks[0].collectives
    checks.check_volume(run, records, expected, STEPS - 1,
                        exact_calls=("all_gather", "reduce_scatter", "all_reduce"))
    checks.assert_losses_match(run, ref_losses,
                               mean_over_ranks([r.losses for r in ranks]), against=checks.SINGLE_PROCESS)
    checks.assert_params_match(run, ref_params, ranks[0].params,
                               checks.PARAM_TOL["sgd"], against=checks.SINGLE_PROCESS)
    sent[name] = {kind: sum(comm.ring_bytes(c) for c in records if c.kind == kind)
                  / (STEPS - 1)
                  for kind in ("all_gather", "reduce_scatter", "all_reduce")}

# %%
# What crosses the replicas
# -------------------------
# What the calls counted on rank 0 cost per optimizer step, priced by the ring algorithm
# (:func:`guide.comm.ring_bytes`, what nccl approaches), by collective. The calls and their
# elements are measured (counted by :class:`guide.comm.CollectiveLog`); the bytes are a price,
# not a measurement of the wire: gloo, which ran them here, performs a reduce-scatter as a full
# all-reduce and so sends more than the ring model says. The all-reduce is the only
# traffic between the replicas, that is between nodes. ``set_requires_all_reduce(False)`` cuts it
# to one all-reduce per optimizer step and leaves the gradients sharded;
# ``set_requires_gradient_sync(False)`` also drops the reduce-scatters inside the node, at the cost
# of unsharded gradients on every rank until the last micro-batch.
plotting.style()
fig, ax = plt.subplots(figsize=(8.4, 3.8))
KIND_STYLE = {"all_reduce": ("all-reduce (across the replicas)", "#1f77b4"),
              "reduce_scatter": ("reduce-scatter (inside the node)", "#ff7f0e"),
              "all_gather": ("all-gather (inside the node)", "#9467bd")}
names = list(SKIPS)
left = [0.0] * len(names)
for kind, (label, color) in KIND_STYLE.items():
    widths = [sent[n][kind] / 2**10 for n in names]
    ax.barh(range(len(names)), widths, left=left, color=color, label=label, height=0.6)
    left = [a + b for a, b in zip(left, widths)]
ax.set_yticks(range(len(names)), names)
ax.invert_yaxis()
ax.set_xlabel("KiB sent per rank per optimizer step (ring model)")
ax.set_title(f"HSDP {REPLICAS}x{SHARDS}, K={K} micro-batches per step: only the "
             "all-reduce crosses nodes", fontsize=10.5, loc="right")
fig.legend(loc="outside lower center", ncol=3, fontsize=9)
plt.show()

per_step = {n: [c.kind for c in results[n][0].collectives] for n in names}
CLAIM = dict(zip(names,
                 ("sync_every_micro_batch", "skip_all_reduce", "skip_gradient_sync")))


def kib(name: str, where: str, kinds: tuple[str, ...]) -> float:
    """Rank 0's counted calls of ``kinds`` per optimizer step, priced by the ring model
    (:func:`guide.comm.ring_bytes`), matched to the accumulation model's calls priced the same
    way. A price, not a byte count of the wire: gloo runs a reduce-scatter as an all-reduce."""
    priced = sum(sent[name][kind] for kind in kinds) / 2**10
    model = sum(comm.ring_bytes(c) for c in ACCUMULATION_MODEL[name] if c.kind in kinds) / 2**10
    return PAGE.check(f"hsdp.accumulation.{CLAIM[name]}.{where}_kib", checks.expect_close(
        "comm volume", f"HSDP {REPLICAS}x{SHARDS}, K={K}, {name}", priced, model, 1e-9,
        what="ring-model KiB", unit="KiB", against="the accumulation model's calls, priced"),
        fmt=",.1f", micro_batches=K, **HSDP)


PAGE.show("hsdp.accumulation.table",
          [[n, per_step[n].count("reduce_scatter") // (STEPS - 1),
            per_step[n].count("all_reduce") // (STEPS - 1),
            kib(n, "across_replicas", ("all_reduce",)),
            kib(n, "inside_node", ("all_gather", "reduce_scatter"))]
           for n in names],
          ["accumulation", "reduce-scatters", "all-reduces", "across replicas (KiB)",
           "inside the node (KiB)"],
          formats={"across replicas (KiB)": ",.1f", "inside the node (KiB)": ",.1f"},
          title=f"Per optimizer step of K={K} micro-batches, rank 0: calls counted, "
                "KiB priced by the ring model",
          keys=list(CLAIM.values()), micro_batches=K,
          **HSDP)

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held.
PAGE.conclude(f"All checks passed: HSDP on a {REPLICAS}x{SHARDS} mesh trains the "
              "single-process model, its replicas stay equal, and it sends what the model "
              "says.")

# sphinx_gallery_thumbnail_number = 1
