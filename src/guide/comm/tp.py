"""Tensor parallelism + FSDP2 on a 2-D mesh: collectives counted per mesh dimension, the model of
one step, and an estimate of when the second dimension pays.

* :class:`MeshLog` -- **measured**: every collective a rank issues, with the ranks of the group it
  spans, from both entry points a 2-D step uses: FSDP2's ``torch.distributed`` calls
  (``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``) and DTensor's functional
  collectives (``torch.distributed._functional_collectives``), which tensor parallelism issues
  and :class:`guide.comm.CollectiveLog` does not see. :meth:`MeshLog.by_dim` sorts them by the mesh
  dimension whose group they ran in: on a ``(2, 2)`` mesh both groups have 2 ranks, so the group
  size alone cannot tell them apart.
* :func:`tp_step` / :func:`tp_fsdp2_step` -- **predicted**: TP's activation all-reduces (one per
  ``RowwiseParallel`` output in forward, one per ``ColwiseParallel`` input gradient in backward,
  ``tokens x features`` elements each) in the tp group, and FSDP2's all-gathers and
  reduce-scatters of the TP-local shards in the dp group (:func:`guide.comm.fsdp2_step`).
* :func:`tp_fsdp_estimate` -- **estimated**: per-GPU activation memory and all-gather sizes of a
  preset with TP degree ``t`` inside a node against FSDP alone, from the memory model's
  per-operation block count (:func:`guide.memory.activations.block_bytes`) split as Megatron's
  tensor parallelism splits it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from guide.comm.expected import Collective, collective, fsdp2_step, fsdp2_unit_groups
from guide.memory.activations import block_bytes, block_norm_bytes
from guide.memory.architectures import Architecture
from guide.sharding import fsdp2_units
from guide.validate import positive_int

__all__ = ["KORTHIKANTI_TP_SBH", "MeshLog", "TPEstimate", "tp_fsdp2_step", "tp_fsdp_estimate",
           "tp_step"]

#: Korthikanti et al., arXiv 2205.05198, Table 2 ("tensor parallel (baseline)"): per layer a rank
#: of a TP group of ``t`` keeps ``s*b*h*(10 + 24/t)`` bytes (16-bit, attention scores left out as
#: with a fused kernel): the 10 are the LayerNorm inputs, dropout masks and the block inputs every
#: TP rank holds whole; with sequence parallelism all 34 are divided by ``t``. Kept for
#: comparison: :func:`tp_fsdp_estimate` splits the memory model's own count the same way.
KORTHIKANTI_TP_SBH = (10, 24)

# name -> (kind, "c10d" | "funcol"): the entry points a TP + FSDP2 step calls (torch 2.13)
#: torch 2.9 has no ``*_single``: its FSDP2 calls ``all_gather_into_tensor`` and
#: ``reduce_scatter_tensor`` (same argument names). A name this torch lacks is skipped; an alias that
#: forwards to another wrapped name is counted once (the outermost call).
_C10D = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
         "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "all_reduce": "all_reduce"}
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_single": "all_gather",
           "reduce_scatter_single": "reduce_scatter", "all_gather_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter"}
_depth = threading.local()


def _group_ranks(group: Any) -> tuple[int, ...]:
    """Global ranks of a c10d group, a ``(mesh, dim)`` pair or a DeviceMesh (funcol's forms)."""
    if isinstance(group, tuple) and len(group) == 2:
        mesh, dim = group
        group = mesh.get_group(dim)
    elif hasattr(group, "get_group") and hasattr(group, "ndim") and group.ndim == 1:
        group = group.get_group()
    elif isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group
        group = _resolve_process_group(group)
    group = group if group is not None else dist.group.WORLD
    return tuple(dist.get_process_group_ranks(group))


def _numel(kind: str, api: str, args: Mapping[str, Any], n: int) -> tuple[int, torch.dtype]:
    """Full-buffer elements (all-gather output, reduce-scatter input, all-reduce tensor)."""
    if api == "c10d":
        t = {"all_gather": args.get("output_tensor"), "reduce_scatter": args.get("input"),
             "all_reduce": args.get("tensor")}[kind]
        return t.numel(), t.dtype
    t = args["self"]
    return (t.numel() * n if kind == "all_gather" else t.numel()), t.dtype


class MeshLog:
    """Record every collective this rank issues while active, with the ranks of its group.

    ``records`` holds ``(Collective, ranks)`` pairs in call order; :meth:`by_dim` files them under
    a mesh's dimension names. Logs do not nest, and functions imported by name before the log was
    entered are not seen (as for :class:`guide.comm.CollectiveLog`).
    """

    _active: MeshLog | None = None

    def __init__(self) -> None:
        self.records: list[tuple[Collective, tuple[int, ...]]] = []
        self._originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def __enter__(self) -> MeshLog:
        if MeshLog._active is not None:
            raise ValueError("a MeshLog is already active in this process; close it first.")
        MeshLog._active = self
        for module, table, api in ((dist, _C10D, "c10d"), (funcol, _FUNCOL, "funcol")):
            for name, kind in table.items():
                original = getattr(module, name, None)
                if original is None:  # not in this torch (see _C10D)
                    continue
                self._originals.append((module, name, original))
                setattr(module, name, self._wrap(original, kind, api))
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()
        MeshLog._active = None

    def _wrap(self, original: Callable[..., Any], kind: str, api: str) -> Callable[..., Any]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_depth, "n", 0)
            if depth == 0:  # the outermost call only (a wrapper forwarding to another)
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                ranks = _group_ranks(bound.arguments.get("group"))
                numel, dtype = _numel(kind, api, bound.arguments, len(ranks))
                phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
                self.records.append((collective(kind, dtype, numel, phase, len(ranks)), ranks))
            _depth.n = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                _depth.n = depth

        return counted

    def by_dim(self, mesh: Any) -> dict[str, list[Collective]]:
        """The records filed under the name of the mesh dimension whose group (this rank's) they
        spanned; a collective in any other group raises, naming its ranks."""
        groups = {tuple(dist.get_process_group_ranks(mesh.get_group(name))): name
                  for name in mesh.mesh_dim_names}
        out: dict[str, list[Collective]] = {name: [] for name in mesh.mesh_dim_names}
        for c, ranks in self.records:
            if ranks not in groups:
                raise ValueError(f"a {c.kind} of {c.numel} elements ran on ranks {ranks}, which "
                                 f"is no dimension of this rank's mesh {groups}.")
            out[groups[ranks]].append(c)
        return out


def tp_step(model: nn.Module, kinds: Mapping[str, str], tokens: int, tp: int,
            dtype: torch.dtype = torch.float32) -> list[Collective]:
    """TP's collectives in one step of ``model`` (``kinds``: block-relative module name ->
    ``"colwise"``/``"rowwise"``, :func:`guide.tensor_parallel.plan_kinds`), ``tokens`` = this
    rank's sequences x sequence length.

    Forward: a ``RowwiseParallel`` output is a partial sum, all-reduced to a replicated tensor
    (``tokens x out_features``). Backward: a ``ColwiseParallel`` input is replicated, so its
    gradient is a partial sum, all-reduced (``tokens x in_features``); q, k and v each take the same
    input and each all-reduce its gradient. Nothing else crosses the tp group."""
    positive_int("tp", tp, "the tensor-parallel degree")
    positive_int("tokens", tokens, "tokens per rank per step")
    fwd, bwd = [], []
    for block in model.blocks:
        for name, kind in kinds.items():
            linear = getattr(block, name)
            if kind == "rowwise":
                fwd.append(collective("all_reduce", dtype, tokens * linear.out_features,
                                      "forward", tp))
            else:
                bwd.append(collective("all_reduce", dtype, tokens * linear.in_features,
                                      "backward", tp))
    return fwd + bwd


def tp_fsdp2_step(model: nn.Module, local_shapes: Mapping[str, Sequence[int]],
                  dp: int) -> list[Collective]:
    """FSDP2's collectives in one step over the ``dp`` group: :func:`guide.comm.fsdp2_step` of the
    units (root first, then each block) with every parameter at its TP-local shape
    (:func:`guide.tensor_parallel.tp_local_shapes`): FSDP2 gathers and reduces only this rank's
    TP shard."""
    names = {id(p): n for n, p in model.named_parameters()}
    units = [[tuple(local_shapes[names[id(p)]]) for p in unit] for unit in fsdp2_units(model)]
    return fsdp2_step(fsdp2_unit_groups(units), dp)


@dataclasses.dataclass(frozen=True)
class TPEstimate:
    """One preset on ``gpus`` GPUs with TP degree ``tp`` inside a node (``tp=1``: FSDP alone), at
    ``micro_batch`` sequences per data-parallel rank. Bytes are per GPU."""

    tp: int
    dp: int
    global_batch: int  #: sequences per step: micro_batch x dp (a TP group shares its sequences)
    activation_bytes: int  #: all layers, no checkpointing
    gathered_layer_bytes: int  #: one layer unsharded by FSDP2's all-gather (the output buffer)
    tp_all_reduce_bytes: int  #: per layer per step: 4 activation all-reduces (0 at tp=1)


def tp_fsdp_estimate(arch: Architecture, gpus: int, tp: int, seq_len: int, micro_batch: int = 1,
                     *, sequence_parallel: bool = False, param_bytes: int = 2,
                     gpus_per_node: int = 8) -> TPEstimate:
    """Estimate (no measurement): what TP of degree ``tp`` inside a node changes per GPU.

    Assumptions: 16-bit activations and parameters (``param_bytes``), a fused attention kernel
    (no ``s x s`` scores) and a fused norm, no activation checkpointing; per layer the memory
    model's count (:func:`guide.memory.activations.block_bytes`), of which the two norms' part
    (:func:`~guide.memory.activations.block_norm_bytes`) stays whole on every TP rank and the
    attention and MLP part divides by ``tp`` (with ``sequence_parallel`` all of it divides);
    the blocks only (the head's logits, split too under loss parallelism, are left out).
    Megatron's 4 activation all-reduces per layer and step (2 forward, 2 backward, with a
    fused qkv), and every GPU of a TP group inside one node (``tp <= gpus_per_node``)."""
    for name, value in (("gpus", gpus), ("tp", tp), ("seq_len", seq_len),
                        ("micro_batch", micro_batch), ("param_bytes", param_bytes)):
        positive_int(name, value)
    if gpus % tp or tp > gpus_per_node:
        raise ValueError(f"tp={tp} must divide gpus={gpus} and fit in a node of "
                         f"{gpus_per_node} GPUs (TP's all-reduces need NVLink).")
    kv = arch.kv_heads or arch.heads
    if arch.heads % tp or kv % tp:
        raise ValueError(f"tp={tp} must divide the {arch.heads} heads and {kv} kv heads.")
    sbh = arch.check_seq_len(seq_len) * micro_batch * arch.hidden
    layer = block_bytes(arch, seq_len, micro_batch, norm="fused", bytes_per_element=2)
    whole = block_norm_bytes(arch, seq_len, micro_batch, norm="fused", bytes_per_element=2)
    per_layer = (layer // tp if sequence_parallel or tp == 1
                 else whole + (layer - whole) // tp)
    layer_params = sum(int(torch.Size(s).numel()) for s in arch.fsdp2_units()[1])
    return TPEstimate(tp=tp, dp=gpus // tp, global_batch=micro_batch * gpus // tp,
                      activation_bytes=per_layer * arch.layers,
                      gathered_layer_bytes=layer_params * param_bytes // tp,
                      tp_all_reduce_bytes=0 if tp == 1 else 4 * sbh * 2)
