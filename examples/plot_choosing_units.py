"""
Choosing the units: reduce-scatter size, tied weights, 2-D meshes
=================================================================

.. admonition:: Verdict
   :class: tip

   Give an untied input embedding and LM head their own ``fully_shard`` calls: left in the root
   they make its reduce-scatter the step's largest, :claim:`units.root_only.largest_rs` MiB here,
   against :claim:`units.ends_as_units.largest_rs` MiB as units of their own, for the same
   :claim:`units.root_only.total_rs` MiB in total. Tied weights (``head.weight =
   tok_emb.weight``) go in one call, ``fully_shard([model.tok_emb, model.head])``, or stay in the
   root: sharding them apart raises at the first forward. A 2-D mesh passed to ``fully_shard`` is
   always HSDP (replicate over dim 0, shard over dim 1); to shard over every rank, pass a 1-D mesh
   (``mesh["dp_replicate", "dp_shard"]._flatten()``, a private method). Passing only
   ``mesh["dp_shard"]`` averaged each gradient over :claim:`units.mesh.sub.averaged_over` of the
   :claim:`units.world_size` ranks, and the replicas drifted apart.
   Measured on CPU gloo processes (a tiny model, two shared cores).

Each ``fully_shard`` call makes one *unit*: one all-gather of its parameters before its forward
(and again before its backward if it resharded), one reduce-scatter of its gradients, each
over one flat buffer of all the unit's parameters. What goes into which call therefore decides
the size of the largest buffer, and with it the largest collective and the most memory unsharded
at once. This page shards the site's model three ways on 4 gloo ranks and **fails the docs
build** unless each logged collective has the size the units' shapes predict, the tied-weight
rules hold as torch states them, and each mesh gives the placements and the averaging the
semantics require.
"""

# %%
# The code to copy
# ----------------
# ``shard`` puts each block in a unit and, with ``ends_as_units``, the embedding and the head in
# units of their own; what is left (positions, the final norm) stays in the root. For tied weights
# (``head.weight`` *is* ``tok_emb.weight``) ``shard_tied`` makes one unit of both modules: torch
# requires one unit per parameter. ``data_parallel_meshes`` are the three meshes a cluster of
# ``2 x N/2`` ranks can hand ``fully_shard``.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def shard(model: torch.nn.Module, mesh, ends_as_units: bool = True) -> torch.nn.Module:
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    if ends_as_units:  # untied: each its own reduce-scatter
        fully_shard(model.tok_emb, mesh=mesh)
        fully_shard(model.head, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def shard_tied(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """``model.head.weight is model.tok_emb.weight``: one unit for the pair."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard([model.tok_emb, model.head], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def data_parallel_meshes(device_type: str, world_size: int) -> dict:
    """The 2-D mesh (HSDP), its shard dim alone, and both dims flattened into one (FSDP)."""
    mesh = init_device_mesh(device_type, (2, world_size // 2),
                            mesh_dim_names=("dp_replicate", "dp_shard"))
    return {"hsdp": mesh, "sub": mesh["dp_shard"],  # fault-point: sub-mesh
            "flat": mesh["dp_replicate", "dp_shard"]._flatten()}  # private in torch 2.13


# %%
# The runs
# --------
# The site's model with a larger vocabulary (``VOCAB``), so that the embedding and the head are
# each larger than a block, as in LLMs. Each run trains ``STEPS`` SGD steps; the last is recorded
# by :class:`guide.comm.CollectiveLog`, which logs every collective's buffer (kind, elements,
# bytes, ranks in its group), as :doc:`plot_communication` counts them.
import dataclasses

import matplotlib.pyplot as plt
from torch.distributed.tensor import DTensor

import guide
from guide import checks, comm
from guide.comm import CollectiveLog
from guide.data import synthetic_batches
from guide.layout import chunk_rows, full_state
from guide.model import ModelConfig, build_model
from guide.pitfalls import torch_source_says
from guide.plotting import legend_below, style
from guide.reference import reference_run
from guide.training import make_optimizer, mean_over_ranks, train_steps

PAGE = guide.Page(section="Configure FSDP2", order=8, key_api="fully_shard([", world_size=4,
                  supports=(4,), why="the mesh section needs a 2 x 2 mesh")
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
VOCAB = 1024
CFG = ModelConfig(vocab=VOCAB)
STEPS = 2
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=VOCAB, seed=0)
#: What every number the page measures depends on.
SETUP = dict(model="tinylm-vocab1024", world_size=WORLD_SIZE, optimizer="sgd", steps=STEPS)
PAGE.state("units.world_size", WORLD_SIZE, "ranks", **SETUP)
MiB = 2**20


def tied_model() -> torch.nn.Module:
    model = build_model(CFG)
    model.head.weight = model.tok_emb.weight
    return model


def untied_run(rank: guide.Rank, ends_as_units: bool) -> dict:
    model = shard(build_model(CFG, device=rank.device),  # fault-point: untied-shard
                  init_device_mesh(rank.device.type, (rank.world_size,)), ends_as_units)
    opt = make_optimizer("sgd", model.parameters())
    losses = train_steps(model, opt, BATCHES[:-1], rank)
    with CollectiveLog(model) as log:
        losses += train_steps(model, opt, BATCHES[-1:], rank)
    return {"losses": losses, "collectives": log.records, "params": full_state(model)}


@dataclasses.dataclass(frozen=True)
class Tied:
    """One way to shard the tied model: which of its two modules get ``fully_shard`` calls."""

    key: str
    label: str
    calls: tuple[str, ...]  # "pair": fully_shard([tok_emb, head]); else each name on its own


TIED = (Tied("root", "both left in the root", ()),
        Tied("pair", "fully_shard([tok_emb, head])", ("pair",)),
        Tied("apart", "fully_shard(tok_emb); fully_shard(head)", ("tok_emb", "head")),
        Tied("emb_only", "fully_shard(tok_emb), head in the root", ("tok_emb",)))


def tied_run(rank: guide.Rank, t: Tied) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = tied_model().to(rank.device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    for call in t.calls:
        fully_shard([model.tok_emb, model.head] if call == "pair" else getattr(model, call),
                    mesh=mesh)
    fully_shard(model, mesh=mesh)
    gathered = []

    def record(*_) -> None:  # while block 0 runs: is the tied weight unsharded (a plain tensor)?
        gathered.append(not isinstance(model.tok_emb.weight, DTensor))

    model.blocks[0].register_forward_pre_hook(record)
    try:
        losses = train_steps(model, make_optimizer("sgd", model.parameters()), BATCHES, rank)
    except (ValueError, RuntimeError) as err:
        return {"error": f"{type(err).__name__}: {err}", "ran_forward": bool(gathered)}
    return {"error": None, "losses": losses, "still_tied": model.head.weight is model.tok_emb.weight,
            "gathered_in_blocks": gathered[0]}


def mesh_run(rank: guide.Rank) -> dict:
    out = {}
    for key, mesh in data_parallel_meshes(rank.device.type, rank.world_size).items():
        model = build_model(CFG, device=rank.device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        p = model.blocks[0].fc1.weight
        opt = make_optimizer("sgd", model.parameters())
        with CollectiveLog(model) as log:
            losses = train_steps(model, opt, BATCHES, rank)
        groups = {kind: sorted({c.group_size for c in log.records if c.kind == kind})
                  for kind in ("reduce_scatter", "all_reduce")}
        out[key] = {"placements": tuple(p.placements), "local_rows": p.to_local().shape[0],
                    "groups": groups, "losses": losses, "params": full_state(model)}
    return out


def worker(rank: guide.Rank) -> dict:
    return {"untied": {ends: untied_run(rank, ends) for ends in (False, True)},
            "tied": {t.key: tied_run(rank, t) for t in TIED}, "mesh": mesh_run(rank)}


per_rank = guide.launch(worker, WORLD_SIZE)
REF_LOSSES, REF_PARAMS = reference_run(CFG, "sgd", BATCHES)

# %%
# 1. The root's reduce-scatter, with the embedding and head left in it
# --------------------------------------------------------------------
# The prediction: one reduce-scatter per unit, each over the unit's parameters padded to a
# multiple of the ranks (:func:`guide.comm.fsdp2_padded_numel`), in fp32. Left in the root, the
# embedding and the head are one buffer with the positions and the final norm; as units of their
# own, three smaller buffers replace it and the total does not move. Both layouts train to the
# single-process reference's losses: units move bytes, not numbers.
LAYOUTS = {False: ("root_only", "embedding + head in the root"),
           True: ("ends_as_units", "embedding, head: own units")}


def predicted_units(ends_as_units: bool) -> list[int]:
    """Bytes of each unit's reduce-scatter input, from the unsharded model's shapes."""
    model = build_model(CFG)
    units = [list(b.parameters()) for b in model.blocks]
    ends = [model.tok_emb.weight, model.head.weight]
    units += [[p] for p in ends] if ends_as_units else []
    root = [p for p in model.parameters() if not any(p is q for u in units for q in u)]
    return [4 * sum(comm.fsdp2_padded_numel(p.shape, WORLD_SIZE) for p in u)
            for u in (root, *units)]


rows, sizes = [], {}
for ends, (key, label) in LAYOUTS.items():
    res = [r["untied"][ends] for r in per_rank]
    run = f"FSDP2 x{WORLD_SIZE}, {label}"
    checks.assert_losses_match(run, REF_LOSSES, mean_over_ranks([r["losses"] for r in res]),
                               against=checks.SINGLE_PROCESS)
    checks.assert_params_match(run, REF_PARAMS, res[0]["params"], checks.PARAM_TOL["sgd"],
                               against=checks.SINGLE_PROCESS)
    want = predicted_units(ends)
    rs = sorted((c.bytes for c in res[0]["collectives"] if c.kind == "reduce_scatter"), reverse=True)
    ag = [c.bytes for c in res[0]["collectives"] if c.kind == "all_gather"]
    sizes[key] = rs
    checks.expect("reduce-scatters", run, rs == sorted(want, reverse=True),
                  f"reduce-scatter inputs of {rs} bytes, the units' shapes predict "
                  f"{sorted(want, reverse=True)}.")
    against = "the units' padded fp32 shapes"
    measured = {
        "reduce_scatters": checks.expect_close(
            "reduce-scatters", run, len(rs), len(want), 0, "reduce-scatters per step",
            unit="calls", against="one per unit"),
        "total_rs": checks.expect_close(
            "reduce-scatters", run, sum(rs), sum(want), 0, "total reduce-scatter input",
            unit="bytes", against=against).scaled(1 / MiB, "MiB"),
        "largest_rs": checks.expect_close(
            "reduce-scatters", run, rs[0], max(want), 0, "largest reduce-scatter input",
            unit="bytes", against=against).scaled(1 / MiB, "MiB"),
        "largest_ag": checks.expect_close(
            "all-gathers", run, max(ag), max(want), 0, "largest all-gather output",
            unit="bytes", against=against).scaled(1 / MiB, "MiB")}
    for what, checked in measured.items():
        PAGE.check(f"units.{key}.{what}", checked, fmt=".0f" if what == "reduce_scatters" else ".3f",
                   **SETUP)
    rows.append([label, PAGE.state(f"units.{key}.units", len(want), "units", **SETUP),
                 *measured.values()])
PAGE.show("units.layouts", rows, ["layout", "units", "reduce-scatters", "total RS MiB",
                                  "largest RS MiB", "largest AG MiB"],
          formats={c: ".3f" for c in ("total RS MiB", "largest RS MiB", "largest AG MiB")},
          title=f"One training step, rank 0 of {WORLD_SIZE}", keys=[k for k, _ in LAYOUTS.values()],
          rank=0, **SETUP)
checks.expect("units", "ends as units", rows[1][3] == rows[0][3] and rows[1][4] < rows[0][4],
              f"total {rows[1][3]} vs {rows[0][3]} MiB, largest {rows[1][4]} vs {rows[0][4]} MiB.")

# %%
# At the scale this matters: Llama-3-8B's published shapes (vocabulary
# :claim:`units.llama3_8b.shape_128256`, width :claim:`units.llama3_8b.shape_4096`, MLP
# :claim:`units.llama3_8b.shape_14336`, grouped keys and values of width
# :claim:`units.llama3_8b.shape_1024`) make the embedding and the head together a root unit of
# :claim:`units.llama3_8b.root_ends_gparams` billion parameters, against
# :claim:`units.llama3_8b.block_gparams` billion for a block: a predicted, not measured, ratio.
V, D, F_MLP, KV = 128_256, 4_096, 14_336, 1_024
LLAMA = dict(model="llama-3-8b", shapes="cited: Meta-Llama-3-8B config.json")
ends_b = PAGE.state("units.llama3_8b.root_ends_gparams", 2 * V * D / 1e9, "billion parameters",
                    fmt=".2f", **LLAMA)
block_b = PAGE.state("units.llama3_8b.block_gparams",
                     (2 * D * D + 2 * D * KV + 3 * D * F_MLP + 2 * D) / 1e9,
                     "billion parameters", fmt=".3f", **LLAMA)
for n, text in ((V, "128,256"), (D, "4,096"), (F_MLP, "14,336"), (KV, "1,024")):
    PAGE.state(f"units.llama3_8b.shape_{n}", n, "elements", guard="cited: Meta-Llama-3-8B "
               "config.json", shown=text, model="llama-3-8b")
PAGE.conclude("Give an untied embedding and LM head their own fully_shard calls (as torchtitan "
              "does): the total traffic is the same, the largest buffer is not.")

# %%
# Every reduce-scatter of the step, largest first: the root's bar is the one that splits.
style()
fig, ax = plt.subplots(figsize=(7.5, 3.8))
width = 0.4
for j, (key, label) in enumerate(LAYOUTS.values()):
    ax.bar([i + (j - 0.5) * width for i in range(len(sizes[key]))],
           [b / MiB for b in sizes[key]], width, label=label,
           color=("#d62728", "#1f77b4")[j])
ax.set(xlabel="reduce-scatters of one step, largest first",
       ylabel="reduce-scatter input (MiB)",
       title="The embedding and head in the root make the largest buffer")
ax.set_xticks([])
legend_below(fig)
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# 2. Tied weights: one unit for both modules
# ------------------------------------------
# A parameter belongs to exactly one unit. With ``head.weight = tok_emb.weight`` that leaves two
# ways: keep both modules in the root, or give them one call, ``fully_shard([tok_emb, head])``
# (a list of modules is one unit: one all-gather, one reduce-scatter). Either way the weight is
# gathered from the embedding's forward until the head's, through every block. Sharding them
# apart, or the embedding alone with the head left in the root, is accepted by ``fully_shard``
# and refused at the first forward, with torch's words below; the working layouts train to the
# losses of one process training the tied model.
# torch 2.13 refuses a parameter two units manage (``_validate_no_duplicate_params``); torch 2.9,
# the floor, accepts it and the tie silently breaks: the page holds each torch to what it does.
REFUSES_SHARED = torch_source_says("already managed by another FSDP group")
tied_ref = tied_model()
TIED_REF = train_steps(tied_ref, make_optimizer("sgd", tied_ref.parameters()), BATCHES)
tied_rows = []
for t in TIED:
    res = [r["tied"][t.key] for r in per_rank]
    run = f"FSDP2 x{WORLD_SIZE}, tied, {t.label}"
    if t.key in ("apart", "emb_only") and REFUSES_SHARED:  # a parameter managed by two units
        checks.expect("tied weights", run, all(r["error"] and "already managed by another FSDP "
                                               "group" in r["error"] for r in res),
                      f"expected torch's refusal, got {res[0]['error']!r}.")
        checks.expect("tied weights", run, not any(r["ran_forward"] for r in res),
                      "a block's forward ran before the refusal.")
        tied_rows.append([t.label, "refused at the first forward", "-", "-"])
        continue
    if t.key in ("apart", "emb_only"):  # an older torch (2.9): accepted, and the tie breaks
        checks.expect("tied weights", run, all(r["error"] is None and not r["still_tied"]
                                               for r in res),
                      f"torch {torch.__version__} neither refused nor broke the tie: {res[0]}")
        tied_rows.append([t.label, "accepted by this torch: the tie breaks", "no", "-"])
        continue
    checks.expect("tied weights", run, all(r["error"] is None and r["still_tied"] for r in res),
                  f"{res[0]}")
    checks.assert_losses_match(run, TIED_REF, mean_over_ranks([r["losses"] for r in res]),
                               against="one process training the tied model")
    checks.expect("tied weights", run, all(r["gathered_in_blocks"] for r in res),
                  "the tied weight was sharded while the blocks ran.")
    tied_rows.append([t.label, "trains, same losses as one process", "yes", "yes"])
PAGE.show(None, tied_rows, ["tied model", "outcome", "still tied", "gathered in blocks"])
for t in TIED[2:] if REFUSES_SHARED else ():
    print(f"{t.label}:\n  {per_rank[0]['tied'][t.key]['error']}")
PAGE.conclude("Tie first, then shard: fully_shard([model.tok_emb, model.head]) or leave both "
              "in the root; the pair is one unit, gathered for the whole forward.")

# %%
# 3. A 2-D mesh is HSDP
# ---------------------
# ``fully_shard`` reads a 1-D mesh as FSDP (``(Shard(0),)`` over every rank) and a 2-D mesh as
# HSDP: ``(Replicate(), Shard(0))``, sharded over dim 1 only and replicated over dim 0, the
# gradient reduce-scattered within a replica and then all-reduced across replicas. There is no
# 2-D full sharding: a mesh of more dimensions is refused. To shard over both dims, flatten them
# into one: ``mesh["dp_replicate", "dp_shard"]._flatten()`` (a private method in torch 2.13;
# torchtitan calls it the same way; torch 2.13's ``fully_shard(..., dp_mesh_dims=...)`` is the
# new public route, for parameters that already are DTensors on the full mesh, not shown here).
# Passing the sub-mesh ``mesh["dp_shard"]`` alone is the silent mistake: each rank shards over
# its replica only, nothing crosses replicas, and each replica trains on its own half of the data.
# The rows a rank keeps are checked against ``torch.chunk`` rules (:func:`guide.layout.chunk_rows`).
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

rows_full = build_model(CFG).blocks[0].fc1.weight.shape[0]
half = PAGE.state("units.mesh.shards_per_replica", WORLD_SIZE // 2, "ranks", **SETUP)
PAGE.state("units.mesh.replicas", 2, "replicas", **SETUP)
MESHES = {  # key: (label, placements, ranks sharding, ranks averaging, matches one process)
    "hsdp": ("2-D mesh (dp_replicate, dp_shard)", (Replicate(), Shard(0)), half, WORLD_SIZE, True),
    "flat": ('mesh["dp_replicate", "dp_shard"]._flatten()', (Shard(0),), WORLD_SIZE, WORLD_SIZE,
             True),
    "sub": ('mesh["dp_shard"] only', (Shard(0),), half, half, False)}
mesh_rows = []
for key, (label, placements, shard_over, averaged, matches) in MESHES.items():
    res = [r["mesh"][key] for r in per_rank]
    run = f"FSDP2 x{WORLD_SIZE}, {label}"
    checks.expect("placements", run, all(r["placements"] == placements for r in res),
                  f"placements {res[0]['placements']}, expected {placements}.")
    local = [r["local_rows"] for r in res]
    want_rows = [chunk_rows(rows_full, i % shard_over, shard_over) for i in range(WORLD_SIZE)]
    checks.expect("local rows", run, local == want_rows,
                  f"fc1 rows per rank {local}, torch.chunk over {shard_over} ranks gives {want_rows}.")
    groups = res[0]["groups"]
    got_avg = groups["reduce_scatter"][0] * (groups["all_reduce"] or [1])[0]
    avg = checks.expect_close(
        "gradient averaging", run, got_avg, averaged, 0, "ranks a gradient is averaged over",
        unit="ranks", against="the mesh's semantics")
    PAGE.check(f"units.mesh.{key}.averaged_over", avg, fmt=".0f", **SETUP)
    replica_gap = max((res[0]["params"][n] - res[half]["params"][n]).abs().max().item()
                      for n in res[0]["params"])
    losses = mean_over_ranks([r["losses"] for r in res])
    if matches:
        checks.assert_losses_match(run, REF_LOSSES, losses, against=checks.SINGLE_PROCESS)
        checks.expect("replicas", run, replica_gap == 0.0,
                      f"rank 0 and rank {half} differ by {replica_gap:.2e} after training.")
    else:
        checks.expect_order("replicas", run, 0.0, replica_gap, low_name="0",
                            high_name=f"max |rank 0 − rank {half}| after training")
    mesh_rows.append([label, str(tuple(res[0]["placements"])),
                      PAGE.state(f"units.mesh.{key}.local_share", local[0] / rows_full,
                                 "fraction of rows", fmt=".0%", **SETUP),
                      avg, "yes" if replica_gap == 0.0 else "no"])
PAGE.show("units.meshes", mesh_rows, ["mesh passed to fully_shard", "placements", "rows per rank",
                                     "gradient averaged over", "replicas agree"],
          formats={"rows per rank": ".0%", "gradient averaged over": ".0f"},
          title=f"{WORLD_SIZE} ranks as 2 replicas x {half} shards", keys=list(MESHES), **SETUP)
PAGE.conclude("Pass the 2-D mesh for HSDP, a flattened 1-D mesh to shard over every rank, and "
              "never one dim of a larger data-parallel mesh alone.")
# sphinx_gallery_start_ignore
# What the tests (tests/test_choosing_units.py) read of this run, and nothing else.
RESULT = dict(CFG=CFG, sizes=sizes, per_rank=per_rank, mesh_rows=mesh_rows)
# sphinx_gallery_end_ignore

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held.
print("All checks passed.")
