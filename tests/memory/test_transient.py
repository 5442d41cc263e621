"""The step's memory beyond model state, each part against an independent value: the per-operation
block count against the activation page's measured counts (TinyLM's GPT block, the Llama block),
selective checkpointing and the logits against hand formulas, autocast's weight copies and FSDP2's
buffers against the shapes written out; and the pages that state FSDP2's buffers use this count."""

from __future__ import annotations

import math
import re

import pytest

from conftest import EXAMPLES
from guide.memory import PRESETS, autocast_weight_bytes, fsdp2_buffer_bytes
from guide.memory.activations import (
    activation_bytes,
    block_bytes,
    korthikanti_layer_bytes,
    llama_layer_bytes,
    logits_bytes,
    selective_layer_bytes,
    tinylm_layer_bytes,
)
from guide.memory.architectures import Architecture
from guide.memory.fit import per_gpu
from guide.model import ModelConfig

ROOT = EXAMPLES.parent


def _gpt(cfg: ModelConfig) -> Architecture:
    return Architecture(vocab=cfg.vocab, hidden=cfg.d_model, layers=cfg.n_layers,
                        heads=cfg.n_heads, mlp=cfg.d_mlp, gated_mlp=False, bias=True,
                        layernorm=True, learned_positions=True, max_seq_len=cfg.max_seq)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("s,b", [(16, 3), (32, 1), (8, 2)])
def test_gpt_block_is_tinylm_measured_count(attention, s, b):
    """TinyLM's block (fp32, LayerNorm, GELU MLP), whose saved bytes the activation page and
    test_activations.py measure with hooks: the general count gives the same bytes."""
    cfg = ModelConfig(attention=attention)
    assert block_bytes(_gpt(cfg), s, b, norm="fused", bytes_per_element=4,
                       fused_attention=attention == "sdpa") == tinylm_layer_bytes(cfg, s, b)


@pytest.mark.parametrize("h,a,kv,m", [(128, 8, 1, 448), (64, 4, 2, 160), (256, 16, 16, 1024)])
def test_composite_llama_block_is_the_measured_count(h, a, kv, m):
    arch = Architecture(vocab=10, hidden=h, layers=1, heads=a, kv_heads=kv, mlp=m)
    assert block_bytes(arch, 128, 2, norm="composite", bytes_per_element=2) == \
        llama_layer_bytes(128, 2, h, a, kv, m)


def test_fused_norm_keeps_input_output_and_rstd():
    """Each fused RMSNorm keeps 2sbh + 4sb bytes with its bf16 output (the next linears'
    input) 2sbh: 6sbh + 4sb less than the composite's 10sbh + 4sb + ... per norm."""
    arch, s, b = PRESETS["llama-3-8b"], 512, 2
    t, h = s * b, arch.hidden
    fused = block_bytes(arch, s, b, norm="fused", bytes_per_element=2)
    assert block_bytes(arch, s, b, norm="composite", bytes_per_element=2) - fused == 2 * 6 * t * h
    # ratio to Korthikanti's 34sbh: 41/34 at 8B (kv = a/4), 40.5/34 at 70B (kv = a/8)
    for key, want in (("llama-3-8b", 1.21), ("llama-3-70b", 1.19)):
        a = PRESETS[key]
        ratio = (block_bytes(a, 4096, 1, norm="fused", bytes_per_element=2)
                 / korthikanti_layer_bytes(4096, 1, a.hidden, a.heads, fused_attention=True))
        assert round(ratio, 2) == want
    with pytest.raises(ValueError, match="nn.LayerNorm is one fused kernel"):
        block_bytes(_gpt(ModelConfig()), 8, 1, norm="composite", bytes_per_element=2)


def test_selective_keeps_every_second_matmul_and_sdpa():
    """torchtitan's op policy on a Llama block: input, q, v, gate, down, SDPA out, lse."""
    arch, s, b = PRESETS["llama-3-8b"], 1024, 2
    t, h, m, kv = s * b, 4096, 14336, 1024
    want = 2 * t * (h + h + kv + m + h + h) + 4 * t * arch.heads
    assert selective_layer_bytes(arch, s, b, bytes_per_element=2) == want
    gpt = _gpt(ModelConfig())  # q, k, v, o, fc1, fc2: q, v and fc1 kept
    d, f = gpt.hidden, gpt.mlp
    assert selective_layer_bytes(gpt, 8, 1, bytes_per_element=2) == \
        2 * 8 * (d + d + d + f + d) + 4 * 8 * gpt.heads


def test_activation_bytes_adds_the_head_and_one_recomputed_block():
    arch, s = PRESETS["llama-3-8b"], 2048
    layer = block_bytes(arch, s, 1, norm="fused", bytes_per_element=2)
    head = s * (4 * arch.hidden + 4) + 8 * arch.vocab * s
    assert logits_bytes(arch, s, 1) == 2 * 4 * 128256 * s
    assert activation_bytes(arch, s, 1) == arch.layers * layer + head
    assert activation_bytes(arch, s, 1, checkpointing="selective") == \
        arch.layers * selective_layer_bytes(arch, s, 1, bytes_per_element=2) + layer + head
    assert activation_bytes(arch, s, 1, checkpointing="full") == \
        arch.layers * 2 * s * arch.hidden + layer + head


def test_autocast_copies_every_linear_weight_in_bf16():
    arch = PRESETS["llama-3-8b"]
    h, kv, m = 4096, 1024, 14336
    linears = arch.layers * (2 * h * h + 2 * kv * h + 3 * m * h) + 128256 * h
    assert autocast_weight_bytes(arch, "ddp", "bf16_mixed") == 2 * linears
    assert autocast_weight_bytes(arch, "zero1", "bf16_mixed") == 2 * linears
    for key, precision in (("fsdp2", "bf16_mixed"), ("ddp", "fp32"), ("ddp", "bf16"),
                           ("ddp", "zero_mixed")):
        assert autocast_weight_bytes(arch, key, precision) == 0, (key, precision)
    tied = PRESETS["llama-3.2-1b"]  # the head is the embedding, used as a linear: copied too
    assert autocast_weight_bytes(tied, "ddp", "bf16_mixed") == 2 * (
        tied.layers * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048) + 128256 * 2048)


def test_fsdp2_buffers_are_root_and_two_blocks_gathered_and_one_blocks_gradients():
    arch = PRESETS["llama-3-70b"]
    h, kv, m, v = 8192, 1024, 28672, 128256
    block = 2 * h * h + 2 * kv * h + 3 * m * h + 2 * h
    root = 2 * v * h + h
    # bf16 gathered root + its bf16 grads; 2 bf16 blocks; a block's bf16 grads + fp32 RS input
    assert fsdp2_buffer_bytes(arch, "fsdp2", "bf16_mixed") == \
        root * (2 + 2) + block * (2 * 2 + 2 + 4)
    assert fsdp2_buffer_bytes(arch, "hsdp", "bf16_mixed") == root * 4 + block * 10
    assert fsdp2_buffer_bytes(arch, "fsdp2_no_reshard", "bf16_mixed") == root * 2 + block * 6
    assert fsdp2_buffer_bytes(arch, "ddp", "bf16_mixed") == 0
    split = per_gpu(arch, "fsdp2", 64, "bf16_mixed", "adamw", activations=0, ddp_buckets=True)
    assert split.buffers == root * 4 + block * 10
    assert per_gpu(10**9, "fsdp2", 8, "bf16", "adamw", activations=0,
                   ddp_buckets=True).buffers == 0  # a count alone: no shapes, no buffers


def test_the_pages_count_fsdp2_buffers_with_the_one_model():
    """Every page that states FSDP2's transient buffers calls guide.memory's count, and none
    still says FSDP2 holds one gathered block (the backward holds two and the root)."""
    pages = {p: p.read_text() for p in (ROOT / "docs" / "index.md",
                                        EXAMPLES / "plot_step_time_estimates.py")}
    for path, text in pages.items():
        assert "memory.fsdp2_buffer_bytes(" in text or "fsdp2_buffer_bytes(ARCH" in text, path
        assert not re.search(r"def fsdp2_buffer_bytes", text), path
    for path in EXAMPLES.glob("plot_*.py"):
        assert "plus one gathered block" not in path.read_text(), path
