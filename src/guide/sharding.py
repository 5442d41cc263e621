"""One function per data-parallel policy, applied to :class:`guide.model.TinyLM` (as torchtitan's
``apply_fsdp`` does for Llama): the examples that compare a knob call these instead of repeating the
wrapping, so the knob they pass is the only thing that differs.

The main example (``plot_ddp_vs_fsdp2.py``) spells the same calls out in full.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["STRATEGIES", "apply_ddp", "apply_fsdp2", "wrap"]

#: The strategies :func:`wrap` knows.
STRATEGIES = ("DDP", "FSDP2")


def apply_fsdp2(model: nn.Module, mesh: Any, **options: Any) -> nn.Module:
    """``fully_shard`` each transformer block, then the root (embeddings, final norm, head).

    Each block becomes one FSDP2 unit: one all-gather of its parameters before its forward (and
    again before its backward when ``reshard_after_forward`` is true), one reduce-scatter of its
    gradients. ``options`` (``reshard_after_forward``, ``mp_policy``, ``offload_policy``, ...) go to
    every call. Every rank must have built identical weights: ``fully_shard`` does not broadcast.
    """
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(f"apply_fsdp2 expects a model with .blocks (a TinyLM), got "
                         f"{type(model).__name__}; call fully_shard on your own layers instead.")
    for block in blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def apply_ddp(model: nn.Module, rank: Any) -> nn.Module:
    """Wrap in ``DistributedDataParallel``: broadcast rank 0's weights, all-reduce gradients in
    backward. On CUDA the module is bound to this rank's GPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if rank.device.type == "cuda":
        return DDP(model, device_ids=[rank.device.index])
    return DDP(model)


def wrap(model: nn.Module, strategy: str, rank: Any, **fsdp_options: Any) -> nn.Module:
    """``model`` under ``strategy`` ("DDP" or "FSDP2", over all ranks of ``rank``'s group)."""
    if strategy == "DDP":
        if fsdp_options:
            raise ValueError(f"options {sorted(fsdp_options)} are FSDP2's; DDP takes none here.")
        return apply_ddp(model, rank)
    if strategy == "FSDP2":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(rank.device.type, (rank.world_size,))
        return apply_fsdp2(model, mesh, **fsdp_options)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}.")
