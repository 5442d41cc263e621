"""Deterministic synthetic token batches, and the slice of a global batch that belongs to one rank.

Each sequence is an arithmetic progression modulo the vocabulary with its own random start and
stride, so the next token is predictable from the previous two: the loss falls visibly within a few
dozen steps, which makes a broken gradient show up in the curve as well as in the numbers.
"""

from __future__ import annotations

import torch

from guide.validate import positive_int

__all__ = ["micro_batches", "rank_slice", "synthetic_batches"]


def synthetic_batches(steps: int, batch_size: int, seq_len: int, vocab: int,
                      seed: int = 0) -> torch.Tensor:
    """``steps`` global batches of token sequences, shape ``(steps, batch_size, seq_len + 1)``.

    Position ``t`` is the input and ``t + 1`` the target, so each row carries ``seq_len`` predictions.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len),
                        ("vocab", vocab)):
        positive_int(name, value)
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (steps, batch_size, 1), generator=gen)
    stride = torch.randint(1, 5, (steps, batch_size, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def rank_slice(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``[rank * B/N, (rank + 1) * B/N)`` of a global batch: each rank sees different data.

    The global batch must split evenly: with unequal slices the mean of the ranks' mean losses is
    not the global mean loss, and DDP/FSDP2 (which average gradients) would silently train on a
    reweighted objective.
    """
    b = batch.shape[0]
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}.")
    if b % world_size:
        raise ValueError(
            f"a global batch of {b} rows does not split evenly over {world_size} ranks; "
            f"use a batch size divisible by {world_size}.")
    per = b // world_size
    return batch[rank * per:(rank + 1) * per]


def micro_batches(batches: torch.Tensor, k: int) -> torch.Tensor:
    """Split each global batch of ``(steps, k * B, T+1)`` into ``k`` consecutive micro-batches:
    ``(steps, k, B, T+1)``, micro-batch ``m`` holding rows ``[m*B, (m+1)*B)``.

    Accumulating the gradients of the ``k`` micro-batches, each loss divided by ``k``, gives the
    gradient of the mean loss over all ``k * B`` rows: the gradient of one step on the big batch.
    """
    positive_int("k", k, "micro-batches per step")
    if batches.dim() != 3:
        raise ValueError(f"batches must be (steps, batch, seq_len + 1), got shape "
                         f"{tuple(batches.shape)}.")
    if batches.shape[1] % k:
        raise ValueError(f"a batch of {batches.shape[1]} sequences does not split into {k} equal "
                         f"micro-batches; use a batch size divisible by {k}.")
    return batches.unflatten(1, (k, batches.shape[1] // k))
