"""The site's model made ready for tensor parallelism, and what a TP plan does to each parameter.

:class:`guide.model.Block` projects q, k and v with one fused ``Linear``: ``ColwiseParallel`` on
that weight would give rank 0 all of q and half of k, not half of the heads. :class:`TPBlock` is
the same block with separate ``q``, ``k`` and ``v`` projections whose head count follows the local
width (``view(b, t, -1, d_head)``), as torchtitan's Llama attention does; so the same ``forward``
runs whole in one process and on ``1/t`` of the heads on each rank of a tensor-parallel group.

:func:`build_tp_model` builds :class:`guide.model.TinyLM` with these blocks, seeded, so a
single-process reference and every rank start from the same weights. :func:`tp_local_shapes` and
:func:`expected_layout` say, from the plan alone, what each rank should hold after
``parallelize_module`` on the ``"tp"`` mesh dimension and ``fully_shard`` on ``"dp"``: the pages
compare them with what the ranks report (:func:`guide.layout.param_layouts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from guide.layout import chunk_rows
from guide.model import ModelConfig, TinyLM
from guide.validate import positive_int

__all__ = ["KINDS", "TPBlock", "build_tp_model", "expected_layout", "plan_kinds",
           "tp_local_shapes"]

#: How a plan entry splits a ``Linear``: ``"colwise"`` (output features, ``weight`` dim 0 and
#: ``bias``), ``"rowwise"`` (input features, ``weight`` dim 1; ``bias`` replicated).
KINDS = ("colwise", "rowwise")


class TPBlock(nn.Module):
    """Pre-norm transformer block with separate ``q``/``k``/``v``: ``x + proj(attn(ln1(x)))``,
    then ``x + fc2(gelu(fc1(ln2(x))))``; the same function as :class:`guide.model.Block`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.d_head = d // cfg.n_heads
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.d_mlp)
        self.fc2 = nn.Linear(cfg.d_mlp, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        # -1: the heads this rank holds (all of them in one process, n_heads / tp under TP)
        q, k, v = (lin(h).view(b, t, -1, self.d_head).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def build_tp_model(cfg: ModelConfig, seed: int = 0,
                   device: torch.device | str = "cpu") -> TinyLM:
    """:class:`guide.model.TinyLM` with :class:`TPBlock` blocks, weights depending only on ``seed``
    (every rank must build the same model: neither TP nor FSDP2 broadcasts weights)."""
    if cfg.attention != "sdpa":
        raise ValueError("build_tp_model uses scaled_dot_product_attention; pass a ModelConfig "
                         f"with attention='sdpa' (got {cfg.attention!r}).")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(cfg)
        model.blocks = nn.ModuleList(TPBlock(cfg) for _ in range(cfg.n_layers))
    return model.to(device)


def plan_kinds(plan: dict[str, object]) -> dict[str, str]:
    """``{"q": ColwiseParallel(), "proj": RowwiseParallel(), ...}`` -> ``{"q": "colwise", ...}``;
    any other style is refused (the shape rules here know only these two)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out = {}
    for name, style in plan.items():
        if isinstance(style, ColwiseParallel):
            out[name] = "colwise"
        elif isinstance(style, RowwiseParallel):
            out[name] = "rowwise"
        else:
            raise ValueError(f"plan entry {name!r}: {type(style).__name__} is not ColwiseParallel "
                             "or RowwiseParallel; tp_local_shapes knows only those two.")
    return out


def _split(name: str, shape: tuple[int, ...], kind: str, tp: int) -> tuple[int, ...]:
    dim = 0 if kind == "colwise" else (1 if len(shape) == 2 else None)
    if dim is None:  # a rowwise bias is added after the all-reduce: every TP rank holds it all
        return shape
    if shape[dim] % tp:
        raise ValueError(f"{name}: dim {dim} of {shape} is not divisible by tp={tp}; pick a "
                         "tensor-parallel degree that divides the heads and the MLP width.")
    return (*shape[:dim], shape[dim] // tp, *shape[dim + 1:])


def _kind_of(name: str, kinds: dict[str, str]) -> str | None:
    parts = name.split(".")  # blocks.0.q.weight -> module "q"
    return kinds.get(parts[-2]) if name.startswith("blocks.") and len(parts) >= 2 else None


def tp_local_shapes(model: nn.Module, plan: dict[str, object],
                    tp: int) -> dict[str, tuple[int, ...]]:
    """Each parameter's shape on one rank of the tensor-parallel group, before FSDP2: ``plan``
    (block-relative names) applied to every block; parameters outside it keep their shape."""
    positive_int("tp", tp, "the tensor-parallel degree")
    kinds = plan_kinds(plan)
    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        kind = _kind_of(name, kinds)
        out[name] = shape if kind is None else _split(name, shape, kind, tp)
    return out


def expected_layout(model: nn.Module, plan: dict[str, object], dp: int, tp: int,
                    dp_rank: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (placements, local shape)}`` after ``parallelize_module(block, mesh["tp"], plan)``
    on each block and ``fully_shard(..., mesh=mesh["dp"])``, on the rank at ``dp_rank``.

    On the ``(dp, tp)`` mesh: a colwise weight or bias is ``(_StridedShard(dim=0, sf=tp),
    Shard(dim=0))`` (FSDP2 shards dim 0 again, inside TP's shard), a rowwise weight ``(Shard(dim=0),
    Shard(dim=1))``, a rowwise bias ``(Shard(dim=0), Replicate())``. A parameter outside the plan
    stays on the 1-D dp mesh: ``(Shard(dim=0),)``. FSDP2 takes ``torch.chunk`` rows of dim 0 of
    the TP-local tensor."""
    positive_int("dp", dp, "the data-parallel degree")
    kinds = plan_kinds(plan)
    local = tp_local_shapes(model, plan, tp)
    out = {}
    for name, p in model.named_parameters():
        kind, shape = _kind_of(name, kinds), local[name]
        if kind is None:
            placements = "(Shard(dim=0),)"
        elif kind == "colwise":
            placements = f"(_StridedShard(dim=0, sf={tp}), Shard(dim=0))"
        elif p.dim() == 2:
            placements = "(Shard(dim=0), Shard(dim=1))"
        else:
            placements = "(Shard(dim=0), Replicate())"
        out[name] = (placements, (chunk_rows(shape[0], dp_rank, dp), *shape[1:]))
    return out
