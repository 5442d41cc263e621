"""The mini transformer every example trains: small enough for two CPU ranks, shaped like the real thing.

Token embedding + learned positions, ``n_layers`` pre-norm blocks (causal self-attention, then an
MLP, each in a residual branch), a final LayerNorm and an LM head. Each :class:`Block` is the unit
FSDP2 shards (``fully_shard(block)``), exactly as torchtitan shards a Llama layer.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from guide.validate import positive_int

__all__ = ["ATTENTIONS", "Block", "ModelConfig", "TinyLM", "build_model", "explicit_attention"]

#: The attention implementations :class:`ModelConfig` accepts.
ATTENTIONS = ("sdpa", "explicit")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of :class:`TinyLM`; the defaults are about the size of the seed notebook's model."""

    vocab: int = 128
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_mlp: int = 256
    max_seq: int = 32
    #: ``"sdpa"``: ``F.scaled_dot_product_attention`` (fused: the ``seq x seq`` attention
    #: probabilities are never stored for backward); ``"explicit"``: the same attention written out
    #: (:func:`explicit_attention`), whose probabilities autograd keeps. Same function, different
    #: activation memory (the activation-memory example measures both).
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name != "attention":
                positive_int(f"ModelConfig.{field.name}", getattr(self, field.name))
        if self.attention not in ATTENTIONS:
            raise ValueError(f"ModelConfig.attention must be one of {ATTENTIONS}, "
                             f"got {self.attention!r}.")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads}.")


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.explicit_attention = cfg.attention == "explicit"
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)  # a key bias gets no gradient
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.fc2 = nn.Linear(cfg.d_mlp, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.explicit_attention:
            attn = explicit_attention(q, k, v)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal ``softmax(q k^T / sqrt(d_head)) v`` written out, as GPT-2 and nanoGPT do: what
    ``scaled_dot_product_attention(q, k, v, is_causal=True)`` computes, but autograd keeps the
    ``(batch, heads, seq, seq)`` probabilities (and a ``seq x seq`` mask) for backward."""
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v


class TinyLM(nn.Module):
    """A GPT-style language model: tokens ``(batch, seq)`` in, logits ``(batch, seq, vocab)`` out."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.cfg.max_seq:
            raise ValueError(f"sequence length {t} exceeds ModelConfig.max_seq={self.cfg.max_seq}.")
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: ModelConfig | None = None, seed: int = 0,
                device: torch.device | str = "cpu") -> TinyLM:
    """Build :class:`TinyLM` with weights that depend only on ``seed``.

    Every rank must call this with the same seed: ``fully_shard`` does *not* broadcast initial
    weights (each rank keeps its own rows of whatever it built), while DDP broadcasts rank 0's.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(cfg)
    return model.to(device)
