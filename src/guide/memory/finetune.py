"""Predicted bytes per rank when fine-tuning under FSDP2: a frozen base and trainable adapters.

Fine-tuning with LoRA (or any frozen base) changes the ZeRO accounting of
:mod:`guide.memory.predicted`: a frozen parameter is held (its shard, padded like every FSDP2
parameter) but gets no gradient and no optimizer state; only the trainable parameters (the
adapters) carry gradients and moments. Both parts are ``fully_shard``'s ``Shard(0)`` split, so
:func:`finetune_state_bytes` reuses the FSDP2 rule of :func:`~guide.memory.state_bytes_by_rank`:
``ceil(dim0/N)`` padded rows per rank for parameters and gradients, the rank's real rows for the
optimizer state, plus AdamW's ``step`` counter per trainable tensor. The fine-tuning page asserts it
to the byte against :func:`guide.memory.measure` on a live LoRA run.

:func:`lora_shapes` gives the adapter shapes of a LoRA of rank ``r`` on a list of linear weights
(``A``: ``(r, d_in)``, ``B``: ``(d_out, r)``); :func:`lora_state_bytes` prices a rank-``r`` LoRA of
every linear weight of every layer of an :class:`~guide.memory.architectures.Architecture` (what
``guide-memory --lora-rank R`` prints).
"""

from __future__ import annotations

from collections.abc import Sequence

from guide.memory.architectures import Architecture
from guide.memory.predicted import state_bytes_by_rank
from guide.memory.state import StateBytes
from guide.validate import positive_int

__all__ = ["finetune_state_bytes", "lora_shapes", "lora_state_bytes"]


def lora_shapes(linear_shapes: Sequence[Sequence[int]], rank: int) -> list[tuple[int, int]]:
    """The shapes of the LoRA adapters of rank ``rank`` on linear weights of shape
    ``(d_out, d_in)``: ``A`` ``(rank, d_in)`` then ``B`` ``(d_out, rank)`` for each.

    >>> lora_shapes([(768, 256)], 8)
    [(8, 256), (768, 8)]
    """
    positive_int("rank", rank, "the LoRA rank")
    out = []
    for i, shape in enumerate(linear_shapes):
        dims = tuple(shape)
        if len(dims) != 2:
            raise ValueError(f"linear_shapes[{i}] = {shape!r}: a linear weight is (d_out, d_in).")
        d_out, d_in = dims
        out += [(rank, d_in), (d_out, rank)]
    return out


def finetune_state_bytes(frozen_shapes: Sequence[Sequence[int]],
                         trainable_shapes: Sequence[Sequence[int]], world_size: int, *,
                         frozen_precision: str, trainable_precision: str,
                         optimizer: str) -> list[StateBytes]:
    """Predicted bytes of every rank, in rank order, for FSDP2 fine-tuning: the frozen parameters'
    shards (in ``frozen_precision``'s parameter bytes: ``"bf16"`` for a bf16 base, ``"fp32"``)
    plus the trainable parameters' shards, gradients and ``optimizer`` state (in
    ``trainable_precision``). Every precision and optimizer is a key of
    :data:`~guide.memory.PRECISIONS` / :data:`guide.optimizers.OPTIMIZERS`.

    >>> [s.model_state for s in finetune_state_bytes([(4, 4)], [(2, 4), (4, 2)], 2,
    ...  frozen_precision="bf16", trainable_precision="fp32", optimizer="adamw")]
    [152, 152]
    """
    n = positive_int("world_size", world_size, "the number of ranks")
    if not trainable_shapes:
        raise ValueError("trainable_shapes is empty: fine-tuning trains something (the adapters).")
    trained = state_bytes_by_rank(trainable_shapes, "fsdp2", n, trainable_precision, optimizer,
                                  ddp_buckets=False)
    if not frozen_shapes:
        return trained
    frozen = state_bytes_by_rank(frozen_shapes, "fsdp2", n, frozen_precision, "sgd",
                                 ddp_buckets=False)  # SGD: no state; the params are all we keep
    return [t + StateBytes(f.params, 0, 0, 0) for t, f in zip(trained, frozen)]


def lora_state_bytes(arch: Architecture, lora_rank: int, world_size: int, *,
                     base_precision: str, adapter_precision: str,
                     optimizer: str) -> list[StateBytes]:
    """Predicted bytes of every rank for a rank-``lora_rank`` LoRA of every linear weight (2-D
    shape) of every layer of ``arch`` (attention and MLP; not the embeddings or the head), the
    whole model frozen in ``base_precision``, one ``fully_shard`` group per layer as on the page.

    >>> arch = Architecture(vocab=8, hidden=4, layers=1, heads=1, mlp=4, gated_mlp=False)
    >>> [s.model_state for s in lora_state_bytes(arch, 1, 1, base_precision="fp32",
    ...  adapter_precision="fp32", optimizer="sgd")]
    [1072]
    """
    positive_int("lora_rank", lora_rank, "the adapters' rank")
    linears = [s for layer in arch.fsdp2_units()[1:] for s in layer if len(s) == 2]
    return finetune_state_bytes(arch.param_shapes(), lora_shapes(linears, lora_rank), world_size,
                                frozen_precision=base_precision,
                                trainable_precision=adapter_precision, optimizer=optimizer)
