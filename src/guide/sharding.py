"""The data-parallel strategies, named once, and one ``apply_*`` function per policy.

:class:`Strategy` is the site's one vocabulary for "how the model is spread over the ranks": the
memory model, the communication model, the charts and the tables all take a ``Strategy`` (or its
key, e.g. ``"fsdp2"``) and show its :attr:`~Strategy.label` in its :attr:`~Strategy.color`.

:func:`apply_ddp` and :func:`apply_fsdp2` wrap :class:`guide.model.TinyLM` (as torchtitan's
``apply_fsdp`` does for Llama); both take the model and the ``DeviceMesh`` it runs over, and are the
library's one spelling of each. :func:`fsdp2_units` says which parameters each ``fully_shard`` call
owns. The main example (``plot_ddp_vs_fsdp2.py``) spells the same calls out in full.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Strategy", "apply_ddp", "apply_fsdp2", "fsdp2_units"]


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


def apply_fsdp2(model: nn.Module, mesh: DeviceMesh, **options: Any) -> nn.Module:
    """``fully_shard`` each transformer block, then the root (embeddings, final norm, head), over
    ``mesh`` (1-D: FSDP2; 2-D ``(replicate, shard)``: HSDP); returns ``model``, now FSDP2's.

    Each block becomes one FSDP2 unit: one all-gather of its parameters before its forward (and
    again before its backward when ``reshard_after_forward`` is true), one reduce-scatter of its
    gradients. ``options`` (``reshard_after_forward``, ``mp_policy``, ``offload_policy``, ...) go to
    every call. Every rank must have built identical weights: ``fully_shard`` does not broadcast.
    """
    fsdp2_units(model)  # validates the model's shape
    _require_mesh(mesh, "apply_fsdp2")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def apply_ddp(model: nn.Module, mesh: DeviceMesh, **options: Any) -> nn.Module:
    """``DistributedDataParallel(model)`` over the ranks of ``mesh`` (1-D), the same argument
    :func:`apply_fsdp2` takes: it broadcasts rank 0's weights and all-reduces gradients in backward.
    On CUDA the module is bound to this process's current GPU. ``options`` (``bucket_cap_mb``,
    ``gradient_as_bucket_view``, ...) go to ``DistributedDataParallel``."""
    _require_mesh(mesh, "apply_ddp")
    if mesh.ndim != 1:
        raise ValueError(f"apply_ddp replicates over a 1-D mesh; got {mesh.ndim} dimensions "
                         f"{mesh.mesh_dim_names}. Pass init_device_mesh(device, (world_size,)).")
    if mesh.device_type == "cuda":
        options.setdefault("device_ids", [torch.cuda.current_device()])
    return DistributedDataParallel(model, process_group=mesh.get_group(), **options)


def _require_mesh(mesh: Any, name: str) -> None:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"{name} takes a DeviceMesh, got {type(mesh).__name__}: build one with "
                        "init_device_mesh(rank.device.type, (rank.world_size,)).")
