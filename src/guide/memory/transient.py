"""Bytes a rank holds only during the step, beyond model state and activations: autocast's saved
weight copies and FSDP2's gathered parameters and gradient buffers.

Both are **predicted** from shapes, and both are part of every page's "will it fit?" answer
(:func:`guide.memory.fit.per_gpu` adds them):

* :func:`autocast_weight_bytes`: DDP and ZeRO-1 train bf16 under ``torch.autocast`` with fp32
  parameters. Autocast casts each linear's fp32 weight to bf16 once per forward and the matmul
  saves that copy for backward (to compute its input's gradient): 2 bytes per parameter of every
  linear whose input requires grad, i.e. every block linear and the output head (tied or not;
  the input embedding is a lookup, not a linear; its cache is cleared when the autocast region
  ends, but autograd keeps the copies until each linear's backward). FSDP2 gathers its parameters in bf16 already
  (``MixedPrecisionPolicy``): no copies. A precision whose compute dtype is its parameter dtype
  makes none either.
* :func:`fsdp2_buffer_bytes`: ``fully_shard``'s transient buffers at the backward's peak. The
  root (embeddings, final norm, head) stays gathered from forward to backward by default, and its
  unsharded gradients (compute dtype) live until the root's reduce-scatter at the end of backward;
  during a block's backward FSDP2 holds that block and the prefetched next one gathered (compute
  dtype), the block's unsharded gradients (compute dtype) and its reduce-scatter input (the
  gradient dtype, ``reduce_dtype``). Unpadded element counts; ``reshard_after_forward=False``
  keeps every block gathered already (:func:`guide.memory.unsharded_param_bytes`), so only the
  gradient buffers are added for it.
* :func:`fsdp2_split_root_buffer_bytes`: the same buffers when the embedding and the
  final-norm-and-head are their own ``fully_shard`` units (``reshard_after_forward=True``
  everywhere), a step of the out-of-memory path (:mod:`guide.memory.oom`; the calculator's
  layouts keep the root one unit). The root's gathered copy and its unsharded gradients no longer
  sit beside the blocks' backward; the head's exist during its own backward only, with the next
  block prefetched. The buffers are the larger of those two moments.

None of these is measured on this site's CPU ranks (gloo, fp32, no autocast on the memory
pages); the counts come from what PyTorch allocates (autocast's weight cache, FSDP2's
``FSDPParamGroup`` all-gather and ``foreach_reduce``), and the published GPU measurements check
their sum (``docs/pages/memory_calculator.md``).
"""

from __future__ import annotations

import math

from guide.memory.architectures import Architecture
from guide.memory.predicted import PRECISIONS

__all__ = ["AUTOCAST_STRATEGIES", "FSDP2_STRATEGIES", "autocast_weight_bytes",
           "fsdp2_buffer_bytes", "fsdp2_split_root_buffer_bytes", "linear_params"]

#: Layouts that run the model under ``torch.autocast`` (DDP underneath, fp32 parameters).
AUTOCAST_STRATEGIES = ("ddp", "zero1")
#: Layouts that gather parameters with ``fully_shard`` (HSDP too).
FSDP2_STRATEGIES = ("fsdp2", "fsdp2_no_reshard", "hsdp")


def linear_params(arch: Architecture) -> int:
    """Elements of every linear weight whose input requires grad: each block's projection and
    MLP matrices, and the output head (the embedding matrix when tied). Biases are cast too, but
    a matmul's backward does not keep them."""
    block = sum(math.prod(s) for s in arch.fsdp2_units()[1] if len(s) == 2)
    return arch.layers * block + arch.vocab * arch.hidden


def autocast_weight_bytes(arch: Architecture, strategy: str, precision: str) -> int:
    """Bytes of the compute-dtype weight copies autocast saves for backward under ``strategy``
    (a key of :data:`guide.memory.fit.FIT_STRATEGIES`); 0 where there is no autocast."""
    p = PRECISIONS[precision]
    if strategy not in AUTOCAST_STRATEGIES or p.compute >= p.param:
        return 0
    return linear_params(arch) * p.compute


def fsdp2_buffer_bytes(arch: Architecture, strategy: str, precision: str) -> int:
    """FSDP2's transient bytes at the backward's peak (see the module docstring): the root
    gathered and its unsharded gradients (compute dtype), two blocks gathered (compute dtype),
    one block's unsharded gradients (compute dtype) and its reduce-scatter input (gradient
    dtype). ``fsdp2_no_reshard``: the gradients only (its gathered blocks are counted as
    ``unsharded``). 0 for a layout without FSDP2."""
    if strategy not in FSDP2_STRATEGIES:
        return 0
    p = PRECISIONS[precision]
    root, block = (sum(math.prod(s) for s in unit) for unit in arch.fsdp2_units()[:2])
    grads = root * p.compute + block * (p.compute + p.grad)
    if strategy == "fsdp2_no_reshard":
        return grads
    return grads + root * p.compute + 2 * block * p.compute


def fsdp2_split_root_buffer_bytes(arch: Architecture, precision: str) -> int:
    """FSDP2's transient bytes with the embedding and the final-norm-and-head as their own units
    (see the module docstring): the larger of the blocks' backward (two blocks gathered, one
    block's unsharded gradients and reduce-scatter input; the head's unit no longer gathered) and
    the head's backward (the final norm and head gathered, their unsharded gradients and
    reduce-scatter input, the next block prefetched). Tied embeddings are refused: one parameter
    cannot be in two ``fully_shard`` units."""
    if arch.tied_embeddings:
        raise ValueError("tied embeddings: the embedding and the head are one parameter, which "
                         "cannot be in two fully_shard units; keep them in the root.")
    p = PRECISIONS[precision]
    embeddings, layer, tail = arch._parts()  # tail: the final norm, then the head
    head = sum(math.prod(s) for s in tail)
    block = sum(math.prod(s) for s in layer)
    blocks_phase = 2 * block * p.compute + block * (p.compute + p.grad)
    head_phase = head * (2 * p.compute + p.grad) + block * p.compute
    return max(blocks_phase, head_phase)
