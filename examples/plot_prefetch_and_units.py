"""
Prefetching, per-module resharding and units
============================================

.. admonition:: Verdict
   :class: tip

   Keep FSDP2's default prefetching unless a GPU trace shows all-gathers waiting. Explicit
   prefetching (``set_modules_to_forward_prefetch``, ``set_modules_to_backward_prefetch``) never
   changes how many all-gathers a step issues
   (:claim:`prefetch.default.all_gathers_per_step` here, with or without it); it changes how many
   units are gathered at once: in forward
   :claim:`prefetch.default.max_units_gathered.forward` by default,
   :claim:`prefetch.prefetch_2.max_units_gathered.forward` with two units ahead, each one more
   unit of unsharded parameters per rank. Give the last block ``reshard_after_forward=False``, as
   torchtitan does: it saves one all-gather a step
   (:claim:`prefetch.keep_last.all_gathers_per_step` against
   :claim:`prefetch.default.all_gathers_per_step`) at an unchanged peak. For evaluation, switch
   with ``set_reshard_after_forward(False)``: the second eval batch gathered nothing
   (:claim:`prefetch.eval.switched.second_forward_all_gathers` all-gathers).

Measured on CPU gloo processes (a tiny model, two shared cores): every number here is measured,
and checked against what the semantics require. What only CUDA streams show (how much
communication overlaps compute, how many all-gathers are in flight) is stated at the end as
GPU-only, not measured.

Each ``fully_shard`` call makes a *unit*: one all-gather of its parameters before its forward, one
before its backward if it resharded, one reduce-scatter of its gradients. Three settings decide when
those all-gathers run and what stays gathered:

* **prefetching**: which unit's all-gather a unit starts before it computes.
  ``block.set_modules_to_forward_prefetch([...])`` and ``set_modules_to_backward_prefetch([...])``
  name them; ``model.unshard(async_op=True)`` starts the root's all-gather before the forward;
* **per-module** ``reshard_after_forward``: each ``fully_shard`` call takes its own value;
* ``set_reshard_after_forward()``: the same setting, changed at run time (evaluation).

This page trains one model under each setting on 2 gloo ranks, logs the order of the all-gathers
of one step with torch's own profiler (:class:`guide.unshard_timeline.UnshardTimeline`), counts the
units gathered at once, and **fails the docs build** unless the counts are what the semantics
predict and every run trains to the single-process reference's losses.
"""

# %%
# The code to copy
# ----------------
# ``shard`` applies FSDP2 per block, then to the root; ``keep_last_block`` gives the last block
# ``reshard_after_forward=False`` (backward starts with it, so gathering it again would be
# wasted). ``prefetch`` sets explicit prefetching ``depth`` units ahead in both directions.
# ``train_step`` can start the root's all-gather early with ``unshard(async_op=True)``; the root's
# forward waits for it. ``evaluate`` keeps the parameters gathered across eval batches, then
# restores training's setting (the root's default is ``False``) and frees them.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard


def shard(model: torch.nn.Module, mesh, keep_last_block: bool = False) -> torch.nn.Module:
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        keep = keep_last_block and i == len(blocks) - 1
        fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
    return fully_shard(model, mesh=mesh)


def prefetch(model: torch.nn.Module, depth: int) -> None:
    """Each block starts the all-gathers of the next ``depth`` blocks (forward) and of the
    ``depth`` before it (backward, nearest first)."""
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + depth])
        block.set_modules_to_backward_prefetch(blocks[max(0, i - depth):i][::-1])


def train_step(model, opt, loss_fn, tokens, unshard_root_early: bool = False) -> float:
    opt.zero_grad(set_to_none=True)
    if unshard_root_early:  # e.g. overlap it with data loading; the forward waits for it
        model.unshard(async_op=True)
    loss = loss_fn(model, tokens)
    loss.backward()
    opt.step()
    return loss.item()


def evaluate(model, loss_fn, batches) -> list[float]:
    """Eval losses, gathering each unit once for all ``batches``."""
    model.set_reshard_after_forward(False)  # recursive: every unit keeps what it gathers
    with torch.no_grad():
        losses = [loss_fn(model, b).item() for b in batches]
    model.set_reshard_after_forward(True)  # training again: the blocks reshard ...
    model.set_reshard_after_forward(False, recurse=False)  # ... the root keeps its default
    for module in model.modules():  # free them now, not at the next forward
        if isinstance(module, FSDPModule):  # reshard() is per unit, not recursive
            module.reshard()
    return losses


# %%
# Setup and the runs
# ------------------
# The site's tiny model (four blocks, so five units with the root) and SGD. Each run trains
# ``STEPS`` steps; the second one is recorded twice: by :class:`guide.comm.CollectiveLog` (every
# collective, with its phase) and by :class:`guide.unshard_timeline.UnshardTimeline` (torch's
# profiler: which unit each all-gather is for, and when each unit's forward and backward ran).
# One more run evaluates between its training steps, the default way and with ``evaluate``.
import dataclasses

import matplotlib.pyplot as plt

import guide
from guide import checks, comm, report
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.layout import full_state, param_layouts
from guide.model import ModelConfig, build_model
from guide.plotting import style
from guide.reference import reference_run
from guide.sharding import Strategy
from guide.training import make_optimizer, mean_over_ranks, next_token_loss, train_steps
from guide.unshard_timeline import ROOT, UnshardTimeline, max_gathered, order_text

PAGE = guide.Page(section="Configure FSDP2", order=2, key_api="set_modules_to_forward_prefetch(",
                  world_size=2, supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig()
STEPS = 3
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)
EVAL = synthetic_batches(steps=2, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=1)
SETUP = dict(model="tinylm", optimizer="sgd", world_size=WORLD_SIZE, steps=STEPS)
N_BLOCKS = CFG.n_layers


@dataclasses.dataclass(frozen=True)
class Setting:
    """One run: explicit prefetch depth (0: FSDP2's default), the root unsharded early, the last
    block kept from forward to backward; ``key`` names its claims."""

    label: str
    key: str
    depth: int = 0
    root_early: bool = False
    keep_last: bool = False


SETTINGS = (Setting("default", "default"), Setting("prefetch 1", "prefetch_1", depth=1),
            Setting("prefetch 2 + root unshard(async_op=True)", "prefetch_2", depth=2,
                    root_early=True),
            Setting("last block reshard_after_forward=False", "keep_last", keep_last=True))


def run(rank: guide.Rank, setting: Setting) -> dict:
    model = build_model(CFG, device=rank.device)
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    shard(model, mesh, keep_last_block=setting.keep_last)
    if setting.depth:
        prefetch(model, setting.depth)
    opt = make_optimizer("sgd", model.parameters())
    mine = [rank_slice(b, rank.rank, rank.world_size).to(rank.device) for b in BATCHES]

    def step(tokens) -> float:
        return train_step(model, opt, next_token_loss, tokens, setting.root_early)

    losses = [step(mine[0])]
    with UnshardTimeline() as timeline, CollectiveLog(model) as log:
        losses.append(step(mine[1]))
    losses += [step(t) for t in mine[2:]]
    return {"losses": losses, "params": full_state(model), "events": timeline.events,
            "collectives": log.records}


def eval_run(rank: guide.Rank) -> dict:
    """Train a step, evaluate the default way, train a step, evaluate with ``evaluate``, train on.
    Each eval forward is counted (its all-gathers, and how many parameters are plain tensors
    after it), and so is the training step after ``evaluate``."""
    model = shard(build_model(CFG, device=rank.device),
                  init_device_mesh(rank.device.type, (rank.world_size,)))
    opt = make_optimizer("sgd", model.parameters())
    mine = [rank_slice(b, rank.rank, rank.world_size).to(rank.device) for b in BATCHES]
    evals = [rank_slice(b, rank.rank, rank.world_size).to(rank.device) for b in EVAL]
    seen: dict[str, list] = {"default": [], "switched": []}

    def counted(into: list):
        def loss_fn(model, tokens):
            with CollectiveLog(model) as log:
                loss = next_token_loss(model, tokens)
            plain = sum(not lay.is_dtensor for lay in param_layouts(model, rank.rank))
            into.append((log.count("all_gather"), plain))
            return loss
        return loss_fn

    out = {"losses": [train_step(model, opt, next_token_loss, mine[0])]}
    with torch.no_grad():  # the default: eval forwards with training's setting
        out["default_eval"] = [counted(seen["default"])(model, b).item() for b in evals]
    out["losses"].append(train_step(model, opt, next_token_loss, mine[1]))
    out["switched_eval"] = evaluate(model, counted(seen["switched"]), evals)
    out["plain_after_evaluate"] = sum(not lay.is_dtensor for lay in param_layouts(model, 0))
    with CollectiveLog(model) as log:
        out["losses"] += [train_step(model, opt, next_token_loss, t) for t in mine[2:]]
    return out | {"seen": seen, "next_step_gathers": log.count("all_gather")}


def worker(rank: guide.Rank) -> dict:
    return {s.key: run(rank, s) for s in SETTINGS} | {"eval": eval_run(rank)}


per_rank = guide.launch(worker, WORLD_SIZE)
results = {s.key: [r[s.key] for r in per_rank] for s in SETTINGS}
for s in SETTINGS:  # the depth a setting's label names ("prefetch 2")
    PAGE.state(f"prefetch.{s.key}.depth", s.depth, "units ahead")
REF_LOSSES, REF_PARAMS = reference_run(CFG, "sgd", BATCHES)

# %%
# Same numbers, whatever the setting
# ----------------------------------
# Prefetching and resharding move parameters, not numbers: every run's losses and final
# parameters must equal one process training on the whole batch.
rows = []
for s in SETTINGS:
    res = results[s.key]
    name = f"FSDP2 x{WORLD_SIZE}, {s.label}"
    dl = checks.assert_losses_match(name, REF_LOSSES, mean_over_ranks([r["losses"] for r in res]),
                                    against=checks.SINGLE_PROCESS)
    dp = checks.assert_params_match(name, REF_PARAMS, res[0]["params"], checks.PARAM_TOL["sgd"],
                                    against=checks.SINGLE_PROCESS)
    rows.append([s.label, PAGE.check(f"prefetch.{s.key}.loss_gap", dl, fmt=".1e", **SETUP),
                 PAGE.check(f"prefetch.{s.key}.param_gap", dp, fmt=".1e", **SETUP)])
report.show(report.table(rows, ["setting", "max |Δloss|", "max |Δparam|"],
                         formats={"max |Δloss|": ".1e", "max |Δparam|": ".1e"}))

# %%
# 1. The order of the all-gathers in one step
# -------------------------------------------
#
# .. index::
#    ! set_modules_to_forward_prefetch
#    ! set_modules_to_backward_prefetch
#
# ``AG x``: an all-gather for unit ``x`` starts; ``F x`` / ``B x``: unit ``x``'s forward / backward
# has run (blocks are ``b0`` to ``b3``). By default each block gathers in its own pre-forward,
# right before it computes; in backward FSDP2 already prefetches one unit (the root's backward
# starts ``b3``'s, ``b3``'s starts ``b2``'s). ``prefetch 1`` adds that one-ahead to the forward;
# ``prefetch 2`` gathers two ahead in both. ``unshard(async_op=True)`` moves the root's
# all-gather before the forward: :class:`guide.comm.CollectiveLog` sees it outside any phase.
# The number of all-gathers per step must be the same in the profiler's events, in the log, and
# in what the semantics require (:func:`guide.comm.fsdp2_step` over the units the setting makes).
SHORT = {f"blocks.{i}": f"b{i}" for i in range(N_BLOCKS)}
units = comm.fsdp2_groups(build_model(CFG))  # the root, then each block
n_units = len(units)
ORDER = {"forward": [], "backward": []}
gathers, early = {}, {}
for s in SETTINGS:
    events, records = results[s.key][0]["events"], results[s.key][0]["collectives"]
    cut = max(i for i, e in enumerate(events) if e.kind == "forward") + 1
    ORDER["forward"].append(order_text(events[:cut], SHORT))
    ORDER["backward"].append(order_text(events[cut:], SHORT))
    groups = [dataclasses.replace(g, reshard_after_forward=not (s.keep_last and i == n_units - 1))
              if i else g for i, g in enumerate(units)]
    want = sum(c.kind == "all_gather" for c in comm.fsdp2_step(groups, WORLD_SIZE))
    logged = sum(c.kind == "all_gather" for c in records)
    profiled = sum(e.kind == "gather" for e in events)
    checks.expect("all-gathers", f"{s.label}", logged == profiled,
                  f"CollectiveLog counted {logged} all-gathers, the profiler {profiled}.")
    gathers[s.key] = PAGE.check(
        f"prefetch.{s.key}.all_gathers_per_step",
        checks.expect_close("all-gathers", s.label, logged, want, 0, "all-gathers per step",
                            unit="calls", against="one per unit and pass, by the semantics"),
        fmt=".0f", **SETUP)
    before = sum(c.kind == "all_gather" and c.phase is None for c in records)
    checks.expect("root unshard", s.label, before == int(s.root_early),
                  f"{before} all-gathers ran before the forward; expected {int(s.root_early)}.")
    early[s.key] = PAGE.state(f"prefetch.{s.key}.all_gathers_before_forward", before,
                              "calls", **SETUP)
report.show(report.table(
    [[s.label, gathers[s.key], early[s.key]] for s in SETTINGS],
    ["setting", "all-gathers per step", "before the forward"], title="All-gathers per step"))
for phase, lines in ORDER.items():
    print(f"\n{phase}:")
    for s, line in zip(SETTINGS, lines):
        print(f"  {s.label:<42} {line}")

# %%
# 2. Units gathered at once
# -------------------------
# Replaying the profiler's order (:func:`guide.unshard_timeline.max_gathered`): a unit is gathered
# from its all-gather until its forward has run (if it reshards after forward) or its backward.
# The semantics predict the most at one moment: the root (gathered for the whole step, by
# default), the unit computing, and the units prefetched ahead of it: ``depth`` in forward, and in
# backward ``depth`` or FSDP2's default one, never more than the blocks left. The bytes are the
# units' padded unsharded parameters (fp32): what prefetching costs in memory per rank.
MiB = 2**20
sizes = {ROOT if i == 0 else f"blocks.{i - 1}":
         sum(comm.fsdp2_padded_numel(sh, WORLD_SIZE) for sh in g.shapes) * 4
         for i, g in enumerate(units)}


def predicted(s: Setting, phase: str) -> int:
    ahead = s.depth if phase == "forward" else max(s.depth, 1)
    return 2 + min(ahead, N_BLOCKS - 1)  # the root, the block computing, the ones ahead


held, rows = {}, []
for s in SETTINGS:
    events = results[s.key][0]["events"]
    reshards = {ROOT: False} | {f"blocks.{i}": not (s.keep_last and i == N_BLOCKS - 1)
                                for i in range(N_BLOCKS)}
    row = [s.label]
    for phase in ("forward", "backward"):
        got = max_gathered(events, reshards, phase)
        held[s.key, phase] = PAGE.check(
            f"prefetch.{s.key}.max_units_gathered.{phase}",
            checks.expect_close("units gathered", f"{s.label}, {phase}", got, predicted(s, phase),
                                0, f"units gathered at once in {phase}", unit="units",
                                against="the root, the unit computing and its prefetches"),
            fmt=".0f", **SETUP)
        row.append(held[s.key, phase])
    peak = max_gathered(events, reshards, sizes=sizes)
    want = sizes[ROOT] + (1 + min(max(s.depth, 1), N_BLOCKS - 1)) * sizes["blocks.0"]
    row.append(PAGE.check(
        f"prefetch.{s.key}.peak_gathered",
        checks.expect_close("units gathered", s.label, peak, want, 0, "bytes gathered at once",
                            unit="bytes", against="those units' padded sizes"
                            ).scaled(1 / MiB, "MiB"), fmt=".3f", **SETUP))
    rows.append(row)
report.show(report.table(rows, ["setting", "forward", "backward", "peak gathered MiB"],
                         formats={"peak gathered MiB": ".3f"},
                         title="Most units gathered at once (root included)"))

# %%
# 3. The last block, kept from forward to backward
# ------------------------------------------------
# Backward starts with the last block: the root's backward prefetches it at once. Resharding it
# after forward, then gathering it again a moment later, is one all-gather a step for nothing;
# keeping it (``reshard_after_forward=False`` on that ``fully_shard`` call only, as torchtitan
# does) saves that all-gather, and the peak does not move: the tables above show both, checked
# against the semantics, and the peak of the two runs must be equal.
checks.expect("keep last block", f"FSDP2 x{WORLD_SIZE}",
              gathers["keep_last"] == gathers["default"] - 1,
              f"{gathers['keep_last']} all-gathers a step, expected one fewer than the "
              f"default's {gathers['default']}.")
peak_mib = {s.key: rows[i][-1] for i, s in enumerate(SETTINGS)}
checks.expect("keep last block", f"FSDP2 x{WORLD_SIZE}",
              peak_mib["keep_last"] == peak_mib["default"],
              f"peak gathered {peak_mib['keep_last']} MiB, the default's {peak_mib['default']}.")

# %%
# 4. Evaluation: ``set_reshard_after_forward``
# --------------------------------------------
#
# .. index::
#    ! set_reshard_after_forward
#
# An eval forward under ``torch.no_grad()`` with training's setting gathers every block again for
# every batch (only the root, which never reshards after forward, stays gathered: no backward
# comes to free it). ``evaluate`` above calls ``set_reshard_after_forward(False)`` first: the
# first batch gathers every unit, the next gathers nothing, and after the call the parameters
# are plain tensors, not DTensor shards. The call itself moves nothing: the units are freed by
# ``reshard()`` (called on each unit: it is not recursive), and training then goes on with the
# same losses, all-gathers and layout as before.
ev = per_rank[0]["eval"]
root_params = len(list(build_model(CFG).parameters())) - sum(
    len(list(b.parameters())) for b in build_model(CFG).blocks)
n_params = len(list(build_model(CFG).parameters()))
EXPECT = {"default": [(n_units, root_params), (N_BLOCKS, root_params)],
          "switched": [(n_units, n_params), (0, n_params)]}
eval_rows = []
for mode in ("default", "switched"):
    seen = ev["seen"][mode]
    checks.expect("evaluation", mode, seen == EXPECT[mode],
                  f"(all-gathers, plain parameters) after each eval forward: {seen}; expected "
                  f"{EXPECT[mode]}.")
    cells = [PAGE.state(f"prefetch.eval.{mode}.{which}_forward_all_gathers", g, "calls",
                        **SETUP) for which, (g, _) in zip(("first", "second"), seen)]
    plain = PAGE.state(f"prefetch.eval.{mode}.plain_params_after", seen[-1][1],
                       "parameter tensors", **SETUP)
    eval_rows.append([mode if mode == "default" else "set_reshard_after_forward(False)",
                      *cells, plain])


def reference_eval(steps: int) -> list[float]:
    """One process: train ``steps`` steps on the whole batches, then the eval losses."""
    model = build_model(CFG)
    train_steps(model, make_optimizer("sgd", model.parameters()), BATCHES[:steps])
    with torch.no_grad():
        return [next_token_loss(model, b).item() for b in EVAL]


for mode, steps in (("default", 1), ("switched", 2)):
    checks.assert_losses_match(f"FSDP2 x{WORLD_SIZE}, eval forwards, {mode}", reference_eval(steps),
                               mean_over_ranks([r["eval"][f"{mode}_eval"] for r in per_rank]),
                               against=f"one process evaluating after {steps} steps")
checks.expect("evaluation", "after evaluate()", ev["plain_after_evaluate"] == 0,
              f"{ev['plain_after_evaluate']} parameters still plain tensors after reshard().")
checks.expect("evaluation", "the next training step", ev["next_step_gathers"] == gathers["default"],
              f"{ev['next_step_gathers']} all-gathers, the default step's {gathers['default']}.")
checks.assert_losses_match(f"FSDP2 x{WORLD_SIZE}, trained around both evaluations", REF_LOSSES,
                           mean_over_ranks([r["eval"]["losses"] for r in per_rank]),
                           against=checks.SINGLE_PROCESS)
report.show(report.table(eval_rows, ["eval forwards", "1st batch all-gathers",
                                     "2nd batch all-gathers", "plain tensors after"],
                         title=f"Two eval batches ({n_params} parameter tensors)"))
PAGE.state("tinylm.parameter_tensors", n_params, "parameter tensors", model="tinylm")

# %%
# What only a GPU shows
# ---------------------
# These runs show the order in which the CPU issues the all-gathers and what is held; they show
# no overlap. On CPU gloo each collective runs to completion on the calling thread. On a GPU FSDP2
# runs all-gathers on their own CUDA streams, and the CPU issues the next unit's all-gather while
# the current unit's kernels still run: that is FSDP2's *implicit* forward prefetch, invisible
# here (the default row gathers one block at a time in forward). The default is bounded: each
# unit frees the previous unit's all-gather output after its own copy-in (the note "Overlapping
# all-gather copy-in and all-gather" in torch's ``_fsdp_param_group.py``), so about two blocks
# are gathered at once in forward on a GPU. Explicit prefetching issues all-gathers earlier
# still, past that bound: worth it only when a trace (``torch.profiler`` with CUDA activity)
# shows compute waiting on an all-gather, and only as far as the memory of the extra units allows.
PAGE.conclude(
    f"Explicit prefetching held {held['prefetch_2', 'forward']:.0f} units at once in forward "
    f"instead of {held['default', 'forward']:.0f} and issued the same "
    f"{gathers['prefetch_2']:.0f} all-gathers a step; keeping the last block saved one "
    f"({gathers['keep_last']:.0f}) at the same peak; set_reshard_after_forward(False) for eval "
    "gathered each unit once for all eval batches. Same losses as one process in every run.")

# %%
# The trade-off in one figure
# ---------------------------
# Units gathered at once (forward, backward) per setting: prefetching raises it; the number of
# all-gathers (annotated) does not change, except for keeping the last block.
style()
fig, ax = plt.subplots(figsize=(9, 4.2))
x = range(len(SETTINGS))
w = 0.38
for j, (phase, alpha) in enumerate((("forward", 0.45), ("backward", 1.0))):
    ax.bar([i + (j - 0.5) * w for i in x], [held[s.key, phase] for s in SETTINGS], w,
           color=Strategy.FSDP2.color, alpha=alpha, label=phase)
for i, s in enumerate(SETTINGS):
    ax.text(i, max(held[s.key, "backward"], held[s.key, "forward"]) + 0.1,
            f"{gathers[s.key]:.0f} all-gathers", ha="center", fontsize=9)
ax.set_xticks(list(x), [s.label.replace(" + ", "\n+ ").replace(" reshard", "\nreshard")
                        for s in SETTINGS], fontsize=8)
ax.set_ylabel("units gathered at once (root included)")
ax.set_ylim(0, 1.35 * max(held.values()))
ax.legend(loc="upper left", ncols=2)
fig.suptitle(f"Prefetching holds more units, not more all-gathers ({WORLD_SIZE} gloo ranks)")
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
