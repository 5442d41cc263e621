"""
FSDP2 fits where DDP runs out of memory
=======================================

.. admonition:: Verdict
   :class: tip

   DDP stops fitting when its held state (parameters, gradients, optimizer state and its gradient
   buckets: 4 P with SGD + momentum, P the fp32 parameter bytes) plus activations outgrows a rank's
   memory; FSDP2 still fits while 3 P / N plus its transient buffers (the root and two blocks
   gathered in backward, one block's gradients) does. Here DDP needs
   :claim:`oom.ddp.n2.need_vs_headroom <unit>` the memory each rank may use and fails, while
   FSDP2 on the same ranks trains under it with the same losses: choose FSDP2 then, DDP otherwise.

   Already out of memory with FSDP2 (OOM)? :ref:`Try these, in order <oom-path>`: bf16 mixed
   precision, ``reshard_after_forward=True``, the embedding and head as their own units, the
   allocator and NCCL settings, selective then full activation checkpointing, CPU offload.
   Predicted for Llama-3-8B on :claim:`oom.path.world_size` GPUs at :claim:`oom.path.seq_len`
   tokens per sequence, they take a GPU from :claim:`oom.path.before <unit>` to
   :claim:`oom.path.after <unit>`; the first two alone reach :claim:`oom.path.first_fit <unit>`,
   under an H100's memory.

Measured on CPU gloo processes under a Linux memory limit (tiny models, two shared cores). The
GPU numbers of the first section are predicted from the site's memory model, and labelled so.

Every rank gets a hard memory budget: the kernel refuses to grow its data segment beyond it
(``RLIMIT_DATA``), so over-use is a real ``can't allocate memory`` error, not a number on a chart.
Under ``torchrun`` on GPUs the same budget caps the GPU instead
(``torch.cuda.set_per_process_memory_fraction``), and DDP fails with ``CUDA out of memory``.
One model, with SGD and momentum, is trained three ways under that same budget: DDP must
**fail**, with the launcher naming the rank, how much it asked for and the budget; FSDP2 on as
many ranks, and on twice as many, must **complete** and match a single-process reference. If DDP
unexpectedly fits, or FSDP2 does not, the docs build fails and says which.
"""

# %%
# .. _oom-path:
#
# Out of memory (OOM) with FSDP2? What to try, in order
# -----------------------------------------------------
#
# .. index::
#    ! expandable_segments
#    ! OOM
#
# Measure first, on the rank that failed: ``torch.cuda.max_memory_allocated()`` after a step is
# the peak of live tensors; ``torch.cuda.memory._record_memory_history()`` and then
# ``torch.cuda.memory._dump_snapshot("oom.pickle")`` (open it at pytorch.org/memory_viz) show
# which blocks were alive at that peak; ``torch.cuda.memory_reserved()`` far above the allocated
# peak is the allocator's fragmentation, not your tensors. Then try these, each on top of the
# ones before, cheapest in step time first. In plain PyTorch (two of them are environment
# variables, set before CUDA and NCCL start):
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                    fully_shard)
from torch.distributed.tensor import DTensor

# GPU-only, in the job's environment:
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   fewer reserved but unused bytes
#   TORCH_NCCL_AVOID_RECORD_STREAMS=1                   NCCL frees a collective's tensors sooner


def shard_to_fit(model: torch.nn.Module, mesh, *, bf16: bool = True, reshard: bool = True,
                 split_root: bool = False, checkpoint: bool = False,
                 offload: bool = False) -> torch.nn.Module:
    """FSDP2 with each memory saver a switch: bf16 compute with fp32 shards, each block freed
    after its forward, the embedding and head as their own units (Llama: ``tok_embeddings`` and
    ``[norm, output]``), full activation checkpointing, the shards and optimizer on the CPU."""
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())  # fault-point: mp-policy
    kw = dict(mesh=mesh, mp_policy=mp, offload_policy=CPUOffloadPolicy() if offload
              else OffloadPolicy())
    for i, block in enumerate(model.blocks):
        if checkpoint:  # before fully_shard, so the recomputed forward gathers the block again
            block = model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
        fully_shard(block, reshard_after_forward=reshard, **kw)
    if split_root:
        fully_shard(model.tok_emb, **kw)  # fault-point: embedding-unit
        fully_shard([model.ln_f, model.head], **kw)  # fault-point: head-unit
    return fully_shard(model, **kw)


def gathered_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters FSDP2 holds unsharded right now (those that are not DTensors)."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                for p in model.parameters() if not isinstance(p, DTensor)}
    return sum(storages.values())


# %%
# Each step, predicted for a named model
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# :func:`guide.memory.oom.ladder` prices each step with the site's memory model (the calculator's:
# :func:`guide.memory.fit.per_gpu` for model state and FSDP2's buffers,
# :func:`guide.memory.activation_bytes` for the activations) for Llama-3-8B with AdamW, one
# sequence per GPU. The run that failed is fp32 with ``reshard_after_forward=False``, no
# checkpointing and the root (embeddings, final norm, untied head) one unit. *Saves* is the total
# before the step minus the total after it, so it depends on the order: checkpointing saves half
# as much once the activations are bf16. The allocator and NCCL steps change nothing the model
# counts; they are GPU-only and measured, never predicted.
#
# Where the fp32 copies live under ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32)``: in the shards. Each rank keeps its 1/N of the parameters in fp32
# (they are the master weights), its 1/N of the gradients in fp32 and AdamW's two fp32 moments of
# that 1/N. Only what a unit gathers, its unsharded gradients and the activations are bf16 (the
# reduce-scatter's input is cast back to fp32). So mixed precision leaves the model state alone and
# halves everything transient; ``CPUOffloadPolicy`` is what moves the fp32 shards off the GPU.
import guide
from guide import checks
from guide.memory import GiB, PRESETS, oom as oom_path, unsharded_param_bytes
from guide.memory.fit import GPU_BYTES
from guide.memory.predicted import GPU_MEMORY_CONSTANTS

PAGE = guide.Page(section="Memory", order=2, key_api="fully_shard(", world_size=2,
                  supports=(2, 4, 8))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
LLAMA, GPU = "llama-3-8b", "H100 (80 GB)"
GPU_NAME = GPU.split(" (")[0]  # the name alone: its memory is the cited constant
ARCH = PRESETS[LLAMA]
N_GPUS = PAGE.state("oom.path.world_size", 8, "GPUs", model=LLAMA)
SEQ = PAGE.state("oom.path.seq_len", 8192, "tokens", model=LLAMA)
PATH_RUN = dict(model=LLAMA, world_size=N_GPUS, seq_len=SEQ, micro_batch=1, optimizer="adamw",
                norm="fused")
gpu_mib = PAGE.cite(GPU_MEMORY_CONSTANTS[GPU])
rungs = oom_path.ladder(ARCH, N_GPUS, seq_len=SEQ, micro_batch=1, optimizer="adamw")
MEASURED_HERE = {"mixed_precision", "reshard", "units", "full_ac"}  # by the CPU run below


def evidence(step) -> str:
    if step is None:
        return "predicted"
    if step.change is None:
        return "GPU-only, not modelled: measure it"
    return ("measured here on CPU (below), predicted for GPU" if step.key in MEASURED_HERE
            else "GPU-only, predicted" if step.gpu_only else "predicted")


path_rows = []
for r in rungs:
    total = None if r.bytes is None else r.bytes["total"] / GiB
    path_rows.append((
        "the run that failed" if r.step is None else r.step.what,
        "-" if r.saved is None else r.saved / GiB,
        "-" if total is None else total,
        "-" if total is None else ("yes" if r.bytes["total"] <= GPU_BYTES[GPU] else "no"),
        evidence(r.step)))
with PAGE.scope(**PATH_RUN):
    PAGE.show("oom.path", path_rows,
              ["step", "saves", "per GPU after", f"fits an {GPU_NAME}", "evidence"],
              formats={"saves": ",.2f", "per GPU after": ",.2f"},
              title=f"GiB per GPU, {LLAMA}, N = {N_GPUS}, {SEQ:,} tokens, AdamW, one "
                    f"sequence per GPU; an {GPU_NAME} has {gpu_mib:,} MiB",
              keys=["baseline" if r.step is None else r.step.key for r in rungs])
PAGE.show(None, [(s.what, s.code, s.cost, s.measure) for s in oom_path.STEPS],
          ["step", "turn it on", "what it costs", "measure it with"],
          title="How to turn each step on and how to see what it saved")

# %%
# Two of these savings have a value that does not need the model. ``reshard_after_forward=True``
# frees every block after its forward, but during the backward two blocks (the one computing and
# the one prefetched) and the root are gathered anyway: it saves the parameters of all blocks but
# two, in bf16, which the config alone gives (``2h + 2h² + 2h·kv + 3h·m`` per block).
# ``CPUOffloadPolicy`` moves the fp32 parameter and gradient shards and AdamW's two fp32 moments:
# sixteen bytes per parameter over N, and AdamW's fp32 step count, one per parameter tensor.
by_key = {r.step.key: r for r in rungs if r.step is not None}
h, kv, m = ARCH.hidden, ARCH.kv_heads * ARCH.hidden // ARCH.heads, ARCH.mlp
block_params = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * m
reshard_saved = PAGE.check("oom.path.reshard.saved_vs_formula", checks.expect_close(
    "OOM path", f"{LLAMA} reshard_after_forward=True", by_key["reshard"].saved / GiB,
    (ARCH.layers - 2) * block_params * 2 / GiB, 0, "GiB saved", unit="GiB",
    against="(layers - 2) blocks' bf16 parameters from the config"), fmt=".2f", **PATH_RUN)
offload_saved = PAGE.check("oom.path.offload.saved_vs_formula", checks.expect_close(
    "OOM path", f"{LLAMA} CPUOffloadPolicy", by_key["offload"].saved / GiB,
    (16 * ARCH.n_params / N_GPUS + 4 * len(ARCH.param_shapes())) / GiB, 0, "GiB saved",
    unit="GiB", against="sixteen bytes per parameter over N, four per tensor (AdamW's step)"),
    fmt=".2f", **PATH_RUN)
fitting = [r for r in rungs if r.bytes and r.bytes["total"] <= GPU_BYTES[GPU]]
checks.expect("OOM path", f"{LLAMA} on an {GPU_NAME}", fitting[0].step.key == "reshard",
              f"the first step that fits is {fitting[0].step.key!r}, not reshard_after_forward: "
              "the verdict's 'the first two alone' no longer holds.")
first_fit = fitting[0].step.what
with PAGE.scope(**PATH_RUN):
    PAGE.state("oom.path.before", round(rungs[0].bytes["total"] / GiB, 1), "GiB")
    PAGE.state("oom.path.after", round(rungs[-1].bytes["total"] / GiB, 1), "GiB")
    PAGE.state("oom.path.first_fit", round(fitting[0].bytes["total"] / GiB, 1), "GiB")
# The model's own counts hold whatever the run: the landing page states them with no assumptions.
PAGE.state("llama-3-8b.block_params", block_params, "parameters")
PAGE.state("llama-3-8b.params", ARCH.n_params, "parameters")
PAGE.state("llama-3-8b.param_tensors", len(ARCH.param_shapes()), "tensors")
print(f"reshard_after_forward=True saves {reshard_saved:.2f} GiB: the bf16 parameters of every "
      f"block but two, {block_params:,} each. CPU offload saves {offload_saved:.2f} GiB: sixteen "
      f"bytes for each of {ARCH.n_params:,} parameters over N, and AdamW's step count for each of "
      f"{len(ARCH.param_shapes())} tensors. The first step under the {GPU_NAME}'s "
      f"{gpu_mib:,} MiB: {first_fit}.")

# %%
# Measured here: what each step frees, on CPU ranks
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``shard_to_fit`` on a small model, one switch more per run, on gloo ranks. After the forward (the
# backward's peak is about to start) each rank counts the bytes of parameters still gathered
# (``gathered_bytes``, from the tensors) and what the blocks saved for backward
# (:class:`guide.saved_tensors.SavedTensors`, from autograd's own hooks). Each is checked against
# its prediction from the parameter shapes or the activation model. CPU offload, the allocator and
# NCCL need a GPU and are not run.
from guide.data import synthetic_batches
from guide.memory import activations as act_model
from guide.memory import Architecture, param_shapes
from guide.model import ModelConfig, build_model
from guide.saved_tensors import SavedTensors
from guide.training import next_token_loss
from torch.distributed.device_mesh import init_device_mesh

SMALL = ModelConfig(vocab=128, d_model=64, n_layers=4, n_heads=4, d_mlp=256, max_seq=32)
TOKENS = synthetic_batches(steps=1, batch_size=4, seq_len=32, vocab=SMALL.vocab, seed=0)[0]
#: One run per step measured here, each adding one switch of ``shard_to_fit``.
SAVER_RUNS = {"the run that failed": dict(bf16=False, reshard=False),
              "mixed_precision": dict(bf16=True, reshard=False),
              "reshard": dict(bf16=True, reshard=True),
              "units": dict(bf16=True, reshard=True, split_root=True),
              "full_ac": dict(bf16=True, reshard=True, split_root=True, checkpoint=True)}


def savers_worker(rank: guide.Rank) -> dict[str, tuple[int, int]]:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    out = {}
    for name, switches in SAVER_RUNS.items():
        torch.manual_seed(0)
        model = shard_to_fit(build_model(SMALL, device=rank.device), mesh, **switches)
        with SavedTensors(model.blocks) as saved:
            loss = next_token_loss(model, TOKENS.to(rank.device))
        out[name] = (gathered_bytes(model), saved.nbytes)
        loss.backward()
    return out


savers = guide.launch(savers_worker, WORLD_SIZE)

KiB = 2**10
s, b = TOKENS.shape[1] - 1, TOKENS.shape[0]
small_model = build_model(SMALL)
shapes_of = {"all": param_shapes(small_model),
             "root": [tuple(p.shape) for n, p in small_model.named_parameters()
                      if not n.startswith("blocks.")],
             "root less embedding and head": [tuple(small_model.pos_emb.weight.shape)]}
#: The small model's shape for the activation model: its bf16 blocks save what
#: :func:`guide.memory.activations.block_bytes` counts, except that on CPU LayerNorm keeps its two
#: statistics per token in bf16 where the model (a GPU's fused norm) counts fp32.
SMALL_ARCH = Architecture(vocab=SMALL.vocab, hidden=SMALL.d_model, layers=SMALL.n_layers,
                          heads=SMALL.n_heads, mlp=SMALL.d_mlp, gated_mlp=False, bias=True,
                          layernorm=True, learned_positions=True, max_seq_len=SMALL.max_seq)
BF16_BLOCKS = SMALL.n_layers * act_model.block_bytes(SMALL_ARCH, s, b, norm="fused",
                                                     bytes_per_element=2)
CPU_NORM_STATS = SMALL.n_layers * 2 * 2 * s * b * 2  # per block: 2 norms x 2 statistics x 2 bytes
#: What each run should keep gathered after its forward, and (where the activation model has an
#: exact count) what its blocks should save: fp32 every operation, or each block's bf16 input.
PREDICTED = {
    "the run that failed": ("all", "fp32", SMALL.n_layers * act_model.tinylm_layer_bytes(SMALL, s, b)),
    "mixed_precision": ("all", "bf16_mixed", BF16_BLOCKS),
    "reshard": ("root", "bf16_mixed", BF16_BLOCKS),
    "units": ("root less embedding and head", "bf16_mixed", BF16_BLOCKS),
    "full_ac": ("root less embedding and head", "bf16_mixed",
                SMALL.n_layers * act_model.checkpointed_layer_bytes(SMALL.d_model, s, b, 2)),
}
SMALL_RUN = dict(model=repr(SMALL), world_size=WORLD_SIZE, seq_len=s, micro_batch=b)
cpu_rows, previous = [], None
for name, (part, precision, want_saved) in PREDICTED.items():
    gathered = max(r[name][0] for r in savers)
    saved = max(r[name][1] for r in savers)
    checks.expect("OOM path, measured", name, len({r[name] for r in savers}) == 1,
                  f"ranks disagree: {[r[name] for r in savers]}")
    want = unsharded_param_bytes(shapes_of[part], WORLD_SIZE, precision)
    got = checks.expect_close("OOM path, measured", f"{name}: gathered after forward", gathered,
                              want, 0, "bytes", unit="B", against=f"the {part} parameter shapes")
    # bf16 blocks with LayerNorm (not checkpointed): within the statistics' bytes CPU rounds off
    tol = CPU_NORM_STATS if want_saved == BF16_BLOCKS else 0
    got_saved = checks.expect_close(
        "OOM path, measured", f"{name}: blocks' saved activations", saved, want_saved, tol,
        "bytes", unit="B", against="guide.memory.activations' count")
    freed = None if previous is None else (previous - (gathered + saved)) / KiB
    cpu_rows.append((name if name == "the run that failed" else by_key[name].step.what,
                     got.scaled(1 / KiB, "KiB"), want / KiB, got_saved.scaled(1 / KiB, "KiB"),
                     want_saved / KiB, "-" if freed is None else freed))
    previous = gathered + saved
CPU_COLUMNS = ["run", "gathered, measured", "gathered, predicted", "block activations, measured",
               "block activations, predicted", "freed by the step"]
with PAGE.scope(**SMALL_RUN):
    PAGE.show("oom.path.cpu", cpu_rows, CPU_COLUMNS,
              formats={c: ",.1f" for c in CPU_COLUMNS[1:]},
              title=f"KiB per rank after the forward, {WORLD_SIZE} gloo ranks, a small model",
              keys=list(PREDICTED))
print("Measured on CPU, each step freed what the model predicts: the gathered parameters halve "
      "in bf16, the blocks leave after their forward, the embedding and head leave with their own "
      "units, and checkpointed blocks keep only their input.")


# %%
# DDP or FSDP2: the code to copy
# ------------------------------
# The rest of the page measures the first choice: when DDP runs out of memory and FSDP2 does not.
# The two wraps, in plain PyTorch. DDP keeps the whole model, its gradients, the optimizer state
# and a second copy of the gradients (its buckets) on every rank. ``fully_shard`` on each block and
# then on the root keeps 1/N of parameters, gradients and optimizer state per rank, plus, during
# the step, the root (gathered from forward to backward), the block it computes and the next one it
# prefetches, and one block's unsharded gradients (:func:`guide.memory.fsdp2_buffer_bytes`).
# ``zero_grad(set_to_none=True)`` (the default) frees the gradients between
# steps, so the next forward's activations never sit beside them.
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap(model: torch.nn.Module, strategy: str, device_type: str = "cpu") -> torch.nn.Module:
    """``"ddp"``: a full replica per rank. ``"fsdp2"``: each block one unit, then the root."""
    if strategy == "ddp":
        return DDP(model)  # on GPU: DDP(model.cuda(rank), device_ids=[rank])
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# %%
# The model and the budget
# ------------------------
# The model is :class:`guide.model.TinyLM` made wide (``d_model=512``, ``d_mlp=2048``,
# ``n_layers=6``), so that its state, not the Python runtime, decides who fits. ``P`` is its fp32
# parameter bytes. The optimizer is SGD with momentum, one moment per parameter. (AdamW at the
# site's learning rate does not learn on this wide model in a few steps, and a run that matches a
# reference which does not learn proves nothing.)
#
# ``RLIMIT_DATA`` counts the rank's *whole* data segment (``VmData``), including the hundreds of MiB
# it starts with (``torch`` imported, the process group up). So the budget is set relative to that
# start, read inside the ranks before they build the model
# (:func:`guide.memory.data_segment_bytes`): each rank may grow by ``HEADROOM × P``. The headroom
# sits between the two strategies' needs: DDP holds 4 P after ``step()``, before ``zero_grad``
# (parameters, gradients, momentum, and DDP's buckets); FSDP2 holds 3 P / N plus its transient
# buffers (the root and two blocks gathered, one block's gradients).
import dataclasses
import math
import re

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

import guide
from guide import checks, memory
from guide.data import synthetic_batches
from guide.memory import (PeakMemory, current_bytes, data_segment_bytes, prepare,
                          release_freed_heap)
from guide.memory.budget import budget as rank_budget, is_out_of_memory
from guide.model import ModelConfig, build_model
from guide.plotting import legend_below, style
from guide.sharding import Strategy
from guide.training import make_optimizer, mean_over_ranks, train_steps
from guide.reference import reference_run

MiB = 2**20
CFG = ModelConfig(vocab=128, d_model=512, n_layers=6, n_heads=8, d_mlp=2048, max_seq=32)
OPTIMIZER = "sgd_momentum"
STEPS = 3
BATCHES = synthetic_batches(steps=STEPS, batch_size=8, seq_len=16, vocab=CFG.vocab,
                            seed=0)
#: × P: room each rank may grow by above its own start
HEADROOM = 3.5  # fault-point: headroom
#: FSDP2's jobs: 2 and 4 fresh ranks with python; torchrun's N alone under torchrun.
FSDP_NS = (WORLD_SIZE,) if guide.under_torchrun() else (2, 4)
if guide.under_torchrun():  # this process runs the jobs: no big allocation may stay in its heap,
    prepare()  # where freed space is reused without growing the data segment the budget caps
RUN = dict(model=repr(CFG), optimizer=OPTIMIZER, precision="fp32", steps=STEPS)

SHAPES = memory.param_shapes(build_model(CFG))
n_params = PAGE.state("tinylm.oom.params", sum(math.prod(s) for s in SHAPES),
                      "parameters", model=repr(CFG))
P = n_params * 4
p_mib = PAGE.state("tinylm.oom.params_fp32", round(P / MiB, 1), "MiB", model=repr(CFG))
print(f"model: {n_params:,} parameters, P = {p_mib:.1f} MiB in fp32")

# %%
# One worker, two strategies
# --------------------------
# The worker builds the model on every rank with the same seed, wraps it with ``wrap`` above
# and trains ``STEPS`` steps. Around the
# training it measures the rank's peak resident memory with :class:`guide.memory.PeakMemory`
# (``VmHWM`` after a reset; see the method below), and at the end it reads what the rank really
# holds (:func:`guide.memory.measure`: model state plus DDP's buckets). ``prepare()`` makes freed
# memory leave the process, so that both the budget and the measurement track live tensors, not
# heap fragmentation. It also reports the data segment it started with.


@dataclasses.dataclass(frozen=True)
class OOMResult:
    """One rank's run: its losses, its peak above the start, VmData at the start, state held."""

    losses: list[float]
    peak: int
    start_vmdata: int
    stale_grad_bytes: int
    held: int


def train_worker(rank: guide.Rank, strategy: Strategy) -> OOMResult:
    start_vmdata = data_segment_bytes()
    prepare()
    start = current_bytes()
    model = build_model(CFG, device=rank.device)
    model = wrap(model, strategy.value, rank.device.type)
    opt = make_optimizer(OPTIMIZER, model.parameters())
    stale = []  # gradient bytes still allocated as each step's forward starts (after zero_grad)
    model.register_forward_pre_hook(lambda m, _: stale.append(
        sum(q.grad.nbytes for q in m.parameters() if q.grad is not None)))
    with PeakMemory(rank.device) as peak:
        losses = train_steps(model, opt, BATCHES, rank)
    return OOMResult(losses, peak.peak_level_bytes - start, start_vmdata, max(stale),
                     memory.measure(model, opt).total)  # held: model state + DDP's buckets


def start_level(rank: guide.Rank) -> int:
    """VmData of a fresh rank before it builds anything: the budget's zero."""
    return data_segment_bytes()


# Under torchrun there are no fresh ranks: the jobs run in torchrun's processes, which already ran
# the script above. Each job first hands the heap's free pages back to the kernel (else memory the
# single-process reference freed is reused unseen: DDP x2 measured 158 MiB, not its 4 P), and
# under a budget it caps its own memory at its level then plus the same headroom, lifting the cap
# when the job ends (``rank_budget``, :func:`guide.memory.budget.budget`: the data segment on CPU,
# the caching allocator's share of the GPU with CUDA). An allocation failure comes back as that
# rank's result, so that every rank reaches the job's end.
def torchrun_worker(rank: guide.Rank, strategy: Strategy, headroom_bytes: int | None = None
                    ) -> OOMResult | dict:
    prepare()
    release_freed_heap()
    if headroom_bytes is None:
        return train_worker(rank, strategy)
    with rank_budget(rank.device, headroom_bytes) as limit:
        try:
            return train_worker(rank, strategy)
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            return {"oom": f"{type(exc).__name__}: {exc}", "limit_mib": limit // MiB}


# %%
# How much DDP needs, without a budget
# ------------------------------------
# First DDP runs free, to put a number on what it needs (and to read a fresh 2-rank start); a tiny
# job reads the start of 4 fresh ranks. The budget is the larger start plus the headroom.
ref_losses, _ = reference_run(CFG, OPTIMIZER, BATCHES)
ddp_free = guide.launch(torchrun_worker if guide.under_torchrun() else train_worker, WORLD_SIZE,
                        Strategy.DDP)
checks.assert_losses_match(f"DDP x{WORLD_SIZE} without a budget", ref_losses,
                           mean_over_ranks([r.losses for r in ddp_free]), against=checks.SINGLE_PROCESS)
START = max(*guide.launch(start_level, max(FSDP_NS)), *(r.start_vmdata for r in ddp_free))
BUDGET_MIB = math.ceil((START + HEADROOM * P) / MiB)
headroom = BUDGET_MIB * MiB - START
need = max(r.peak for r in ddp_free)
# If DDP peaks inside the headroom, raise the model's size or lower HEADROOM: DDP's failure
# below would not be its state.
need_order = checks.expect_order("DDP out of memory", f"DDP x{WORLD_SIZE}", headroom / MiB,
                                 need / MiB, low_name="the headroom",
                                 high_name="DDP's unconstrained peak", unit="MiB", keep="high")
start_mib = PAGE.state("oom.fresh_rank.vmdata", round(START / MiB), "MiB",
                       world_size=" and ".join(map(str, sorted({WORLD_SIZE, *FSDP_NS}))))
budget = PAGE.state("oom.budget_per_rank", BUDGET_MIB, "MiB", headroom_p=HEADROOM, **RUN)
need_mib = PAGE.check(f"oom.ddp.n{WORLD_SIZE}.unconstrained_peak", need_order, fmt=".0f", **RUN)
# Under torchrun the ranks are not fresh: they ran this script (and the reference) first.
where = ("torchrun's ranks start the jobs" if guide.under_torchrun()
         else "a fresh rank starts")
print(f"{where} with VmData = {start_mib} MiB; budget per rank = {budget} "
      f"MiB = start + {HEADROOM} × P. Unconstrained, DDP x{WORLD_SIZE} peaks {need_mib} MiB above "
      "its start.")

# %%
# Under the budget: DDP fails, FSDP2 trains
# -----------------------------------------
# ``guide.launch(..., memory_limit_mib=BUDGET_MIB)`` sets the limit inside each rank just before the
# worker runs. An allocation beyond it makes PyTorch's CPU allocator raise
# ``DefaultCPUAllocator: can't allocate memory``, which the launcher reports as
# :class:`guide.RankOutOfMemory`.


def run_under_budget(strategy: Strategy, n: int) -> list[dict] | guide.RankOutOfMemory:
    """The ranks' results, or the out-of-memory error that stopped them."""
    if guide.under_torchrun():
        return _under_budget_in_torchrun(strategy, n)
    try:
        return guide.launch(train_worker, n, strategy, memory_limit_mib=BUDGET_MIB)
    except guide.RankOutOfMemory as oom:
        return oom


def _under_budget_in_torchrun(strategy: Strategy, n: int) -> list[OOMResult] | guide.RankOutOfMemory:
    results = guide.launch(torchrun_worker, n, strategy, headroom)
    failed = [(r, res) for r, res in enumerate(results) if isinstance(res, dict)]
    if not failed:
        return results
    r, res = failed[0]
    asked = re.search(r"tried to allocate (\d+) bytes", res["oom"])
    return guide.RankOutOfMemory(
        f"rank {r} of {strategy} x{n} ran out of memory under {res['limit_mib']} MiB (its "
        f"start + {headroom / MiB:.0f} MiB): {res['oom'].splitlines()[0]}", r,
        res["oom"].split(":")[0], "", int(asked[1]) if asked else None, res["limit_mib"])


oom = run_under_budget(Strategy.DDP, WORLD_SIZE)
checks.expect("DDP out of memory", f"DDP x{WORLD_SIZE}",
              isinstance(oom, guide.RankOutOfMemory),
              f"trained {STEPS} steps within {BUDGET_MIB} MiB per rank: the budget no "
              "longer separates DDP from FSDP2. Lower HEADROOM.")
print(str(oom).split("\n\n")[0])

fsdp = {n: run_under_budget(Strategy.FSDP2, n) for n in FSDP_NS}
loss_tol = PAGE.state("tolerance.loss", checks.LOSS_TOL, "nats")
for n, results in fsdp.items():
    checks.expect("FSDP2 fits", f"FSDP2 x{n}", isinstance(results, list),
                  f"ran out of memory under {BUDGET_MIB} MiB per rank: "
                  f"{str(results).splitlines()[0]}")
    gap = checks.assert_losses_match(f"FSDP2 x{n} under {BUDGET_MIB} MiB", ref_losses,
                                     mean_over_ranks([r.losses for r in results]),
                                     against=checks.SINGLE_PROCESS)
    gap = PAGE.check(f"oom.fsdp2.n{n}.max_loss_gap", gap, fmt=".1e", budget_mib=BUDGET_MIB, **RUN)
    print(f"FSDP2 x{n}: {STEPS} steps within {BUDGET_MIB} MiB per rank; losses match "
          f"the single-process reference within {gap:.1e} (tol {loss_tol:.0e})")

# %%
# Predicted and measured, side by side
# ------------------------------------
# *Predicted held* is :func:`guide.memory.per_rank_state_bytes` from the parameter shapes, with
# DDP's buckets (``ddp_buckets=True``, DDP's default); *measured held* is what the rank holds after
# training (:func:`guide.memory.measure`, the buckets read from DDP's reducer); *measured peak* is
# the highest resident memory during training above the rank's level before it built the model.
# The prediction must equal the measurement to the byte; the peak adds what the prediction does not
# count: activations, the root and blocks FSDP2 gathers and reduces, the optimizer's temporaries.
runs = {(Strategy.DDP, WORLD_SIZE): ddp_free,
        **{(Strategy.FSDP2, n): results for n, results in fsdp.items()}}
headroom_mib = PAGE.state("oom.headroom", round(headroom / MiB), "MiB", headroom_p=HEADROOM, **RUN)
rows = []
for (strategy, n), results in runs.items():
    predicted = memory.per_rank_state_bytes(SHAPES, strategy, n, "fp32", OPTIMIZER,
                                            ddp_buckets=True).total
    measured = max(r.held for r in results)
    held_checked = checks.expect_close("held-state prediction", f"{strategy} x{n}", measured,
                                       predicted, 0, "bytes held", against="the parameter shapes")
    key, peak = f"oom.{strategy.value}.n{n}", max(r.peak for r in results)
    held_mib = held_checked.scaled(1 / MiB, "MiB")  # recorded with the table below
    ddp = strategy is Strategy.DDP
    outcome = PAGE.state(f"{key}.under_budget",  # a text (checked above): computed
                         "fails (out of memory)" if ddp else "trains", "outcome",
                         budget_mib=BUDGET_MIB, **RUN)
    rows.append((f"{strategy} x{n}", predicted / MiB, held_mib, peak / MiB,
                 peak / headroom, outcome))

# Between steps the loop frees the gradients (``zero_grad(set_to_none=True)``): no gradient is
# allocated when a forward starts, so a step's activations never sit beside the last step's
# gradients. Zero-filled gradients (``set_to_none=False``) would compute the same losses and raise
# every peak by a gradient's size; this check catches them.
for (strategy, n), results in runs.items():
    stale = max(r.stale_grad_bytes for r in results)
    checks.expect("gradients freed between steps", f"{strategy} x{n}", stale == 0,
                  f"{stale:,} B of gradients still allocated when a forward started: "
                  "zero_grad must set them to None, or the peak holds them too")

with PAGE.scope(ddp_buckets=True, budget_mib=BUDGET_MIB, **RUN):
    PAGE.show("oom", rows, ["run", "predicted held", "measured held", "measured peak",
                      "peak / headroom", "under budget"],
               formats={"predicted held": ",.1f", "measured held": ",.1f",
                        "measured peak": ",.1f", "peak / headroom": ".0%"},
               title=f"MiB per rank (held = model state + DDP's buckets); headroom "
                     f"{headroom_mib} MiB above the ranks' start, P = {p_mib:.1f} MiB",
               keys=[f"{s.value}.n{n}" for s, n in runs])
asked = ("an unknown amount" if oom.requested_bytes is None else "{:.1f} MiB".format(
    PAGE.state(f"oom.ddp.n{WORLD_SIZE}.requested_at_failure", oom.requested_bytes / MiB,
               "MiB", fmt=".1f", world_size=WORLD_SIZE, **RUN)))  # the allocator's report
over = PAGE.check(f"oom.ddp.n{WORLD_SIZE}.need_vs_headroom", checks.expect_order(
    "DDP out of memory", f"DDP x{WORLD_SIZE}", 1.0, need / headroom, low_name="1",
    high_name="DDP's peak / headroom", unit="x", keep="high"), fmt=".2f", headroom_p=HEADROOM,
    **RUN)
print(f"\nUnder the budget DDP's rank {oom.rank} asked for {asked} with "
      f"{oom.limit_mib} MiB allowed; unconstrained it needs {over:.2f}x the headroom.")
held_of = {run: row[2] for run, row in zip(runs, rows)}
PAGE.conclude(
    f"When to switch: DDP x{WORLD_SIZE} holds {held_of[Strategy.DDP, WORLD_SIZE]:.1f} MiB between "
    f"steps and needs {over:.2f}x the memory each rank may use, so it fails; FSDP2 holds "
    + " and ".join(f"{held_of[Strategy.FSDP2, n]:.1f} MiB at N={n}" for n in FSDP_NS)
    + " and trains under the same budget with the same losses. Use DDP while its held state "
    "(4 P here) plus activations fits a GPU; past that, use FSDP2 with N large enough that "
    "3 P / N plus its transient buffers (the root and two blocks gathered, one block's "
    "gradients) plus activations fits.")

# %%
# The picture
# -----------
# Bars are the measured per-rank peak above a fresh rank's start, the darker part what the rank
# holds after ``step()``, before ``zero_grad``; the dashed line is the budget's headroom. DDP's bar crosses it, and it did
# crash.
style()
fig, ax = plt.subplots(figsize=(7.5, 3.8))
for i, ((strategy, _), (name, _, held, peak, _, outcome)) in enumerate(zip(runs, rows)):
    ax.barh(i, peak, color=strategy.color, alpha=0.35)
    ax.barh(i, held, color=strategy.color)
    ax.text(peak + 4, i, outcome, va="center", fontsize=10)
# The axis starts at a fresh rank's VmData, so the budget shows as its headroom above that start.
ax.axvline(headroom / MiB, color="black", ls="--", lw=1.2)
ax.text(headroom / MiB, -0.8, f" budget {budget} MiB = start {start_mib} + {headroom_mib} MiB",
        fontsize=9, va="center")
ax.set_yticks(range(len(rows)), [r[0] for r in rows])
ax.set_ylim(len(rows) - 0.5, -1.15)  # inverted, with a free row on top for the budget's label
ax.set_xlim(0, max(r[3] for r in rows) * 1.35)
ax.set_xlabel("per-rank memory above the rank's start (MiB)")
ax.set_title(f"SGD + momentum, {p_mib:.1f} MiB of fp32 parameters, one budget for "
             "every rank")
# Swatches in neutral grey: each bar's colour is its strategy, its shade what the length means.
legend_below(fig, handles=[Patch(color="grey", alpha=0.35, label="measured peak"),
                           Patch(color="grey", label="held after step() (+ DDP's buckets)")])
plt.show()
# sphinx_gallery_thumbnail_number = 1

# %%
# What the peak measurement counts
# --------------------------------
# :class:`guide.memory.PeakMemory` resets the kernel's high-water mark (``echo 5 >
# /proc/self/clear_refs``) and reads ``VmHWM`` at the end: every page the rank held at its worst
# moment, tensors and everything else (gloo's buffers, Python objects, code pages touched for the
# first time). It is only a measure of tensors because ``prepare()`` lowered glibc's mmap threshold
# to :data:`guide.memory.MMAP_THRESHOLD`: with the default heap, freed blocks stay resident and
# fragment, and FSDP2 *looked* bigger than DDP. Allocations below the threshold still come from the
# heap and can be undercounted. It does not see other processes, swapped pages or memory reserved
# but never touched; the budget (``RLIMIT_DATA``) does count reserved memory, which is why the
# failure shows on the virtual side first. On CUDA it reads ``torch.cuda.max_memory_allocated``:
# tensors only.

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
