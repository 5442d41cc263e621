"""
torch.compile with FSDP2
========================

.. tip::

   Compile each transformer block, not the model: ``block.compile(fullgraph=True)`` after
   ``fully_shard(block)``, as torchtitan does. Identical blocks share one graph (0 recompiles),
   FSDP2's hooks stay outside it, so the collectives and the losses are eager FSDP2's. Compiling
   the whole model breaks at FSDP2's first hook and runs the model's own ``forward`` eagerly.
   Expect seconds of compile time per process before the first step; the speed-up, on GPUs, is
   not measured here.

This page trains the site's model with FSDP2 on 2 CPU gloo ranks three ways, eager, with each
block compiled, and with the whole model compiled, and fails the build unless the compiled runs
take eager's steps to the site's loss tolerance, issue the same collectives, capture one graph for
all blocks with no recompile and no graph break, and show where the whole-model compile breaks,
with torch's reason. The backend is ``aot_eager`` (see section 4 for why).
"""

# %%
# The code to copy
# ----------------
# ``fully_shard`` each block, then compile it in place (``nn.Module.compile`` keeps the module, so
# the model's structure, its state dict and FSDP2's hooks are unchanged); ``fullgraph=True`` makes
# a graph break inside a block an error rather than a silent slowdown. The training step is the
# plain one.
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

BACKEND = "aot_eager"  # "inductor" on GPUs; see section 4


def shard_and_compile(model, world_size: int, device_type: str = "cpu", per_block=True):
    mesh = init_device_mesh(device_type, (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
        if per_block:
            block.compile(backend=BACKEND, fullgraph=True)
    fully_shard(model, mesh=mesh)
    return model


def train_step(model, opt, tokens: torch.Tensor) -> float:
    opt.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    return loss.item()


# %%
# The runs
# --------
# One job: each rank runs eager FSDP2, then per-block compile, then ``model.compile()`` after
# ``fully_shard`` (the whole model), with Dynamo reset before each (:func:`guide.compiled.reset`)
# and read after (:func:`guide.compiled.report`: frames, graphs, recompiles, graph breaks with
# torch's reasons, compile seconds). Steps after the first are counted by
# :class:`guide.comm.CollectiveLog`; the first step's extra time over a later step is what
# compiling cost.
import statistics
import time

import matplotlib.pyplot as plt

import guide
from guide import checks, claims, compiled, plotting
from guide.comm import CollectiveLog, fsdp2_groups, fsdp2_step, summarize
from guide.data import rank_slice, synthetic_batches
from guide.model import ModelConfig, build_model
from guide.report import table
from guide.training import make_optimizer, mean_over_ranks

WORLD_SIZE = guide.world_size(
    2, supports=(2, 4), why="checked at 2 and 4; 8 not run yet")
STEPS = 4
CFG = ModelConfig(vocab=64, d_model=32, n_layers=4, n_heads=4, d_mlp=64, max_seq=8)
BATCHES = synthetic_batches(steps=STEPS, batch_size=2 * WORLD_SIZE, seq_len=8,
                            vocab=CFG.vocab, seed=0)
RUNS = {"eager": None, "per-block compile": "blocks", "whole-model compile": "model"}
ledger = claims.Ledger("plot_compile_fsdp2")
SETUP = dict(model=repr(CFG), world_size=WORLD_SIZE, backend=BACKEND, steps=STEPS)


def one_run(rank: guide.Rank, compile_what: str | None) -> dict:
    compiled.reset()
    model = shard_and_compile(build_model(CFG, device=rank.device), rank.world_size,
                              rank.device.type, per_block=compile_what == "blocks")
    if compile_what == "model":  # Dynamo alone: where it breaks does not depend on the backend
        model.compile(backend="eager")
    opt = make_optimizer("sgd", model.parameters())
    tokens = [rank_slice(b, rank.rank, rank.world_size).to(rank.device) for b in BATCHES]
    seconds, losses = [], []
    with CollectiveLog(model) as log:
        for step, batch in enumerate(tokens):
            if step == 1:  # count steady steps only
                log.records.clear()
            started = time.perf_counter()
            losses.append(train_step(model, opt, batch))
            seconds.append(time.perf_counter() - started)
    return {"losses": losses, "seconds": seconds, "dynamo": compiled.report(),
            "collectives": log.records}


def all_runs(rank: guide.Rank) -> dict:
    return {name: one_run(rank, what) for name, what in RUNS.items()}


per_rank = guide.launch(all_runs, WORLD_SIZE)
runs = {name: [r[name] for r in per_rank] for name in RUNS}

# %%
# 1. Same steps, same collectives
# -------------------------------
# Each compiled run's global loss must equal eager FSDP2's at every step within
# :data:`guide.checks.LOSS_TOL`, and each rank's collectives per step (kind, calls, elements) must
# be eager's and :func:`guide.comm.fsdp2_step`'s: FSDP2's hooks run outside the compiled graphs,
# so its all-gathers and reduce-scatters are issued exactly as in eager mode.
eager = mean_over_ranks([r["losses"] for r in runs["eager"]])
MODEL = summarize(fsdp2_step(fsdp2_groups(build_model(CFG)), WORLD_SIZE))
rows = []
for name, ranks in runs.items():
    for r, result in enumerate(ranks):
        got = summarize(result["collectives"], STEPS - 1)
        checks.expect(got == MODEL, "collectives unchanged", f"{name}, rank {r}",
                      f"per step {got}, FSDP2's model {MODEL}")
    gap = checks.expect_close("loss equals eager", name,
                              mean_over_ranks([r["losses"] for r in ranks]), eager,
                              checks.LOSS_TOL, "loss")
    key = name.replace(" ", "-")
    calls = {k[0]: int(v["calls"]) for k, v in MODEL.items()}
    rows.append([name,
                 # checked: loss equals eager
                 ledger.claim(f"compile-fsdp2.{key}.loss_gap", float(f"{gap:.1e}"), "nats",
                              **SETUP),
                 # checked: collectives unchanged
                 ledger.claim(f"compile-fsdp2.{key}.all_gathers", calls["all_gather"],
                              "calls per step", **SETUP),
                 # checked: collectives unchanged
                 ledger.claim(f"compile-fsdp2.{key}.reduce_scatters", calls["reduce_scatter"],
                              "calls per step", **SETUP)])
print(table(rows, ["run", "max |Δloss| vs eager", "all-gathers/step", "reduce-scatters/step"],
            formats={"max |Δloss| vs eager": ".1e"},
            title=f"tolerance {ledger.claim('tolerance.loss', checks.LOSS_TOL, 'nats'):.0e}"))

# %%
# 2. One graph for every block, no recompile
# ------------------------------------------
# Dynamo inlines each block's module call and lifts its parameters to graph inputs, so the
# ``CFG.n_layers`` identical blocks (same code, shapes, dtypes) share one graph and one cache
# entry: a second graph or a recompile would mean a guard on something that differs per block
# (torch's reason would be printed). One such guard is ``requires_grad``: here every block's input
# is an activation that needs grad (block 0's too: the embeddings' output), but a block fed a
# tensor that needs none compiles a second graph (``tests/test_compile_fsdp2.py`` shows both).
# ``fullgraph=True`` already proved no graph break inside a block: one would have raised.
blocks = [r["dynamo"] for r in runs["per-block compile"]]
for r, d in enumerate(blocks):
    checks.expect(d.graphs == 1 and d.recompiles == 0 and d.graph_breaks == 0,
                  "one graph, no recompile", f"rank {r}",
                  f"{d.graphs} graphs, {d.recompiles} recompiles {d.recompile_reasons}, "
                  f"{d.graph_breaks} breaks {d.break_reasons}")
whole = [r["dynamo"] for r in runs["whole-model compile"]]
for r, d in enumerate(whole):
    checks.expect(d.graph_breaks >= 1 and d.graphs == 1 and d.recompiles == 0,
                  "whole model breaks at FSDP2's hook", f"rank {r}",
                  f"{d.graph_breaks} breaks {d.break_reasons}, {d.graphs} graphs")
DYN = dict(SETUP, rank=0)
print(table([[name,
              ledger.claim(f"compile-fsdp2.{key}.frames", d.frames, "frames", **DYN),
              # checked: one graph, no recompile
              ledger.claim(f"compile-fsdp2.{key}.graphs", d.graphs, "graphs", **DYN),
              ledger.claim(f"compile-fsdp2.{key}.ops_captured", d.ops_captured, "ops", **DYN),
              # checked: one graph, no recompile
              ledger.claim(f"compile-fsdp2.{key}.recompiles", d.recompiles, "recompiles",
                           **DYN),
              # checked: whole model breaks at FSDP2's hook
              ledger.claim(f"compile-fsdp2.{key}.graph_breaks", d.graph_breaks, "breaks",
                           **DYN)]
             for name, key, d in (("per-block compile", "per-block", blocks[0]),
                                  ("whole-model compile", "whole-model", whole[0]))],
            ["rank 0", "frames compiled", "graphs", "ops captured", "recompiles",
             "graph breaks"]))

# %%
# 3. Where the whole-model compile breaks
# ---------------------------------------
# ``model.compile()`` after ``fully_shard`` meets FSDP2's hooks, which torch wraps in
# ``torch._dynamo.disable``: first the root's pre-forward hook, then, inside the loop over the
# blocks, the first block's. A graph break inside a loop makes Dynamo give up on the whole frame:
# ``TinyLM.forward`` runs eagerly and each block's call is compiled on its own, which is the
# per-block compile with extra frames (the table above). Torch's reasons, as Dynamo counted them:
for reason in whole[0].break_reasons:
    print(f"- {reason}")
checks.expect(any("disable" in r or "skipped" in r for r in whole[0].break_reasons),
              "whole model breaks at FSDP2's hook", "reason",
              f"torch's reasons {whole[0].break_reasons}")

# %%
# 4. What compiling costs here
# ----------------------------
# ``aot_eager`` runs Dynamo and AOTAutograd (the forward and backward graphs inductor would
# receive) and executes them with eager kernels: no code generation, so no C++ toolchain. Inductor
# does work on this machine (it compiles C++ with the installed gcc, as on CI), but measured on
# a two-block model on the same loaded cores, its cold first step took more than twenty times
# ``aot_eager``'s (numbers in issue 27's closing note), where this whole page has a budget of a
# few seconds; ``aot_eager`` exercises the same Dynamo capture, guards and graph breaks this page
# is about. Measured on rank 0: Dynamo's compile time, and the
# first step's time beyond a steady step (which also includes the lazy backward compile).
cost_rows = []
for name, ranks in runs.items():
    d = ranks[0]["dynamo"]
    steady = statistics.median(ranks[0]["seconds"][1:])
    extra = ranks[0]["seconds"][0] - steady
    key = name.replace(" ", "-")
    cost_rows.append([name,
                      ledger.claim(f"compile-fsdp2.{key}.compile_s", round(d.compile_seconds, 2),
                                   "s", **DYN),
                      ledger.claim(f"compile-fsdp2.{key}.first_step_extra_s", round(extra, 2),
                                   "s", **DYN),
                      ledger.claim(f"compile-fsdp2.{key}.steady_step_ms",
                                   round(steady * 1e3, 1), "ms", **DYN)])
print(table(cost_rows, ["rank 0", "Dynamo compile (s)", "first step extra (s)",
                        "steady step (ms)"],
            formats={"Dynamo compile (s)": ".2f", "first step extra (s)": ".2f",
                     "steady step (ms)": ".1f"},
            title="Measured on the build's CPU (timings vary with load; no GPU speed-up "
                  "is claimed)"))

plotting.style()
fig, ax = plt.subplots(figsize=(7.5, 3.2))
for name, ranks in runs.items():
    ax.plot(range(STEPS), ranks[0]["seconds"], marker="o", label=name)
ax.set_yscale("log")
ax.set_xlabel("training step")
ax.set_ylabel("step time on rank 0 (s, log)")
ax.set_title(f"FSDP2 x{WORLD_SIZE} on CPU, backend {BACKEND}: compiling is paid in step 0",
             fontsize=10)
ax.legend()
plt.show()
print("\nAll checks passed: compiled FSDP2 takes eager's steps with eager's collectives.")

# sphinx_gallery_thumbnail_number = 1
