"""What ranks *should* send: one training step's collectives, predicted from parameter shapes.

:func:`ddp_step`, :func:`zero1_step`, :func:`fsdp2_step` and :func:`hsdp_step` list the collectives
one step issues, one :class:`Collective` per call, from the parameter shapes alone (FSDP2's dim-0
padding included), so that a page can assert what :class:`guide.comm.CollectiveLog` measured against
them (:func:`guide.checks.check_volume`). :func:`fsdp2_groups` says which parameters each
``fully_shard`` call owns, from :func:`guide.sharding.fsdp2_units`.

Element counts follow ZeRO's convention of the *full* buffer (arXiv 1910.02054 §7): an all-gather's
output, a reduce-scatter's input, an all-reduce's or broadcast's tensor. :func:`zero_volume` is
ZeRO's measure of a step (an all-reduce counts twice: a reduce-scatter plus an all-gather), so DDP
costs 2Ψ and fully sharded data parallelism 3Ψ. What a backend puts on the wire for these buffers,
and how long that takes, is :mod:`guide.comm.cost`'s subject.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from guide.layout import chunk_sizes, dtype_name
from guide.sharding import fsdp2_units
from guide.validate import positive_int

__all__ = ["KINDS", "Collective", "FSDPGroup", "collective", "ddp_step", "fsdp2_groups",
           "fsdp2_padded_numel", "fsdp2_step", "fsdp2_unit_groups", "hsdp_step", "summarize",
           "zero1_step", "zero_bytes", "zero_volume"]

#: Every kind a :class:`Collective` can have.
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "reduce")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective call as a rank issued it (measured) or should issue it (the model).

    ``numel`` is the size of the full buffer (all-gather output, reduce-scatter input, all-reduce or
    broadcast tensor) and ``bytes`` is ``numel`` times the element size. ``phase`` is ``"forward"``,
    ``"backward"``, ``"optimizer"``, a label set with :meth:`guide.comm.CollectiveLog.phase`, or
    ``None``. ``group_size`` is the number of ranks the collective spans.
    """

    kind: str
    dtype: str
    numel: int
    bytes: int
    phase: str | None = None
    group_size: int = 1


def collective(kind: str, dtype: torch.dtype, numel: int, phase: str | None,
               group_size: int) -> Collective:
    """A :class:`Collective` of ``numel`` elements of ``dtype`` (bytes computed from the dtype)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; choose one of {KINDS}.")
    return Collective(kind, dtype_name(dtype), numel, numel * dtype.itemsize, phase, group_size)


def summarize(records: Iterable[Collective], steps: int = 1) -> dict[tuple[str, str], dict[str, float]]:
    """Group collectives by ``(kind, dtype)``: calls, elements and bytes, divided by ``steps``."""
    positive_int("steps", steps, "the number of steps the records cover")
    out: dict[tuple[str, str], dict[str, float]] = {}
    for c in records:
        row = out.setdefault((c.kind, c.dtype), {"calls": 0, "numel": 0, "bytes": 0})
        row["calls"] += 1
        row["numel"] += c.numel
        row["bytes"] += c.bytes
    if steps > 1:
        out = {key: {k: v / steps for k, v in row.items()} for key, row in out.items()}
    return out


def zero_volume(c: Collective) -> int:
    """ZeRO's element count for a collective (arXiv 1910.02054 §7): an all-reduce is a reduce-scatter
    plus an all-gather, so it counts twice its size; every other kind counts its size once."""
    return c.numel * (2 if c.kind == "all_reduce" else 1)


def zero_bytes(c: Collective) -> int:
    """:func:`zero_volume` in bytes: the elements ZeRO counts, times the collective's element size.
    This is where dtypes enter: a bf16 all-gather counts half the bytes of an fp32 one."""
    return c.bytes * (2 if c.kind == "all_reduce" else 1)


# -- shapes and units --------------------------------------------------------------------------------

def _shape_list(shapes: Iterable[Any], what: str) -> list[torch.Size]:
    out = []
    for s in shapes:
        if isinstance(s, torch.Tensor):
            s = s.shape
        try:
            size = torch.Size(s)
        except TypeError:
            raise ValueError(f"{what}: {s!r} is not a shape (a tuple of ints or a tensor).") from None
        out.append(size if len(size) else torch.Size([1]))  # a scalar is one row of one element
    if not out:
        raise ValueError(f"{what}: no parameter shapes given.")
    return out


def fsdp2_padded_numel(shape: Sequence[int] | torch.Size, world_size: int) -> int:
    """Elements one parameter contributes to FSDP2's all-gather/reduce-scatter buffer: dim 0 is
    chunked over ``world_size`` ranks with ``torch.chunk`` rules (:func:`guide.layout.chunk_sizes`:
    ceil-sized chunks) and every shard is padded to the largest, so the buffer holds
    ``ceil(dim0 / N) * N`` rows."""
    positive_int("world_size", world_size, "the number of ranks")
    return _padded_numel(tuple(_shape_list([shape], "fsdp2_padded_numel")[0]), world_size)


@functools.lru_cache(maxsize=4096)
def _padded_numel(size: tuple[int, ...], world_size: int) -> int:
    # cached: a model repeats a handful of shapes, and chunk_sizes is O(world_size)
    if size[0] == 0:
        return 0
    return chunk_sizes(size[0], world_size)[0] * world_size * math.prod(size[1:])


@dataclasses.dataclass(frozen=True)
class FSDPGroup:
    """One ``fully_shard`` unit: the shapes of the parameters it owns and its
    ``reshard_after_forward`` (``True``: gathered again in backward)."""

    shapes: tuple[tuple[int, ...], ...]
    reshard_after_forward: bool = True

    @classmethod
    def of(cls, params: Iterable[nn.Parameter | torch.Tensor | Sequence[int]],
           reshard_after_forward: bool = True) -> FSDPGroup:
        """A group from the (unsharded) parameters, or their shapes, a ``fully_shard`` call owns."""
        return cls(tuple(tuple(s) for s in _shape_list(params, "FSDPGroup.of")),
                   bool(reshard_after_forward))


def fsdp2_unit_groups(units: Sequence[Iterable[Any]],
                      reshard_after_forward: bool | None = None) -> list[FSDPGroup]:
    """One :class:`FSDPGroup` per unit, ``units`` in forward order with the root first (as
    :func:`guide.sharding.fsdp2_units` lists them; parameters or shapes).

    ``reshard_after_forward`` is the value given to every ``fully_shard`` call; ``None`` is
    ``fully_shard``'s default, which reshards every unit except the root, whose parameters are kept
    until backward (its backward starts as soon as its forward ends)."""
    if not units:
        raise ValueError("fsdp2_unit_groups needs at least one unit (the root).")
    root_flag, other_flag = ((False, True) if reshard_after_forward is None
                             else (reshard_after_forward, reshard_after_forward))
    return [FSDPGroup.of(unit, root_flag if i == 0 else other_flag) for i, unit in enumerate(units)]


def fsdp2_groups(model: nn.Module, reshard_after_forward: bool | None = None) -> list[FSDPGroup]:
    """The units :func:`guide.sharding.apply_fsdp2` makes of ``model`` (the root, then each block:
    :func:`guide.sharding.fsdp2_units`) as :class:`FSDPGroup` s; see :func:`fsdp2_unit_groups` for
    ``reshard_after_forward``. Shapes are global, so the model may be sharded already or not."""
    return fsdp2_unit_groups(fsdp2_units(model), reshard_after_forward)


# -- one step, per strategy ---------------------------------------------------------------------------

def ddp_step(shapes: Iterable[Any], world_size: int,
             grad_dtype: torch.dtype = torch.float32) -> list[Collective]:
    """DDP's communication in one step: the gradients all-reduced, Ψ elements in total. DDP splits
    them into buckets (one call each); the model returns one record for the total, since bucket
    boundaries are DDP's choice."""
    positive_int("world_size", world_size, "the number of ranks")
    total = sum(s.numel() for s in _shape_list(shapes, "ddp_step"))
    return [collective("all_reduce", grad_dtype, total, "backward", world_size)]


def zero1_step(shapes: Iterable[Any], world_size: int,
               dtype: torch.dtype = torch.float32) -> list[Collective]:
    """DDP + ``ZeroRedundancyOptimizer`` in one step: DDP's all-reduce of Ψ gradient elements, then,
    after each rank updates its own shard of the parameters, one broadcast per parameter from its
    owner (``parameters_as_bucket_view=False``, the default): Ψ more elements. (ZeRO's P_os would
    reduce-scatter and all-gather instead; torch's ZeRO-1 keeps DDP's all-reduce.)"""
    shape_list = _shape_list(shapes, "zero1_step")
    out = ddp_step(shape_list, world_size, dtype)
    out += [collective("broadcast", dtype, s.numel(), "optimizer", world_size) for s in shape_list]
    return out


def _check_groups(groups: Sequence[FSDPGroup], what: str) -> None:
    if not groups or not all(isinstance(g, FSDPGroup) for g in groups):
        raise ValueError(f"{what} needs a non-empty sequence of FSDPGroup (one per fully_shard).")


def fsdp2_step(groups: Sequence[FSDPGroup], world_size: int,
               param_dtype: torch.dtype = torch.float32,
               reduce_dtype: torch.dtype | None = None) -> list[Collective]:
    """FSDP2's communication in one step, one record per call: each group all-gathers its padded
    parameters in ``param_dtype`` in forward, again in backward if it reshards after forward, and
    reduce-scatters its padded gradients in ``reduce_dtype`` (default: ``param_dtype``). The calls
    are listed group by group; FSDP2 issues the same calls but interleaves them (it prefetches the
    next backward all-gather before the current reduce-scatter), so compare them as a multiset."""
    positive_int("world_size", world_size, "the number of ranks")
    _check_groups(groups, "fsdp2_step")
    reduce_dtype = reduce_dtype or param_dtype
    sizes = [sum(fsdp2_padded_numel(s, world_size) for s in g.shapes) for g in groups]
    out = [collective("all_gather", param_dtype, numel, "forward", world_size) for numel in sizes]
    for g, numel in zip(reversed(groups), reversed(sizes)):
        if g.reshard_after_forward:
            out.append(collective("all_gather", param_dtype, numel, "backward", world_size))
        out.append(collective("reduce_scatter", reduce_dtype, numel, "backward", world_size))
    return out


def hsdp_step(groups: Sequence[FSDPGroup], shard_size: int, replicas: int,
              param_dtype: torch.dtype = torch.float32,
              reduce_dtype: torch.dtype | None = None) -> list[Collective]:
    """HSDP's communication in one step (``fully_shard`` on a 2-D mesh ``(replicas, shard_size)``:
    shard within a group of ``shard_size`` ranks, replicate across ``replicas`` such groups).

    Within the shard group, exactly :func:`fsdp2_step` at ``shard_size`` ranks; then, for each
    unit, one all-reduce of this rank's reduced gradient shard (``1/shard_size`` of the padded
    buffer, in ``reduce_dtype``) across the ``replicas`` ranks that hold the same shard (FSDP2's
    ``foreach_reduce`` with an all-reduce group). ``replicas=1`` is plain FSDP2."""
    positive_int("shard_size", shard_size, "ranks in one shard group")
    positive_int("replicas", replicas, "shard groups that replicate each other")
    out = fsdp2_step(groups, shard_size, param_dtype, reduce_dtype)
    if replicas == 1:
        return out
    reduce_dtype = reduce_dtype or param_dtype
    for g in reversed(groups):
        shard = sum(fsdp2_padded_numel(s, shard_size) for s in g.shapes) // shard_size
        out.append(collective("all_reduce", reduce_dtype, shard, "backward", replicas))
    return out
