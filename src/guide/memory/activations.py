"""Activation memory per transformer layer: the site's model exactly, and Korthikanti's estimate.

*Activations* are the tensors a forward pass saves for the backward pass. Two formulas, both
**predicted** (from shapes; nothing here touches a tensor):

* :func:`tinylm_terms` / :func:`tinylm_layer_bytes`: the exact bytes one :class:`guide.model.Block`
  of :class:`guide.model.TinyLM` (fp32) saves, term by term. The activation-memory example counts
  what autograd really saves (:class:`guide.saved_tensors.SavedTensors`) and asserts equality to
  the byte over sequence lengths, micro-batch sizes, widths, head counts and both attention
  implementations (``ModelConfig(attention="sdpa" | "explicit")``); so does
  ``tests/memory/test_activations.py``.
* :func:`korthikanti_layer_bytes`: Korthikanti et al., *Reducing Activation Recomputation in Large
  Transformer Models* (arXiv 2205.05198, §4.1, Eq. 1): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer for
  a GPT layer with 16-bit activations, 1-byte dropout masks and a 4h MLP. ``fused_attention=True``
  drops the ``5*a*s*s*b`` attention-score term (FlashAttention and SDPA do not store the scores).
  The calculator prices activations with it (:func:`activation_bytes`), because a real model's
  exact terms are unknown to it.

Each :class:`Term` carries both formulas' share of one kind of saved tensor and the reason they
differ, so a page can print where Korthikanti's 34 comes from and why the site's model is not 34.

**Activation checkpointing** (``checkpoint_wrapper`` / ``torch.utils.checkpoint`` per block): the
forward keeps only each checkpointed block's input, ``s*b*h`` elements per block
(:func:`checkpointed_layer_bytes`; measured to the byte by the example); during the backward one
block at a time is recomputed, so its full activations exist again, on top, while its gradient
is taken. :func:`activation_bytes` with ``checkpointing="full"`` adds that one layer (an
assumption about the backward's peak, not measured here; the kept inputs are).

Symbols: ``s`` sequence length, ``b`` micro-batch (sequences per rank), ``h`` hidden size, ``a``
attention heads, ``m`` MLP width (``4h`` in Korthikanti's model).
"""

from __future__ import annotations

import dataclasses

from guide.constants import CONSTANTS
from guide.memory.architectures import Architecture
from guide.model import ModelConfig
from guide.validate import positive_int

__all__ = ["CHECKPOINTING", "KORTHIKANTI_BYTES", "KORTHIKANTI_SBH", "KORTHIKANTI_SCORES", "NORMS",
           "Term", "activation_bytes", "block_bytes", "block_norm_bytes", "checkpointed_layer_bytes",
           "korthikanti_layer_bytes", "llama_layer_bytes", "logits_bytes", "selective_layer_bytes",
           "tinylm_layer_bytes", "tinylm_terms"]

#: Activation-checkpointing policies the calculator prices: ``"none"`` keeps every activation,
#: ``"full"`` keeps each block's input and recomputes the rest in backward, ``"selective"`` is
#: torchtitan's op-level policy (each block keeps its input, the output of every second matmul
#: and SDPA's outputs; the rest is recomputed).
CHECKPOINTING = ("none", "full", "selective")
#: How a block's normalization saves for backward: ``"fused"`` (one kernel: its input and an fp32
#: statistic per token, e.g. ``torch.nn.functional.layer_norm`` or a fused RMSNorm), or
#: ``"composite"`` (RMSNorm written in torch ops, as torch's ``nn.RMSNorm`` and Hugging Face's
#: ``LlamaRMSNorm`` run: an fp32 copy of the input and the fp32 normalized tensor are kept too).
NORMS = ("fused", "composite")

#: Bytes per activation element in Korthikanti's model (16-bit activations).
KORTHIKANTI_BYTES = 2
#: Eq. 1's two coefficients, cited in :data:`guide.constants.CONSTANTS`: bytes per ``s*b*h`` (34)
#: and per ``a*s*s*b`` (5, the attention scores and their dropout).
KORTHIKANTI_SBH = CONSTANTS["korthikanti.eq1.sbh_bytes"].value
KORTHIKANTI_SCORES = CONSTANTS["korthikanti.eq1.scores_bytes"].value

_FP32 = 4  # TinyLM runs in fp32; LayerNorm statistics and SDPA's log-sum-exp are fp32 as well


@dataclasses.dataclass(frozen=True)
class Term:
    """One kind of tensor a layer saves: TinyLM's bytes (exact), Korthikanti's share of Eq. 1
    (with attention scores and dropout, i.e. the unfused formula) and why the two differ."""

    name: str
    tinylm: int
    korthikanti: int
    why: str


def _sizes(seq_len: int, micro_batch: int) -> tuple[int, int]:
    return (positive_int("seq_len", seq_len, "tokens per sequence"),
            positive_int("micro_batch", micro_batch, "sequences per rank"))


def tinylm_terms(cfg: ModelConfig, seq_len: int, micro_batch: int) -> list[Term]:
    """What one :class:`guide.model.Block` saves for backward, term by term, in bytes.

    Exact for the fp32 model on CPU (torch 2.13: SDPA runs its flash kernel for CPU, which saves
    ``q``, ``k``, ``v``, the output and a log-sum-exp per query and head). Korthikanti's column is
    Eq. 1's share of each term in 16-bit with dropout, the scores included.
    """
    s, b = _sizes(seq_len, micro_batch)
    if s > cfg.max_seq:
        raise ValueError(f"seq_len={s} exceeds ModelConfig.max_seq={cfg.max_seq}.")
    h, a, m, e = cfg.d_model, cfg.n_heads, cfg.d_mlp, _FP32
    sbh, k = s * b * h, KORTHIKANTI_BYTES
    explicit = cfg.attention == "explicit"
    mlp_why = ("fp32, and m = 4h as Korthikanti assumes" if m == 4 * h else
               f"fp32, and m = {m} where Korthikanti assumes 4h = {4 * h}")
    return [
        Term("LayerNorm inputs (2 per layer)", 2 * sbh * e, 2 * sbh * k,
             "fp32 (4 bytes) where Korthikanti counts 16-bit (2)"),
        Term("LayerNorm mean and 1/std", 2 * 2 * s * b * _FP32, 0,
             "Korthikanti leaves out these per-token statistics"),
        Term("q, k, v (attention inputs)", 3 * sbh * e, 3 * sbh * k,
             "fp32 (explicit attention saves copies; SDPA saves views of the qkv output)"),
        Term("QKV projection input", sbh * e, sbh * k, "fp32"),
        Term("attention probabilities (s x s)", a * s * s * b * e if explicit else 0,
             2 * a * s * s * b,
             "fp32 softmax output" if explicit else
             "SDPA's fused kernel does not store them: it recomputes them in backward"),
        Term("attention dropout (mask + output)", 0, 3 * a * s * s * b, "no dropout in TinyLM"),
        Term("causal mask (s x s, bool)", s * s if explicit else 0, 0,
             "explicit attention saves its masked_fill mask; Korthikanti has no mask"
             if explicit else "SDPA builds the causal mask inside the kernel"),
        Term("SDPA log-sum-exp (fp32)", 0 if explicit else a * s * b * _FP32, 0,
             "explicit attention keeps the probabilities instead" if explicit else
             "the fused kernel's only extra: one fp32 per query and head, absent from Eq. 1"),
        Term("output projection input", sbh * e, sbh * k, "fp32"),
        Term("dropout masks (attention out, MLP out)", 0, 2 * s * b * h, "no dropout in TinyLM"),
        Term("MLP input (fc1)", sbh * e, sbh * k, "fp32"),
        Term("GELU input and fc2 input", 2 * s * b * m * e, 2 * s * b * 4 * h * k, mlp_why),
    ]


def tinylm_layer_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int) -> int:
    """Exact bytes one TinyLM block saves for backward (the sum of :func:`tinylm_terms`).

    With ``m = 4h``: ``64*s*b*h + 16*s*b`` plus ``4*a*s*b`` (SDPA's log-sum-exp) or
    ``4*a*s*s*b + s*s`` (explicit attention's probabilities and mask).
    """
    return sum(t.tinylm for t in tinylm_terms(cfg, seq_len, micro_batch))


def checkpointed_layer_bytes(hidden: int, seq_len: int, micro_batch: int,
                             bytes_per_element: int) -> int:
    """Bytes a checkpointed block keeps from its forward: its input, ``s*b*h`` elements
    (``bytes_per_element`` 4 for the fp32 TinyLM, 2 for 16-bit activations)."""
    s, b = _sizes(seq_len, micro_batch)
    positive_int("hidden", hidden)
    positive_int("bytes_per_element", bytes_per_element)
    return s * b * hidden * bytes_per_element


def llama_layer_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, kv_heads: int,
                      mlp: int) -> int:
    """Bytes one bf16 Llama-style block saves for backward (RMSNorm, grouped-query attention with
    SDPA, SwiGLU MLP of width ``mlp``; no rotary embedding), operation by operation, as the
    activation-memory example measures it on CPU: each RMSNorm (torch's composite form) keeps its
    input upcast to fp32, the normalized fp32 tensor, an fp32 ``rstd`` per token and its bf16
    output (``10sbh + 4sb``); attention keeps ``q`` (``2sbh``), ``k`` and ``v`` (``4sbh·kv/a``),
    SDPA's fp32 log-sum-exp (``4asb``) and its output (``2sbh``); SwiGLU keeps the gate-and-up
    projection (``4msb``), ``silu(gate)`` and their product (``2msb`` each)."""
    s, b = _sizes(seq_len, micro_batch)
    for name, v in (("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads), ("mlp", mlp)):
        positive_int(name, v)
    if heads % kv_heads or hidden % heads:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}, and heads divide "
                         f"hidden={hidden}.")
    norms = 2 * (10 * s * b * hidden + 4 * s * b)
    attention = 4 * s * b * hidden + 4 * s * b * hidden * kv_heads // heads + 4 * heads * s * b
    return norms + attention + 8 * mlp * s * b


def korthikanti_layer_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, *,
                            fused_attention: bool) -> int:
    """Korthikanti et al.'s Eq. 1 per layer: ``s*b*h*34 + 5*a*s*s*b`` bytes (16-bit, dropout,
    4h MLP); ``fused_attention=True`` drops the ``5*a*s*s*b`` scores term."""
    s, b = _sizes(seq_len, micro_batch)
    positive_int("hidden", hidden)
    positive_int("heads", heads)
    return (s * b * hidden * KORTHIKANTI_SBH
            + (0 if fused_attention else KORTHIKANTI_SCORES * heads * s * s * b))


def _norm_bytes(arch: Architecture, tokens: int, e: int, norm: str) -> int:
    """What one normalization keeps, its output included (the next linears save that tensor):
    fused, its ``e``-byte input and output plus an fp32 statistic per token (RMSNorm: ``rstd``;
    LayerNorm: mean and ``rstd``); composite RMSNorm, the fp32 input, the fp32 normalized tensor,
    ``rstd`` and the ``e``-byte output (the activation page measures ``10sbh + 4sb`` in bf16)."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}.")
    h = arch.hidden
    if norm == "composite":
        if arch.layernorm:
            raise ValueError("norm='composite' is RMSNorm written in torch ops; nn.LayerNorm is "
                             "one fused kernel: use norm='fused'.")
        return tokens * (2 * _FP32 * h + _FP32 + e * h)
    return tokens * (2 * e * h + _FP32 * (2 if arch.layernorm else 1))


def _matmul_outputs(arch: Architecture, tokens: int, e: int) -> list[int]:
    """Bytes of each linear's output in one block, in the order the forward runs them: q, k, v,
    the output projection, then the MLP (gated: gate, up, down; else fc1, fc2)."""
    h, m = arch.hidden, arch.mlp
    kv = (arch.kv_heads or arch.heads) * (h // arch.heads)
    mlp = [m, m, h] if arch.gated_mlp else [m, h]
    return [tokens * e * d for d in (h, kv, kv, h, *mlp)]


def block_bytes(arch: Architecture, seq_len: int, micro_batch: int, *, norm: str,
                bytes_per_element: int, fused_attention: bool = True) -> int:
    """Bytes one block of ``arch`` saves for backward, operation by operation, with
    ``bytes_per_element``-byte activations (2 under bf16 compute, 4 in fp32).

    Two normalizations (:data:`NORMS`); attention keeps ``q``, ``k``, ``v`` and its output, and
    with a fused kernel (SDPA's flash or memory-efficient) an fp32 log-sum-exp per query and head,
    else the ``s x s`` probabilities and the causal mask; the MLP keeps, gated (SwiGLU), its gate
    and up projections, ``silu(gate)`` and their product, else its activation's input and output.
    The activation page measures this count: ``norm="composite"`` in bf16 for a Llama block
    (:func:`llama_layer_bytes`), ``norm="fused"`` in fp32 for TinyLM's GPT block
    (:func:`tinylm_layer_bytes`, both attention kinds), to the byte.
    """
    s, b = _sizes(seq_len, micro_batch)
    e = positive_int("bytes_per_element", bytes_per_element, "bytes per activation element")
    t, h, a, m = s * b, arch.hidden, arch.heads, arch.mlp
    kv = (arch.kv_heads or a) * (h // a)
    attention = t * e * (2 * h + 2 * kv) + (t * a * _FP32 if fused_attention
                                            else a * s * s * b * e + s * s)
    mlp = t * e * m * (4 if arch.gated_mlp else 2)
    return 2 * _norm_bytes(arch, t, e, norm) + attention + mlp


def block_norm_bytes(arch: Architecture, seq_len: int, micro_batch: int, *, norm: str,
                     bytes_per_element: int) -> int:
    """The part of :func:`block_bytes` its two normalizations keep (their inputs, statistics and
    outputs): what every rank of a tensor-parallel group holds whole without sequence
    parallelism; the rest of the block (attention, MLP) splits over the group."""
    s, b = _sizes(seq_len, micro_batch)
    e = positive_int("bytes_per_element", bytes_per_element, "bytes per activation element")
    return 2 * _norm_bytes(arch, s * b, e, norm)


def selective_layer_bytes(arch: Architecture, seq_len: int, micro_batch: int, *,
                          bytes_per_element: int) -> int:
    """Bytes one block keeps under torchtitan's op-level selective checkpointing: its input,
    the outputs of the 1st, 3rd, 5th, ... matmul of the block (the policy saves ``aten.mm``
    outputs except every second one), and SDPA's output and fp32 log-sum-exp; everything else
    is recomputed in backward. Llama: q, v, the gate and the down projection are kept."""
    s, b = _sizes(seq_len, micro_batch)
    e = positive_int("bytes_per_element", bytes_per_element, "bytes per activation element")
    t = s * b
    kept_matmuls = sum(_matmul_outputs(arch, t, e)[::2])
    return t * e * arch.hidden + kept_matmuls + t * e * arch.hidden + t * arch.heads * _FP32


def logits_bytes(arch: Architecture, seq_len: int, micro_batch: int) -> int:
    """The loss's fp32 logits and their fp32 gradient: ``2 * 4 * vocab`` bytes per token.
    ``cross_entropy(logits.float())`` keeps the fp32 log-probabilities for backward, and its
    backward makes an fp32 gradient of the same size before the bf16 one (a compiled or chunked
    loss keeps less: not modelled)."""
    s, b = _sizes(seq_len, micro_batch)
    return 2 * _FP32 * arch.vocab * s * b


def activation_bytes(arch: Architecture, seq_len: int, micro_batch: int, *,
                     checkpointing: str = "none", norm: str = "fused",
                     bytes_per_element: int = 2, fused_attention: bool = True) -> int:
    """Predicted activation bytes per rank for ``arch``: what the forward keeps for backward at
    the start of backward, its peak.

    The blocks (``checkpointing``, :data:`CHECKPOINTING`): ``"none"``, every block's
    :func:`block_bytes`; ``"full"``, every block's input plus one block's full activations,
    rebuilt during its backward; ``"selective"``, every block's :func:`selective_layer_bytes`
    plus one block rebuilt. Then the head: the final normalization and :func:`logits_bytes`.
    ``norm``: :data:`NORMS` (``"fused"`` by default, what a GPU run should use);
    ``bytes_per_element``: the compute dtype's size (2 for bf16). Data parallelism does not shard
    activations: each rank holds those of its own micro-batch. A ``seq_len`` beyond the model's
    ``max_seq_len`` is refused.
    """
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"unknown activation checkpointing {checkpointing!r}; choose one of "
                         f"{', '.join(CHECKPOINTING)}.")
    s = arch.check_seq_len(seq_len)
    e = positive_int("bytes_per_element", bytes_per_element, "bytes per activation element")
    layer = block_bytes(arch, s, micro_batch, norm=norm, bytes_per_element=e,
                        fused_attention=fused_attention)
    if checkpointing == "none":
        blocks = arch.layers * layer
    elif checkpointing == "full":
        blocks = arch.layers * checkpointed_layer_bytes(arch.hidden, s, micro_batch, e) + layer
    else:
        blocks = arch.layers * selective_layer_bytes(arch, s, micro_batch,
                                                     bytes_per_element=e) + layer
    head = _norm_bytes(arch, s * micro_batch, e, norm) + logits_bytes(arch, s, micro_batch)
    return blocks + head
