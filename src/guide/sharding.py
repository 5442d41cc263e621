"""The data-parallel strategies, named once, and one ``apply_*`` function per policy.

:class:`Strategy` is the site's one vocabulary for "how the model is spread over the ranks": the
memory model, the communication model, the charts and the tables all take a ``Strategy`` (or its
key, e.g. ``"fsdp2"``) and show its :attr:`~Strategy.label` in its :attr:`~Strategy.color`.

:func:`apply_ddp` and :func:`apply_fsdp2` wrap :class:`guide.model.TinyLM` (as torchtitan's
``apply_fsdp`` does for Llama); :func:`fsdp2_units` says which parameters each ``fully_shard`` call
owns. The main example (``plot_ddp_vs_fsdp2.py``) spells the same calls out in full.
"""

from __future__ import annotations

import enum
from typing import Any

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Strategy", "apply_ddp", "apply_fsdp2", "fsdp2_units", "wrap"]


class Strategy(str, enum.Enum):
    """A data-parallel strategy. The value is the key scripts and the CLI use (``"fsdp2"``)."""

    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    FSDP2 = "fsdp2"
    FSDP2_NO_RESHARD = "fsdp2_no_reshard"

    @property
    def label(self) -> str:
        """How pages name it: ``"DDP"``, ``"ZeRO-1"``, ``"FSDP2"``, ..."""
        return _LABELS[self]

    @property
    def color(self) -> str:
        """Its colour on every chart of the site."""
        return _COLORS[self]

    @property
    def ddp_underneath(self) -> bool:
        """True where DDP's reducer (and its gradient buckets) does the gradient all-reduce."""
        return self in (Strategy.DDP, Strategy.ZERO1)

    @property
    def is_fsdp2(self) -> bool:
        return self in (Strategy.FSDP2, Strategy.FSDP2_NO_RESHARD)

    @classmethod
    def parse(cls, value: Strategy | str) -> Strategy:
        """A ``Strategy`` from itself, its key or its label; a clear error otherwise."""
        if isinstance(value, cls):
            return value
        for s in cls:
            if value in (s.value, s.label):
                return s
        raise ValueError(f"unknown strategy {value!r}; choose one of "
                         f"{[s.value for s in cls]}.")

    def __str__(self) -> str:
        return self.label


_LABELS = {Strategy.DDP: "DDP", Strategy.ZERO1: "ZeRO-1", Strategy.ZERO2: "ZeRO-2",
           Strategy.FSDP2: "FSDP2", Strategy.FSDP2_NO_RESHARD: "FSDP2 (no reshard)"}
_COLORS = {Strategy.DDP: "#1f77b4", Strategy.ZERO1: "#2ca02c", Strategy.ZERO2: "#8c564b",
           Strategy.FSDP2: "#d62728", Strategy.FSDP2_NO_RESHARD: "#9467bd"}


def fsdp2_units(model: nn.Module) -> list[list[nn.Parameter]]:
    """The parameters each ``fully_shard`` call of :func:`apply_fsdp2` owns, in forward order: the
    root (embeddings, final norm, head: what the last call picks up), then each block."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(model, nn.Module) or blocks is None:
        raise ValueError(f"expected a model with .blocks (a TinyLM), got {type(model).__name__}; "
                         "call fully_shard on your own layers instead.")
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_blocks]
    return [root, *(list(b.parameters()) for b in blocks)]


def apply_fsdp2(model: nn.Module, mesh: Any, **options: Any) -> nn.Module:
    """``fully_shard`` each transformer block, then the root (embeddings, final norm, head).

    Each block becomes one FSDP2 unit: one all-gather of its parameters before its forward (and
    again before its backward when ``reshard_after_forward`` is true), one reduce-scatter of its
    gradients. ``options`` (``reshard_after_forward``, ``mp_policy``, ``offload_policy``, ...) go to
    every call. Every rank must have built identical weights: ``fully_shard`` does not broadcast.
    """
    fsdp2_units(model)  # validates the model's shape
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def apply_ddp(model: nn.Module, rank: Any) -> nn.Module:
    """Wrap in ``DistributedDataParallel``: broadcast rank 0's weights, all-reduce gradients in
    backward. On CUDA the module is bound to this rank's GPU."""
    if rank.device.type == "cuda":
        return DistributedDataParallel(model, device_ids=[rank.device.index])
    return DistributedDataParallel(model)


def wrap(model: nn.Module, strategy: Strategy | str, rank: Any, **fsdp_options: Any) -> nn.Module:
    """``model`` under ``strategy`` (DDP or FSDP2, over all ranks of ``rank``'s group)."""
    strategy = Strategy.parse(strategy)
    if strategy is Strategy.DDP:
        if fsdp_options:
            raise ValueError(f"options {sorted(fsdp_options)} are FSDP2's; DDP takes none here.")
        return apply_ddp(model, rank)
    if strategy is Strategy.FSDP2:
        mesh = init_device_mesh(rank.device.type, (rank.world_size,))
        return apply_fsdp2(model, mesh, **fsdp_options)
    raise ValueError(f"wrap runs DDP or FSDP2; {strategy.label} is modelled, not run, here.")
