"""Deterministic synthetic token batches, and the slice of a global batch that belongs to one rank.

Each sequence is an arithmetic progression modulo the vocabulary with its own random start and
stride, so the next token is predictable from the previous two: the loss falls visibly within a few
dozen steps, which makes a broken gradient show up in the curve as well as in the numbers.
"""

from __future__ import annotations

import torch

__all__ = ["rank_slice", "synthetic_batches"]


def synthetic_batches(steps: int, batch_size: int, seq_len: int, vocab: int,
                      seed: int = 0) -> torch.Tensor:
    """``steps`` global batches of token sequences, shape ``(steps, batch_size, seq_len + 1)``.

    Position ``t`` is the input and ``t + 1`` the target, so each row carries ``seq_len`` predictions.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len),
                        ("vocab", vocab)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
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
