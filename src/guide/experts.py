"""A mixture-of-experts (MoE) version of the site's model, and the layout its experts should have.

:class:`MoEBlock` is :class:`guide.model.Block` with its MLP replaced by :class:`MoE`: a dense
router picks ``top_k`` of ``n_experts`` experts per token and :class:`Experts` holds the expert
weights as two 3-D parameters, ``w1`` of shape ``[experts, d_model, d_mlp]`` and ``w2`` of shape
``[experts, d_mlp, d_model]`` (torchtitan's layout). In one process an :class:`Experts` holds every
expert; :func:`to_expert_parallel` keeps this rank's contiguous slice of them (expert parallelism,
EP) and makes :class:`MoE` send each token to the rank that holds its expert with an all-to-all
(:func:`all_to_all`, differentiable) and the result back with a second one. The arithmetic per
token is the same, so a single-process reference and every EP rank compute one function.

:func:`expected_expert_layout` says, from the shapes alone, what a rank should hold after
``fully_shard`` over the expert mesh with ``Shard(dim)`` (``torch.chunk`` rows of that dim).
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from guide.layout import chunk_rows
from guide.model import Block, ModelConfig, TinyLM
from guide.validate import positive_int

__all__ = ["Experts", "MoE", "MoEBlock", "all_to_all", "build_moe_model", "expected_expert_layout",
           "merge_expert_states", "mesh_mismatch",
           "expert_slice", "to_expert_parallel"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; its backward is the all-to-all the other way."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # noqa: D102 (autograd's signature)
        ctx.splits, ctx.group = (in_splits, out_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        back_out, back_in = ctx.splits
        return _exchange(grad, back_out, back_in, ctx.group), None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
              group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
               group) -> torch.Tensor:
    """Send ``in_splits[j]`` rows of ``x`` to rank ``j`` of ``group``, receive ``out_splits[j]``
    from it; differentiable (gradients travel back the same way)."""
    if len(out_splits) != len(in_splits) or sum(in_splits) != x.shape[0]:
        raise ValueError(f"splits {in_splits} do not cover the {x.shape[0]} rows of x, or differ in "
                         f"length from {out_splits}.")
    return _AllToAll.apply(x, out_splits, in_splits, group)


class Experts(nn.Module):
    """``n`` two-layer MLP experts as two 3-D parameters; ``forward(x, counts)`` runs expert ``e``
    on the ``counts[e]`` consecutive rows of ``x`` that belong to it."""

    def __init__(self, n: int, d_model: int, d_mlp: int) -> None:
        super().__init__()
        positive_int("n", n, "the number of experts")
        self.w1 = nn.Parameter(torch.randn(n, d_model, d_mlp) * d_model ** -0.5)
        self.w2 = nn.Parameter(torch.randn(n, d_mlp, d_model) * d_mlp ** -0.5)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if len(counts) != self.w1.shape[0]:
            raise ValueError(f"{len(counts)} counts for {self.w1.shape[0]} experts.")
        outs = [F.gelu(xe @ self.w1[e]) @ self.w2[e] for e, xe in enumerate(x.split(counts))]
        return torch.cat(outs)


class MoE(nn.Module):
    """Router + experts: each token goes to its ``top_k`` experts, the outputs are summed with the
    router's renormalised probabilities as weights. ``ep_group`` (``None`` in one process) is the
    expert-parallel group; its rank ``j`` holds experts ``j * n_local`` to ``(j + 1) * n_local``."""

    def __init__(self, d_model: int, d_mlp: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        if not 0 < top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be in 1..n_experts={n_experts}.")
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model, d_mlp)
        self.ep_group, self.ep_size = None, 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = self.router(x).softmax(-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.flatten().argsort(stable=True)  # assignments grouped by expert
        token = order // self.top_k
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        routed = x[token]
        if self.ep_group is None:
            out = self.experts(routed, counts.tolist())
        else:
            out = self._expert_parallel(routed, counts)
        combined = torch.zeros_like(x).index_add(0, token, out * weights.flatten()[order, None])
        return combined.view(shape)

    def _expert_parallel(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch by all-to-all, run the local experts, combine by the all-to-all back."""
        n_local = self.n_experts // self.ep_size
        per_rank = counts.view(self.ep_size, n_local)  # [destination, its local expert]
        received = torch.empty_like(per_rank)  # [source, my local expert]
        dist.all_to_all_single(received, per_rank, group=self.ep_group)
        send, recv = per_rank.sum(1).tolist(), received.sum(1).tolist()
        tokens = all_to_all(routed, recv, send, self.ep_group)  # grouped by source rank
        local_ids = torch.arange(n_local, device=received.device)
        expert_of_row = local_ids.repeat(self.ep_size).repeat_interleave(received.flatten())
        by_expert = expert_of_row.argsort(stable=True)
        out = self.experts(tokens[by_expert], received.sum(0).tolist())
        return all_to_all(out[by_expert.argsort()], send, recv, self.ep_group)


class MoEBlock(Block):
    """:class:`guide.model.Block` (pre-norm causal attention) with an :class:`MoE` as its MLP."""

    def __init__(self, cfg: ModelConfig, n_experts: int, top_k: int) -> None:
        super().__init__(cfg)
        del self.fc1, self.fc2
        self.moe = MoE(cfg.d_model, cfg.d_mlp, n_experts, top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.moe(self.ln2(x))


def build_moe_model(cfg: ModelConfig, n_experts: int, top_k: int, seed: int = 0,
                    device: torch.device | str = "cpu") -> TinyLM:
    """:class:`guide.model.TinyLM` with :class:`MoEBlock` blocks, weights depending only on
    ``seed`` (every rank builds every expert, then keeps its own: nothing is broadcast)."""
    if cfg.attention != "sdpa":
        raise ValueError(f"build_moe_model uses sdpa attention, got {cfg.attention!r}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(cfg)
        model.blocks = nn.ModuleList(MoEBlock(cfg, n_experts, top_k) for _ in range(cfg.n_layers))
    return model.to(device)


def expert_slice(n_experts: int, ep_rank: int, ep_size: int) -> slice:
    """The experts EP rank ``ep_rank`` of ``ep_size`` holds: a contiguous block of
    ``n_experts / ep_size`` (which must be whole)."""
    positive_int("ep_size", ep_size, "the expert-parallel degree")
    if n_experts % ep_size:
        raise ValueError(f"{n_experts} experts do not split evenly over ep_size={ep_size}.")
    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"ep_rank {ep_rank} is not in 0..{ep_size - 1}.")
    n = n_experts // ep_size
    return slice(ep_rank * n, (ep_rank + 1) * n)


def to_expert_parallel(model: nn.Module, ep_group, ep_rank: int, ep_size: int) -> nn.Module:
    """Keep this rank's experts in every :class:`MoE` (before ``fully_shard``) and route tokens
    over ``ep_group``. Returns ``model``."""
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        keep = expert_slice(moe.n_experts, ep_rank, ep_size)
        for name in ("w1", "w2"):
            full = getattr(moe.experts, name)
            setattr(moe.experts, name, nn.Parameter(full.detach()[keep].clone()))
        moe.ep_group, moe.ep_size = ep_group, ep_size
    return model


def expected_expert_layout(shape: tuple[int, ...], dim: int, dp_rank: int,
                           dp: int) -> tuple[str, tuple[int, ...]]:
    """``(placements, local shape)`` of an expert parameter of (EP-local) ``shape`` after
    ``fully_shard`` over a ``dp``-rank mesh with ``Shard(dim)``, on its rank ``dp_rank``: the
    ``torch.chunk`` rows of ``dim``."""
    if not 0 <= dim < len(shape):
        raise ValueError(f"dim {dim} is not a dimension of {shape}.")
    local = list(shape)
    local[dim] = chunk_rows(shape[dim], dp_rank, dp)
    return f"(Shard(dim={dim}),)", tuple(local)


def merge_expert_states(by_ep_rank: list[dict[str, torch.Tensor]],
                        expert_names: set[str]) -> dict[str, torch.Tensor]:
    """One full state from the states of one rank per EP coordinate (``by_ep_rank[j]``: a rank of
    EP rank ``j``, after ``full_tensor()``): the expert parameters concatenated along the experts
    dim in EP order, every other parameter as the first rank has it (the ranks must agree)."""
    if not by_ep_rank:
        raise ValueError("no states to merge.")
    first = by_ep_rank[0]
    if any(set(s) != set(first) for s in by_ep_rank) or not expert_names <= set(first):
        raise ValueError("the EP ranks' states name different parameters.")
    return {name: torch.cat([s[name] for s in by_ep_rank]) if name in expert_names else t
            for name, t in first.items()}


def mesh_mismatch(message: str | None) -> bool:
    """Whether ``message`` is torch refusing to stack norms that live on different meshes, as
    ``clip_grad_norm_`` does across the experts' and the others' meshes. torch 2.13 says "All
    operands in aten.stack.default must have the same mesh"; torch 2.9 (the floor) says "Sharding
    propagation failed for Op(op=aten.stack.default, ...)" and lists the operands, whose
    ``DeviceMesh`` must then be at least two different ones."""
    if not message:
        return False
    if re.search(r"All operands in aten\.stack\.default must have the same mesh", message):
        return True
    if not re.search(r"Sharding propagation failed for Op\(op=aten\.stack\.default", message):
        return False
    return len(set(re.findall(r"mesh=(DeviceMesh\(.*?\))(?=, placements)", message))) >= 2
