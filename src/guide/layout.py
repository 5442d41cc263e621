"""What a rank holds: a parameter's local tensor, the full state, its layout, the rows of a chunk.

FSDP2 stores every parameter as a ``DTensor`` sharded on dim 0 with ``torch.chunk`` semantics:
ceil-sized chunks, so the first ranks get ``ceil(dim0/N)`` rows and the last ranks what is left,
possibly nothing. DDP stores plain tensors, named with a ``module.`` prefix. The functions here read
both the same way, so pages and checks never special-case either.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from guide.validate import positive_int

__all__ = ["ParamLayout", "chunk_rows", "chunk_sizes", "dtype_name", "full_state", "local_tensor",
           "param_layouts", "plain_name"]


def plain_name(name: str) -> str:
    """A parameter's name without DDP's ``module.`` prefix: the name the reference model uses."""
    return name.removeprefix("module.")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the short name tables and records use."""
    return str(dtype).removeprefix("torch.")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores: a DTensor's local shard (its padded storage, as FSDP2 keeps
    it), anything else as is."""
    if isinstance(t, DTensor):
        return t._local_tensor  # the padded-storage view, same as to_local() without autograd
    return t


def chunk_sizes(length: int, n: int) -> list[int]:
    """How ``torch.chunk`` splits ``length`` rows over ``n`` ranks: ``ceil(length/n)`` rows each
    in order until the rows run out, so the last ranks get what is left, possibly nothing."""
    positive_int("n", n, "the number of ranks")
    chunk = math.ceil(length / n)
    return [max(0, min(chunk, length - r * chunk)) for r in range(n)]


def chunk_rows(dim0: int, rank: int, world_size: int) -> int:
    """Rows of dim 0 that ``rank`` holds under ``Shard(0)`` over ``world_size`` ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}.")
    return chunk_sizes(dim0, world_size)[rank]


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a full CPU tensor, by plain name. FSDP2's DTensors are gathered (a
    collective: every rank must call this); DDP's ``module.`` prefix is dropped, so names match the
    single-process reference."""
    state = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        state[plain_name(name)] = full.detach().cpu().clone()
    return state


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """How one parameter is stored on one rank."""

    name: str
    rank: int
    is_dtensor: bool
    placements: str
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]


def param_layouts(model: nn.Module, rank: int) -> list[ParamLayout]:
    """Read, on this rank, what each parameter is: DTensor or not, placements, global/local shape."""
    out = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            out.append(ParamLayout(plain_name(name), rank, True, str(tuple(p.placements)),
                                   tuple(p.shape), tuple(p.to_local().shape)))
        else:
            out.append(ParamLayout(plain_name(name), rank, False, "-", tuple(p.shape),
                                   tuple(p.shape)))
    return out
