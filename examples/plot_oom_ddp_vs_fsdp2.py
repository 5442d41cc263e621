"""
FSDP2 fits where DDP runs out of memory
=======================================

"FSDP2 fits a larger model when DDP would run out of memory" is usually shown with a formula. This
page shows it with real allocations. Every rank gets a hard memory budget: the kernel refuses to
grow its data segment beyond it (``RLIMIT_DATA``), so over-use is a real ``can't allocate memory``
error, not a number on a chart. Then one model, with AdamW, is trained three ways under that same
budget:

1. DDP on 2 ranks: every rank holds the whole model, its gradients, DDP's gradient buckets and both
   AdamW moments. It must **fail**, and the launcher must say which rank, how much it asked for and
   what the budget was.
2. FSDP2 on 2 ranks and 3. on 4 ranks: every rank holds 1/N of the parameters, gradients and moments,
   plus the one block it is gathering. Both must **complete** and match a single-process reference.

If DDP unexpectedly fits, or FSDP2 does not, the docs build fails and says which. Next to the
outcome, the page puts each strategy's predicted and measured model state and its measured peak.
"""

# %%
# The model and the budget
# ------------------------
# The model is :class:`guide.model.TinyLM` made wide (``d_model=512``, MLP 2048, 6 blocks), so that
# its state, not the Python runtime, decides who fits. ``P`` is its fp32 parameter bytes.
#
# ``RLIMIT_DATA`` counts the rank's *whole* data segment (``VmData``), including the ~hundreds of MiB
# it starts with (``torch`` imported, the process group up). So the budget is set relative to that
# start: a first, tiny job reads ``VmData`` inside the ranks
# (:func:`guide.peak_memory.data_segment_bytes`), and each rank may then grow by ``HEADROOM × P``.
# The headroom sits between the two strategies' needs: DDP's model state alone is 4 P (parameters,
# gradients, two AdamW moments) plus P of gradient buckets; FSDP2's is 4 P / N plus one gathered block.
import math

import matplotlib.pyplot as plt

import guide
from guide import checks, memory, model_state, plotting, sharding
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.peak_memory import PeakMemory, current_bytes, data_segment_bytes, prepare
from guide.training import make_optimizer, mean_over_ranks, reference_run, train_steps

MiB = 2**20
CFG = ModelConfig(vocab=128, d_model=512, n_layers=6, n_heads=8, d_mlp=2048, max_seq=32)
STEPS = 3
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab, seed=0)
HEADROOM = 4.0  # × P: room each rank may grow by above its own start

SHAPES = model_state.param_shapes(build_model(CFG))
N_PARAMS = sum(math.prod(s) for s in SHAPES)
P = N_PARAMS * 4
print(f"model: {N_PARAMS:,} parameters, P = {P / MiB:.1f} MiB in fp32")


def start_level(rank: guide.Rank) -> int:
    """VmData of a fresh rank before it builds anything: what the budget is relative to."""
    return data_segment_bytes()


START = max(max(guide.launch(start_level, n)) for n in (2, 4))
BUDGET_MIB = math.ceil((START + HEADROOM * P) / MiB)
print(f"a fresh rank starts with VmData = {START / MiB:.0f} MiB; budget per rank = "
      f"{BUDGET_MIB} MiB = start + {HEADROOM} × P")

# %%
# One worker, two strategies
# --------------------------
# The worker builds the model on every rank with the same seed, wraps it (``DDP(model)``, or
# ``fully_shard`` on each block and then on the root) and trains ``STEPS`` AdamW steps. Around the
# training it measures the rank's peak resident memory with :class:`guide.peak_memory.PeakMemory`
# (``VmHWM`` after a reset; see the method below), and at the end it reads the model state it
# really holds (:func:`guide.model_state.total_bytes`). ``prepare()`` makes freed memory leave the
# process, so that both the budget and the measurement track live tensors, not heap fragmentation.


def train_worker(rank: guide.Rank, strategy: str) -> dict:
    prepare()
    start = current_bytes()
    model = sharding.wrap(build_model(CFG, device=rank.device), strategy, rank)
    opt = make_optimizer("adamw", model.parameters())
    with PeakMemory(rank.device) as peak:
        losses = train_steps(model, opt, BATCHES, rank.rank, rank.world_size, rank.device)
    return {"losses": losses, "peak": peak.peak_level_bytes - start,
            "state": model_state.total_bytes(model, opt)}  # + DDP's buckets


# %%
# Under the budget: DDP fails, FSDP2 trains
# -----------------------------------------
# ``guide.launch(..., memory_limit_mib=BUDGET_MIB)`` sets the limit inside each rank just before the
# worker runs. An allocation beyond it makes PyTorch's CPU allocator raise
# ``DefaultCPUAllocator: can't allocate memory``, which the launcher reports as
# :class:`guide.RankOutOfMemory`.
outcome = {}
try:
    guide.launch(train_worker, 2, "DDP", memory_limit_mib=BUDGET_MIB)
except guide.RankOutOfMemory as oom:
    outcome["DDP", 2] = oom
    print(str(oom).split("\n\n")[0])
else:
    raise checks.CheckFailed(
        f"[DDP out of memory] DDP x2 trained {STEPS} steps within {BUDGET_MIB} MiB per rank: the "
        f"budget (start + {HEADROOM} × P) no longer separates DDP from FSDP2. Lower HEADROOM.")

ref_losses, _ = reference_run(CFG, "adamw", BATCHES)
for n in (2, 4):
    try:
        results = guide.launch(train_worker, n, "FSDP2", memory_limit_mib=BUDGET_MIB)
    except guide.RankOutOfMemory as oom:
        raise checks.CheckFailed(
            f"[FSDP2 fits] FSDP2 x{n} ran out of memory under {BUDGET_MIB} MiB per rank: "
            f"{str(oom).splitlines()[0]}") from oom
    outcome["FSDP2", n] = results
    gap = checks.assert_losses_match(f"FSDP2 x{n} under {BUDGET_MIB} MiB", ref_losses,
                                     mean_over_ranks([r["losses"] for r in results]))
    print(f"FSDP2 x{n}: {STEPS} steps within {BUDGET_MIB} MiB per rank; losses match the "
          f"single-process reference within {gap:.1e} (tol {checks.LOSS_TOL:.0e})")

# %%
# How much DDP would have needed
# ------------------------------
# To put a number on DDP's failure, the same worker runs once more *without* a budget.
ddp_free = guide.launch(train_worker, 2, "DDP")
checks.assert_losses_match("DDP x2 without a budget", ref_losses,
                           mean_over_ranks([r["losses"] for r in ddp_free]))
headroom = BUDGET_MIB * MiB - START
need = max(r["peak"] for r in ddp_free)
if not need > headroom:
    raise checks.CheckFailed(
        f"[DDP out of memory] without a budget DDP x2 peaked at {need / MiB:.0f} MiB above its "
        f"start, inside the {headroom / MiB:.0f} MiB headroom it failed under: the failure was "
        "not the model's state.")

# %%
# Predicted and measured, side by side
# ------------------------------------
# *Predicted state* is :func:`guide.memory.per_rank_total_bytes` from the parameter shapes (the
# model state plus, for DDP, its gradient buckets); *measured state* is what the rank
# holds after training (:func:`guide.model_state.total_bytes`, the buckets read from DDP); *measured
# peak* is the highest resident memory during training above the rank's level before it built the
# model. The prediction must equal the measurement to the byte; the peak adds what the formula does
# not count: activations, the block FSDP2 gathers and reduces, AdamW's per-tensor temporaries.
rows = []
runs_by_config = {("DDP", 2): ddp_free, ("FSDP2", 2): outcome["FSDP2", 2],
                  ("FSDP2", 4): outcome["FSDP2", 4]}
for (strategy, n), runs in runs_by_config.items():
    predicted = memory.per_rank_total_bytes(SHAPES, strategy.lower(), n, "fp32", "adamw")
    measured = max(r["state"] for r in runs)
    if measured != predicted:
        raise checks.CheckFailed(
            f"[model-state prediction] {strategy} x{n}: measured {measured:,} B of parameters, "
            f"gradients, AdamW state (and buckets), predicted {predicted:,} B.")
    peak = max(r["peak"] for r in runs)
    fits = "fails (out of memory)" if strategy == "DDP" else "trains"
    rows.append((f"{strategy} x{n}", predicted, measured, peak, fits))

print(f"budget: {headroom / MiB:.0f} MiB above a fresh rank's start (P = {P / MiB:.1f} MiB)\n")
print(f"{'run':<10}{'predicted state':>17}{'measured state':>16}{'measured peak':>15}   under budget")
for name, pred, meas, peak, fits in rows:
    print(f"{name:<10}{pred / MiB:13.1f} MiB{meas / MiB:12.1f} MiB{peak / MiB:11.1f} MiB   {fits}")
oom = outcome["DDP", 2]
print(f"\nDDP: rank {oom.rank} asked for "
      f"{'an unknown amount' if oom.requested_bytes is None else f'{oom.requested_bytes / MiB:.1f} MiB'}"
      f" with a budget of {oom.limit_mib} MiB; unconstrained it needs {need / MiB:.0f} MiB above its "
      f"start, {need / headroom:.2f}x the headroom. FSDP2 x2 peaks at "
      f"{rows[1][3] / headroom:.0%} of it, FSDP2 x4 at {rows[2][3] / headroom:.0%}.")

# %%
# The picture
# -----------
# Bars are the measured per-rank peak above a fresh rank's start, the darker part the model state
# inside it; the dashed line is the budget's headroom. DDP's bar crosses it, and it did crash.
plotting.style()
fig, ax = plt.subplots(figsize=(7.5, 3.4))
for i, (name, pred, meas, peak, fits) in enumerate(rows):
    color = plotting.COLORS[name.split()[0]]
    ax.barh(i, peak / MiB, color=color, alpha=0.35, label="measured peak" if i == 0 else None)
    ax.barh(i, meas / MiB, color=color, label="model state (+ DDP buckets)" if i == 0 else None)
    ax.text(peak / MiB + 4, i, fits, va="center", fontsize=10)
ax.axvline(headroom / MiB, color="black", ls="--", lw=1.2)
ax.text(headroom / MiB, len(rows) - 0.45, f" budget: {headroom / MiB:.0f} MiB", fontsize=10)
ax.set_yticks(range(len(rows)), [r[0] for r in rows])
ax.invert_yaxis()
ax.set_xlim(0, max(r[3] for r in rows) / MiB * 1.35)
ax.set_xlabel("per-rank memory above a fresh rank (MiB)")
ax.set_title(f"AdamW, {P / MiB:.0f} MiB of fp32 parameters, one budget for every rank")
ax.legend(loc="lower right")
plt.show()

# %%
# What the peak measurement counts
# --------------------------------
# :class:`guide.peak_memory.PeakMemory` resets the kernel's high-water mark (``echo 5 >
# /proc/self/clear_refs``) and reads ``VmHWM`` at the end: every page the rank held at its worst
# moment, tensors and everything else (gloo's buffers, Python objects, code pages touched for the
# first time). It is only a measure of tensors because ``prepare()`` lowered glibc's mmap threshold
# to 64 KiB: with the default heap, freed blocks stay resident and fragment, and FSDP2 *looked*
# bigger than DDP. Allocations below 64 KiB still come from the heap and can be undercounted. It
# does not see other processes, swapped pages or memory reserved but never touched; the budget
# (``RLIMIT_DATA``) does count reserved memory, which is why the failure shows on the virtual side
# first. On CUDA it reads ``torch.cuda.max_memory_allocated``: tensors only.
