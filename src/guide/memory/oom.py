"""Out of memory with FSDP2: what to try, in order, and what each step saves (**predicted**).

A *ladder* of configurations, each one step on from the one before (:data:`STEPS`), priced with the
site's memory model and nothing else: :func:`guide.memory.fit.per_gpu` (model state,
``reshard_after_forward=False``'s unsharded parameters, FSDP2's transient buffers) plus
:func:`guide.memory.activation_bytes` (the blocks, the logits and their gradient, with the
checkpointing policy of the step). What a step saves is the previous total minus its own.

The order is what each step costs in step time: free first (mixed precision is faster, not
slower), then one more all-gather per block, then recomputation, then host transfers. Two steps
change nothing the model counts, and are **not predicted**: the caching allocator's fragmentation
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) and NCCL's hold on the memory of tensors a
collective used (``TORCH_NCCL_AVOID_RECORD_STREAMS=1``) show only as ``torch.cuda.memory_reserved``
above ``torch.cuda.max_memory_allocated``, on a GPU.

The baseline (:data:`BASELINE`) is the first FSDP2 script that runs out of memory: fp32 (no
``MixedPrecisionPolicy``), ``reshard_after_forward=False``, no activation checkpointing, one
``fully_shard`` unit per block and the root (embeddings, final norm, head). Nothing is counted
here: each setup is the calculator's FSDP2 layout (``"fsdp2_no_reshard"`` before the reshard step,
``"fsdp2"`` from it), with two substitutions, both from the same model:

* **the root split into units**: the embedding and the final-norm-and-head each their own
  ``fully_shard`` unit. FSDP2's buffers are then
  :func:`guide.memory.fsdp2_split_root_buffer_bytes` instead of
  :func:`guide.memory.fsdp2_buffer_bytes`. Refused for tied embeddings.
* **CPU offload** (``CPUOffloadPolicy``): the parameter and gradient shards and the optimizer
  state move to host memory (:func:`offloaded_bytes`, the model state of
  :func:`guide.memory.per_rank_state_bytes`); the gathered parameters, the gradient buffers and
  the activations stay on the GPU. The host-to-device staging copy of each unit's shard (1/N of
  a unit) is not counted.
"""

from __future__ import annotations

import dataclasses

from guide.memory.activations import activation_bytes
from guide.memory.architectures import Architecture
from guide.memory.fit import per_gpu
from guide.memory.predicted import PRECISIONS, per_rank_state_bytes
from guide.memory.transient import fsdp2_split_root_buffer_bytes

__all__ = ["BASELINE", "STEPS", "Rung", "Setup", "Step", "ladder", "offloaded_bytes",
           "predicted_bytes"]


@dataclasses.dataclass(frozen=True)
class Setup:
    """One FSDP2 configuration: ``precision`` a key of :data:`guide.memory.PRECISIONS`
    (``"fp32"`` or ``"bf16_mixed"`` here), ``reshard`` the blocks' ``reshard_after_forward``,
    ``checkpointing`` one of :data:`guide.memory.activations.CHECKPOINTING`, ``split_root`` the
    embedding and head as their own units, ``offload`` ``CPUOffloadPolicy``."""

    precision: str = "fp32"
    reshard: bool = False
    checkpointing: str = "none"
    split_root: bool = False
    offload: bool = False


#: The configuration that ran out of memory: every step below starts from it.
BASELINE = Setup()


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing to try: ``change`` (``Setup`` fields it sets; ``None``: nothing the model
    counts, not predicted), the code, what it costs, how to measure it, whether it is GPU-only."""

    key: str
    what: str
    code: str
    change: dict | None
    cost: str
    measure: str
    gpu_only: bool = True


_ALLOCATED = "torch.cuda.max_memory_allocated() before and after"
_SNAPSHOT = ("torch.cuda.memory._record_memory_history(), then "
             "torch.cuda.memory._dump_snapshot('oom.pickle'): the blocks alive at the peak")

#: What to try, in this order (each on top of the ones before).
STEPS: tuple[Step, ...] = (
    Step("mixed_precision", "bf16 compute, fp32 master",
         "fully_shard(m, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
         "reduce_dtype=torch.float32))",
         {"precision": "bf16_mixed"}, "none (faster)",
         _ALLOCATED + "; the fp32 copies stay in the shards, the gradients and AdamW's moments"),
    Step("reshard", "free each block after its forward",
         "fully_shard(block, reshard_after_forward=True)", {"reshard": True},
         "one all-gather per block in backward", _ALLOCATED + "; " + _SNAPSHOT),
    Step("units", "embedding and head their own units",
         "fully_shard(m.tok_embeddings); fully_shard([m.norm, m.output])", {"split_root": True},
         "none (more, smaller collectives)", _SNAPSHOT),
    Step("allocator", "fragmentation: fewer reserved, unused bytes",
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", None, "none",
         "torch.cuda.memory_reserved() - torch.cuda.max_memory_allocated()"),
    Step("nccl", "NCCL's hold on collective tensors", "TORCH_NCCL_AVOID_RECORD_STREAMS=1", None,
         "none", "torch.cuda.memory_reserved() across steps; " + _SNAPSHOT),
    Step("selective_ac", "selective activation checkpointing",
         "checkpoint(block, context_fn=selective policy) per block",
         {"checkpointing": "selective"}, "recompute every second matmul",
         _ALLOCATED + "; guide.saved_tensors.SavedTensors on CPU"),
    Step("full_ac", "full activation checkpointing", "checkpoint_wrapper(block) per block",
         {"checkpointing": "full"}, "one more forward per step",
         _ALLOCATED + "; guide.saved_tensors.SavedTensors on CPU"),
    Step("offload", "CPU offload", "fully_shard(m, offload_policy=CPUOffloadPolicy())",
         {"offload": True}, "host transfers, the optimizer step on the CPU",
         _ALLOCATED + "; host memory (pinned) grows by the same"),
)


def offloaded_bytes(arch: Architecture, world_size: int, precision: str, optimizer: str) -> int:
    """What ``CPUOffloadPolicy`` moves off each GPU: its parameter and gradient shards and its
    optimizer state (:func:`guide.memory.per_rank_state_bytes`, FSDP2 on ``world_size``)."""
    sb = per_rank_state_bytes(arch.param_shapes(), "fsdp2", world_size, precision, optimizer,
                              ddp_buckets=False)
    return sb.model_state


def predicted_bytes(arch: Architecture, setup: Setup, world_size: int, *, seq_len: int,
                    micro_batch: int, optimizer: str, norm: str = "fused") -> dict[str, int]:
    """The fullest GPU's bytes under ``setup``, by part: ``state`` (the shards and the optimizer
    state on the GPU), ``gathered`` (``reshard_after_forward=False``'s unsharded parameters),
    ``buffers`` (FSDP2's transient buffers), ``activations``, and their ``total``."""
    if setup.precision not in PRECISIONS:
        raise ValueError(f"unknown precision {setup.precision!r}; choose one of "
                         f"{', '.join(PRECISIONS)}.")
    if setup.split_root and not setup.reshard:
        raise ValueError("split_root prices the root's units with reshard_after_forward=True; "
                         "apply the reshard step first.")
    n = world_size  # per_gpu refuses a world size that is not a positive whole number
    act = activation_bytes(arch, seq_len, micro_batch, checkpointing=setup.checkpointing,
                           norm=norm, bytes_per_element=PRECISIONS[setup.precision].compute)
    split = per_gpu(arch, "fsdp2" if setup.reshard else "fsdp2_no_reshard", n, setup.precision,
                    optimizer, activations=act, ddp_buckets=False)
    buffers = (fsdp2_split_root_buffer_bytes(arch, setup.precision) if setup.split_root
               else split.buffers)
    state = split.params + split.grads + split.optimizer
    if setup.offload:
        state -= offloaded_bytes(arch, n, setup.precision, optimizer)
    parts = {"state": state, "gathered": split.unsharded, "buffers": buffers,
             "activations": split.activations}
    return parts | {"total": sum(parts.values())}


@dataclasses.dataclass(frozen=True)
class Rung:
    """One step of the ladder: the configuration after it, its predicted bytes (``None`` when
    the step changes nothing the model counts) and what it saved on the step before."""

    step: Step | None  # None: the baseline
    setup: Setup
    bytes: dict[str, int] | None
    saved: int | None


def ladder(arch: Architecture, world_size: int, *, seq_len: int, micro_batch: int,
           optimizer: str, norm: str = "fused", steps: tuple[Step, ...] = STEPS) -> list[Rung]:
    """The baseline, then each of ``steps`` applied on top of the ones before, priced with
    :func:`predicted_bytes`. A step that saves nothing the model counts has ``bytes`` and
    ``saved`` ``None``; a predicted step that *adds* bytes is refused (the order would be wrong)."""
    def price(setup: Setup) -> dict[str, int]:
        return predicted_bytes(arch, setup, world_size, seq_len=seq_len, micro_batch=micro_batch,
                               optimizer=optimizer, norm=norm)

    setup, before = BASELINE, price(BASELINE)
    rungs = [Rung(None, setup, before, None)]
    for step in steps:
        if step.change is None:
            rungs.append(Rung(step, setup, None, None))
            continue
        setup = dataclasses.replace(setup, **step.change)
        after = price(setup)
        saved = before["total"] - after["total"]
        if saved < 0:
            raise ValueError(f"step {step.key!r} adds {-saved:,} bytes per GPU: it does not "
                             "belong on the way out of memory in this order.")
        rungs.append(Rung(step, setup, after, saved))
        before = after
    return rungs

