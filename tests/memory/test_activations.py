"""Activation memory: the counter (guide.saved_tensors), the formulas (guide.memory.activations)
and the attention switch of guide.model, each proven against what autograd really saves, with the
faults each guard must catch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from conftest import EXAMPLES
from faults import assert_fails_by_name, mistagged
from guide import saved_tensors
from guide.memory.activations import (
    activation_bytes,
    block_bytes,
    checkpointed_layer_bytes,
    korthikanti_layer_bytes,
    llama_layer_bytes,
    tinylm_layer_bytes,
    tinylm_terms,
)
from guide.memory.architectures import Architecture
from guide.memory.state import GiB
from guide.model import ModelConfig, build_model
from guide.saved_tensors import SavedTensors
from guide.training import next_token_loss

PAGE = EXAMPLES / "plot_activation_memory.py"


def _block_saved(cfg: ModelConfig, b: int, s: int) -> int:
    model = build_model(cfg)
    x = model.tok_emb(torch.randint(0, cfg.vocab, (b, s)))
    with SavedTensors() as saved:
        model.blocks[0](x)
    return saved.nbytes


# -- the formula, against the measurement ------------------------------------------------------

@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("s,b,h,a,m", [
    (1, 1, 8, 1, 32), (16, 1, 64, 4, 256), (33, 3, 96, 6, 200), (64, 2, 32, 1, 128),
    (128, 4, 128, 8, 512), (100, 2, 64, 16, 100),
])
def test_measured_equals_derived_to_the_byte(attention, s, b, h, a, m):
    cfg = ModelConfig(d_model=h, n_heads=a, d_mlp=m, max_seq=128, attention=attention)
    assert _block_saved(cfg, b, s) == tinylm_layer_bytes(cfg, s, b)


def _page_llama_block() -> type:
    """The page's own ``LlamaBlock`` class, taken from its source (not a copy)."""
    import ast

    tree = ast.parse(PAGE.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LlamaBlock")
    scope = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional}
    exec(compile(ast.Module([node], []), str(PAGE), "exec"), scope)
    return scope["LlamaBlock"]


@pytest.mark.parametrize("s,b,h,a,kv,m", [
    (16, 1, 64, 4, 1, 224), (128, 2, 128, 8, 1, 448), (33, 3, 96, 6, 2, 200),
    (64, 2, 64, 4, 4, 256),
])
def test_llama_block_measured_equals_per_operation_count(s, b, h, a, kv, m):
    torch.manual_seed(0)
    block = _page_llama_block()(h, a, kv, m).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    with SavedTensors() as saved:
        block(x)
    assert saved.nbytes == llama_layer_bytes(s, b, h, a, kv, m)
    # the count tells the kv heads apart: one more kv head per group would change it
    assert llama_layer_bytes(s, b, h, a, kv, m) != llama_layer_bytes(s, b, h, a, a, m) or kv == a


def test_llama_layer_bytes_refuses_kv_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="kv_heads"):
        llama_layer_bytes(8, 1, 64, 4, 3, 128)


def test_closed_form_with_a_4h_mlp():
    s, b, h, a = 64, 2, 64, 4
    sdpa = ModelConfig(d_model=h, n_heads=a, d_mlp=4 * h, max_seq=s)
    explicit = dataclasses.replace(sdpa, attention="explicit")
    assert tinylm_layer_bytes(sdpa, s, b) == 64 * s * b * h + 16 * s * b + 4 * a * s * b
    assert (tinylm_layer_bytes(explicit, s, b)
            == 64 * s * b * h + 16 * s * b + 4 * a * s * s * b + s * s)


def test_korthikanti_column_sums_to_eq_1():
    cfg = ModelConfig(d_model=64, n_heads=4, d_mlp=256, max_seq=64)
    terms = tinylm_terms(cfg, 64, 2)
    assert sum(t.korthikanti for t in terms) == korthikanti_layer_bytes(64, 2, 64, 4,
                                                                      fused_attention=False)
    assert all(t.why for t in terms)


def test_korthikanti_reproduces_the_published_70b_example():
    """memory-and-comm-math.md §6: h=8192, L=80, a=64, s=8192, b=1: 170 GiB with the 34 term
    only, 1,770 GiB with the scores; full checkpointing keeps about 10 GiB of layer inputs."""
    layers = 80
    fused = layers * korthikanti_layer_bytes(8192, 1, 8192, 64, fused_attention=True)
    full = layers * korthikanti_layer_bytes(8192, 1, 8192, 64, fused_attention=False)
    assert round(fused / GiB) == 170
    assert round(full / GiB) == 1770
    assert round(layers * checkpointed_layer_bytes(8192, 8192, 1, 2) / GiB) == 10


def test_a_counter_that_counts_weights_is_caught(monkeypatch):
    """Fault: the counter treats parameters as activations. The measured bytes exceed the formula
    by exactly the parameters the block saves: every weight, and the LayerNorms' biases (their
    backward takes them); a linear layer's bias is not saved."""
    cfg = ModelConfig(d_model=64, n_heads=4, d_mlp=256, max_seq=64)
    monkeypatch.setattr(saved_tensors, "is_parameter", lambda t: False)
    got, want = _block_saved(cfg, 2, 64), tinylm_layer_bytes(cfg, 64, 2)
    block = build_model(cfg).blocks[0]
    weights = sum(p.numel() * 4 for n, p in block.named_parameters()
                  if n.endswith("weight") or n.startswith("ln"))
    assert got - want == weights


def test_a_formula_without_the_layernorm_statistics_is_caught(monkeypatch):
    """Fault: the formula forgets the per-token LayerNorm statistics (as Korthikanti does)."""
    from guide.memory import activations

    cfg = ModelConfig(d_model=64, n_heads=4, d_mlp=256, max_seq=64)
    real = activations.tinylm_terms
    monkeypatch.setattr(activations, "tinylm_terms", lambda *a: [
        t for t in real(*a) if not t.name.startswith("LayerNorm mean")])
    assert _block_saved(cfg, 2, 64) - activations.tinylm_layer_bytes(cfg, 64, 2) == 16 * 64 * 2


# -- the counter's rules -------------------------------------------------------------------------

def test_a_storage_saved_twice_counts_once_and_parameters_not_at_all():
    lin = nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensors() as saved:
        y = lin(x)          # saves x (and weight.t(), a parameter view)
        z = x * x           # saves x twice more
        (y.sum() + z.sum()).backward()
    assert saved.nbytes == x.numel() * 4
    assert len(saved.storages) == 1 and saved.storages[0].shape == (4, 8)


def test_views_of_one_storage_count_the_whole_storage_once():
    qkv = torch.randn(2, 6, 3 * 8, requires_grad=True) * 1  # non-leaf, one storage
    q, k, _ = qkv.split(8, dim=-1)
    with SavedTensors() as saved:
        q * k  # saves q and k: two views of one storage
    assert saved.nbytes == qkv.numel() * 4


def test_modules_limit_the_count_and_a_module_list_means_its_items():
    model = build_model(ModelConfig(n_layers=2, max_seq=16))
    tokens = torch.randint(0, 128, (2, 17))
    with SavedTensors(model.blocks) as blocks:
        next_token_loss(model, tokens)
    with SavedTensors(model.blocks[0]) as first:
        next_token_loss(model, tokens)
    with SavedTensors() as everything:
        next_token_loss(model, tokens)
    assert blocks.nbytes == 2 * first.nbytes == 2 * tinylm_layer_bytes(model.cfg, 16, 2)
    assert everything.nbytes > blocks.nbytes  # embeddings, final norm, head, loss


def test_checkpointed_blocks_count_their_inputs_only():
    cfg = ModelConfig(n_layers=3, max_seq=16)
    model = build_model(cfg)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    with SavedTensors(model.blocks) as saved:
        loss = next_token_loss(model, torch.randint(0, 128, (2, 17)))
    loss.backward()  # the checkpoints still work: the counter returned every tensor unchanged
    assert saved.nbytes == 3 * checkpointed_layer_bytes(cfg.d_model, 16, 2, 4)


def test_an_exception_inside_a_module_leaves_no_hooks_behind():
    class Boom(nn.Module):
        def forward(self, x):
            x = x * x
            raise RuntimeError("boom")

    boom = Boom()
    with pytest.raises(RuntimeError, match="boom"), SavedTensors(boom):
        boom(torch.randn(3, requires_grad=True))
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_an_empty_module_list_is_refused():
    with pytest.raises(ValueError, match="count nothing"):
        SavedTensors([])


# -- the attention switch ---------------------------------------------------------------------

def test_explicit_attention_computes_what_sdpa_computes():
    cfg = ModelConfig(max_seq=32)
    sdpa, explicit = build_model(cfg), build_model(dataclasses.replace(cfg, attention="explicit"))
    tokens = torch.randint(0, 128, (3, 32))
    assert (sdpa(tokens) - explicit(tokens)).abs().max().item() < 1e-5


def test_default_attention_is_sdpa_and_unknown_is_refused():
    assert ModelConfig().attention == "sdpa"
    with pytest.raises(ValueError, match=r"attention must be one of \('sdpa', 'explicit'\)"):
        ModelConfig(attention="flash")
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        ModelConfig(n_heads=0)


# -- bad input ---------------------------------------------------------------------------------

ARCH = Architecture(vocab=100, hidden=64, layers=2, heads=4, mlp=256, max_seq_len=128)


@pytest.mark.parametrize("call,match", [
    (lambda: tinylm_layer_bytes(ModelConfig(max_seq=32), 33, 1), "exceeds ModelConfig.max_seq=32"),
    (lambda: tinylm_layer_bytes(ModelConfig(), 8, 0), "micro_batch must be a positive integer"),
    (lambda: korthikanti_layer_bytes(0, 1, 64, 4, fused_attention=True), "seq_len must be"),
    (lambda: checkpointed_layer_bytes(64, 8, 1, 0), "bytes_per_element must be"),
    (lambda: activation_bytes(ARCH, 129, 1), "longer than this model supports"),
    (lambda: activation_bytes(ARCH, 8, 1, checkpointing="offload"),
     "unknown activation checkpointing 'offload'; choose one of none, full, selective"),
    (lambda: activation_bytes(ARCH, 8, 1, norm="apex"), "unknown norm 'apex'"),
])
def test_bad_input_is_a_value_error_naming_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_full_checkpointing_keeps_inputs_plus_one_layer():
    none = activation_bytes(ARCH, 128, 2)
    full = activation_bytes(ARCH, 128, 2, checkpointing="full")
    layer = block_bytes(ARCH, 128, 2, norm="fused", bytes_per_element=2)
    head = none - 2 * layer  # the final norm, the logits and their gradient
    assert head == 128 * 2 * (2 * 2 * 64 + 4) + 8 * ARCH.vocab * 128 * 2
    assert full == 2 * 128 * 2 * 64 * 2 + layer + head


# -- the page's guard bites --------------------------------------------------------------------

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # The classic bug: rebinding the loop variable instead of replacing the module.
    "checkpointing_wraps_nothing": [
        ("wrap", "block = checkpoint_wrapper(block, preserve_rng_state=False)")],
}


def test_every_fault_point_is_tagged_once():
    assert mistagged(PAGE, FAULTS.values()) == {}


def test_page_fails_when_checkpointing_silently_wraps_nothing(tmp_path):
    """The classic bug: rebinding the loop variable instead of replacing the module. Nothing is
    checkpointed, nothing errors; the page must fail naming the check and the bytes."""
    fault = "checkpointing_wraps_nothing"
    assert_fails_by_name(PAGE, fault, FAULTS[fault],
                         r"CheckFailed: \[checkpointing keeps inputs\] FSDP2 x2, rank 0: "
                         r"checkpointed blocks saved 16,842,752 B, 4 block inputs are 1,048,576 B",
                         tmp_path, timeout=240)
