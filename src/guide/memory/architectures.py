"""Public transformer shapes: enough of a model's config to list its parameter tensors.

An :class:`~guide.memory.Architecture` gives the shapes :mod:`guide.memory.predicted` prices (one
per parameter tensor, in the order a Hugging Face model lists them), the ``fully_shard`` units
FSDP2 makes of them (:meth:`Architecture.fsdp2_units`, the same root-then-blocks split as
:func:`guide.sharding.fsdp2_units` makes of a live model) and the longest sequence the model
supports (:attr:`~guide.memory.Architecture.max_seq_len`), beyond which no page may price it.

``PRESETS`` holds a few public models, each from its published config; their parameter counts are
checked against the published ones in ``tests/memory/test_architectures.py``.
"""

from __future__ import annotations

import dataclasses
import math

from guide.validate import positive_int

__all__ = ["PRESETS", "Architecture", "Shape"]

#: A parameter tensor's shape.
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape.

    Llama-style by default (RMSNorm without bias, SwiGLU MLP with three matrices, no biases, rotary
    positions); set ``gated_mlp=False, bias=True, layernorm=True, learned_positions=True`` for
    GPT-2-style. ``kv_heads`` < ``heads`` is grouped-query attention. ``max_seq_len`` is the longest
    sequence the model supports (GPT-2: its learned position table; Llama: the config's
    ``max_position_embeddings``); ``None`` means unknown, and then nothing is refused.
    """

    vocab: int
    hidden: int
    layers: int
    heads: int
    mlp: int
    kv_heads: int | None = None
    tied_embeddings: bool = False
    gated_mlp: bool = True
    bias: bool = False
    layernorm: bool = False
    learned_positions: bool = False
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "mlp"):
            positive_int(f"Architecture.{name}", getattr(self, name))
        if self.kv_heads is not None:
            positive_int("Architecture.kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise ValueError(f"Architecture.kv_heads must divide heads={self.heads}, "
                                 f"got {self.kv_heads!r}.")
        if self.hidden % self.heads:
            raise ValueError(f"Architecture.hidden={self.hidden} must be divisible by "
                             f"heads={self.heads}.")
        if self.max_seq_len is not None:
            positive_int("Architecture.max_seq_len", self.max_seq_len, "the longest sequence")
        if self.learned_positions and self.max_seq_len is None:
            raise ValueError("Architecture.learned_positions needs max_seq_len: the position "
                             "table has one row per position.")

    def check_seq_len(self, seq_len: int) -> int:
        """``seq_len`` if this model supports it; else a ``ValueError`` naming the limit."""
        positive_int("seq_len", seq_len, "tokens per sequence")
        if self.max_seq_len is not None and seq_len > self.max_seq_len:
            raise ValueError(f"seq_len={seq_len:,} is longer than this model supports "
                             f"(max_seq_len={self.max_seq_len:,}); price it at {self.max_seq_len:,} "
                             "tokens or fewer.")
        return seq_len

    def _parts(self) -> tuple[list[Shape], list[Shape], list[Shape]]:
        """(embeddings, one layer, tail): the tail is the final norm and, unless tied, the head."""
        h, f = self.hidden, self.mlp
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        norm: list[Shape] = [(h,), (h,)] if self.layernorm else [(h,)]

        def linear(out: int, inp: int) -> list[Shape]:
            return [(out, inp), (out,)] if self.bias else [(out, inp)]

        mlp = (linear(f, h) + linear(f, h) + linear(h, f) if self.gated_mlp
               else linear(f, h) + linear(h, f))
        layer = norm + linear(h, h) + linear(kv, h) + linear(kv, h) + linear(h, h) + norm + mlp
        embeddings = [(self.vocab, h)]
        if self.learned_positions:
            embeddings.append((self.max_seq_len or 0, h))
        tail = norm + ([] if self.tied_embeddings else [(self.vocab, h)])
        return embeddings, layer, tail

    def param_shapes(self) -> list[Shape]:
        """One shape per parameter tensor, in the order a Hugging Face model lists them."""
        embeddings, layer, tail = self._parts()
        return embeddings + layer * self.layers + tail

    def fsdp2_units(self) -> list[list[Shape]]:
        """The parameter shapes grouped as ``fully_shard`` units, in the order and split of
        :func:`guide.sharding.fsdp2_units`: first the root (what the final ``fully_shard(model)``
        picks up: embeddings, final norm, output head), then one unit per layer."""
        embeddings, layer, tail = self._parts()
        return [embeddings + tail, *(list(layer) for _ in range(self.layers))]

    @property
    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes())


#: Public model shapes, each from its published ``config.json`` (Hugging Face hub).
PRESETS: dict[str, Architecture] = {
    "gpt2-xl": Architecture(vocab=50257, hidden=1600, layers=48, heads=25, mlp=6400,
                            tied_embeddings=True, gated_mlp=False, bias=True, layernorm=True,
                            learned_positions=True, max_seq_len=1024),
    "llama-3.2-1b": Architecture(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8,
                                 mlp=8192, tied_embeddings=True, max_seq_len=131072),
    "llama-3.2-3b": Architecture(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8,
                                 mlp=8192, tied_embeddings=True, max_seq_len=131072),
    "llama-2-7b": Architecture(vocab=32000, hidden=4096, layers=32, heads=32, mlp=11008,
                               max_seq_len=4096),
    "mistral-7b": Architecture(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, mlp=14336,
                               max_seq_len=32768),
    "llama-3-8b": Architecture(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, mlp=14336,
                               max_seq_len=8192),
    "llama-3-70b": Architecture(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8,
                                mlp=28672, max_seq_len=8192),
    "llama-3.1-405b": Architecture(vocab=128256, hidden=16384, layers=126, heads=128, kv_heads=8,
                                   mlp=53248, max_seq_len=131072),
}
