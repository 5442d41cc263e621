"""The models of tensor parallelism, against values computed here by hand (no ranks): what each dp
rank of a TP + FSDP2 mesh holds (:func:`guide.tensor_parallel.expected_layout`), TP's all-reduces
in a step (:func:`guide.comm.tp.tp_step`) and the estimate of what TP changes per GPU
(:func:`guide.comm.tp.tp_fsdp_estimate`: the memory model's block, its norms whole, the rest over t)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from guide.comm.tp import KORTHIKANTI_TP_SBH, tp_fsdp_estimate, tp_step
from guide.memory import PRESETS
from guide.memory.activations import block_bytes, block_norm_bytes
from guide.memory.architectures import Architecture
from guide.model import ModelConfig
from guide.tensor_parallel import build_tp_model, expected_layout, plan_kinds, tp_local_shapes

CFG = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=4, d_mlp=32, max_seq=8)
PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
        "proj": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


@pytest.mark.parametrize("dp", [3, 5])
def test_each_dp_rank_holds_its_own_torch_chunk_of_the_tp_shard(dp: int) -> None:
    """FSDP2 gives dp rank r ``torch.chunk(tp_local, dp)[r]``: with 16 rows over 3 ranks that is
    6, 6, 4 (over 5: 4, 4, 4, 4, 0), so the last ranks differ from rank 0."""
    model = build_tp_model(CFG)
    local = tp_local_shapes(model, PLAN, 2)
    seen = set()
    for dp_rank in range(dp):
        layout = expected_layout(model, PLAN, dp, 2, dp_rank)
        for name, (_, shape) in layout.items():
            chunks = torch.empty(local[name]).chunk(dp)
            rows = chunks[dp_rank].shape[0] if dp_rank < len(chunks) else 0
            assert shape == (rows, *local[name][1:]), (name, dp_rank)
        seen.add(layout["ln_f.weight"][1])
    assert len(seen) > 1, "every dp rank was given the same shard"


def test_the_placements_name_the_tp_degree_and_the_split_dims() -> None:
    layout = expected_layout(build_tp_model(CFG), PLAN, 2, 4, 0)
    assert layout["blocks.0.k.weight"] == ("(_StridedShard(dim=0, sf=4), Shard(dim=0))", (2, 16))
    assert layout["blocks.0.fc1.bias"] == ("(_StridedShard(dim=0, sf=4), Shard(dim=0))", (4,))
    assert layout["blocks.0.proj.weight"] == ("(Shard(dim=0), Shard(dim=1))", (8, 4))
    assert layout["blocks.0.proj.bias"] == ("(Shard(dim=0), Replicate())", (8,))
    assert layout["tok_emb.weight"] == ("(Shard(dim=0),)", (16, 16))


def test_tp_step_has_every_forward_and_backward_all_reduce_with_its_width() -> None:
    """Per block, forward: proj and fc2 outputs (d_model wide); backward: the input gradients of
    q, k, v (d_model) and fc1 (d_model). With fc1 -> 48 wide and fc2 taking 48: still d_model."""
    model = build_tp_model(CFG)
    step = tp_step(model, plan_kinds(PLAN), tokens=10, tp=4, dtype=torch.bfloat16)
    assert [(c.phase, c.numel) for c in step] == (
        [("forward", 10 * 16)] * 2 * CFG.n_layers + [("backward", 10 * 16)] * 4 * CFG.n_layers)
    assert {(c.kind, c.dtype, c.bytes, c.group_size) for c in step} == \
        {("all_reduce", "bfloat16", 10 * 16 * 2, 4)}
    wide = build_tp_model(ModelConfig(vocab=32, d_model=16, n_layers=1, n_heads=4, d_mlp=48,
                                      max_seq=8))
    kinds = {"fc1": "colwise", "fc2": "rowwise"}
    assert [(c.phase, c.numel) for c in tp_step(wide, kinds, tokens=3, tp=2)] == \
        [("forward", 3 * 16), ("backward", 3 * 16)]
    kinds = {"fc2": "colwise", "fc1": "rowwise"}  # the other way round: fc2's input is 48 wide
    assert [(c.phase, c.numel) for c in tp_step(wide, kinds, tokens=3, tp=2)] == \
        [("forward", 3 * 48), ("backward", 3 * 48)]
    with pytest.raises(ValueError, match="tp"):
        tp_step(model, plan_kinds(PLAN), tokens=10, tp=0)
    with pytest.raises(ValueError, match="tokens"):
        tp_step(model, plan_kinds(PLAN), tokens=0, tp=2)


# llama-3-8b by hand: h = 4096, 8 kv heads of 128, MLP 14336 (gated), 2 RMSNorms per layer
H, KV, F, LAYERS = 4096, 1024, 14336, 32
LAYER_PARAMS = H * H * 2 + KV * H * 2 + 3 * H * F + 2 * H  # q, o; k, v; gate, up, down; norms


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_estimate_splits_the_memory_models_block_and_divides_the_layer_by_tp(tp: int) -> None:
    """The activations are the memory model's per-operation block (guide.memory.activations,
    checked against measured blocks on the activation page): the norms' part stays whole on every
    TP rank, the rest is divided by t; with sequence parallelism all of it is."""
    arch, s, b = PRESETS["llama-3-8b"], 4096, 2
    assert LAYER_PARAMS == 218_112_000  # 8.03 B parameters less 2 x 525 M embeddings, / 32
    sbh = s * b * H
    est = tp_fsdp_estimate(arch, 64, tp, s, micro_batch=b)
    assert KORTHIKANTI_TP_SBH == (10, 24)  # kept for comparison only
    layer = block_bytes(arch, s, b, norm="fused", bytes_per_element=2)
    whole = block_norm_bytes(arch, s, b, norm="fused", bytes_per_element=2)
    assert 0 < whole < layer
    assert est.activation_bytes == LAYERS * (layer if tp == 1 else whole + (layer - whole) // tp)
    assert est.gathered_layer_bytes == LAYER_PARAMS * 2 // tp
    assert est.tp_all_reduce_bytes == (0 if tp == 1 else 4 * sbh * 2)  # 2 fwd + 2 bwd, 16-bit
    assert (est.tp, est.dp, est.global_batch) == (tp, 64 // tp, b * 64 // tp)
    sp = tp_fsdp_estimate(arch, 64, tp, s, micro_batch=b, sequence_parallel=True, param_bytes=4)
    assert sp.activation_bytes == LAYERS * (layer // tp)
    assert sp.gathered_layer_bytes == LAYER_PARAMS * 4 // tp
    for e in (est, sp):  # whole bytes and ranks (a page prints them): ints, not 6.0
        assert {f: type(v) for f, v in vars(e).items()} == dict.fromkeys(vars(e), int)


def test_the_gathered_layer_is_a_layer_not_the_embeddings_even_with_one_layer() -> None:
    arch = Architecture(vocab=1000, hidden=8, layers=1, heads=2, mlp=12, gated_mlp=False)
    layer = 2 * 8 + 4 * 8 * 8 + 12 * 8 + 8 * 12  # 2 norms, q k v o, fc1, fc2 (no biases)
    assert math.prod(arch.fsdp2_units()[0][0]) == 8000  # the embeddings: far bigger
    assert tp_fsdp_estimate(arch, 2, 2, 16, gpus_per_node=2).gathered_layer_bytes == layer


@pytest.mark.parametrize("kwargs, match", [
    (dict(gpus=64, tp=16), "fit in a node of 8"),
    (dict(gpus=12, tp=8), "must divide gpus=12"),
    (dict(gpus=6, tp=3), "must divide the 32 heads and 8 kv heads"),
    (dict(gpus=64, tp=0), "tp"),
])
def test_the_estimate_refuses_what_tp_cannot_do(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tp_fsdp_estimate(PRESETS["llama-3-8b"], seq_len=4096, **kwargs)


def test_a_tp_degree_dividing_the_heads_but_not_the_kv_heads_is_refused() -> None:
    arch = Architecture(vocab=64, hidden=64, layers=1, heads=8, kv_heads=2, mlp=64)
    with pytest.raises(ValueError, match="8 heads and 2 kv heads"):
        tp_fsdp_estimate(arch, 4, 4, 16)
    assert tp_fsdp_estimate(arch, 4, 2, 16).tp == 2


def test_the_messages_name_the_argument_and_what_it_counts() -> None:
    model = build_tp_model(CFG)
    with pytest.raises(ValueError, match=r"^tp must be a positive integer \(the tensor-parallel "
                                         r"degree\), got 0\.$"):
        tp_step(model, plan_kinds(PLAN), tokens=10, tp=0)
    with pytest.raises(ValueError, match=r"^tokens must be a positive integer \(tokens per rank "
                                         r"per step\), got 0\.$"):
        tp_step(model, plan_kinds(PLAN), tokens=0, tp=2)
    with pytest.raises(ValueError, match=r"^dp must be a positive integer \(the data-parallel "
                                         r"degree\), got 0\.$"):
        expected_layout(model, PLAN, 0, 2, 0)
    with pytest.raises(ValueError, match=r"^tp must be a positive integer \(the tensor-parallel "
                                         r"degree\), got 0\.$"):
        tp_local_shapes(model, PLAN, 0)
    with pytest.raises(ValueError, match=r"^blocks.0.q.weight: dim 0 of \(16, 16\) is not "
                                         r"divisible by tp=3; pick a tensor-parallel degree that "
                                         r"divides the heads and the MLP width\.$"):
        tp_local_shapes(model, PLAN, 3)
    with pytest.raises(ValueError, match=r"^plan entry 'q': object is not ColwiseParallel or "
                                         r"RowwiseParallel; tp_local_shapes knows only those "
                                         r"two\.$"):
        plan_kinds({"q": object()})
    with pytest.raises(ValueError, match=r"^build_tp_model uses scaled_dot_product_attention; pass "
                                         r"a ModelConfig with attention='sdpa' "
                                         r"\(got 'explicit'\)\.$"):
        build_tp_model(ModelConfig(attention="explicit"))
    for name in ("gpus", "tp", "seq_len", "micro_batch", "param_bytes"):
        kwargs = dict(gpus=8, tp=2, seq_len=64, micro_batch=1, param_bytes=2) | {name: 0}
        with pytest.raises(ValueError, match=rf"^{name} must be a positive integer, got 0\.$"):
            tp_fsdp_estimate(PRESETS["llama-3-8b"], **kwargs)
    with pytest.raises(ValueError, match=r"^tp=16 must divide gpus=64 and fit in a node of 8 GPUs "
                                         r"\(TP's all-reduces need NVLink\)\.$"):
        tp_fsdp_estimate(PRESETS["llama-3-8b"], 64, 16, 64)
    with pytest.raises(ValueError, match=r"^tp=3 must divide the 32 heads and 8 kv heads\.$"):
        tp_fsdp_estimate(PRESETS["llama-3-8b"], 6, 3, 64)


def test_a_model_without_kv_heads_uses_its_heads_and_tp_may_fill_the_node() -> None:
    arch = Architecture(vocab=64, hidden=48, layers=1, heads=6, mlp=64)  # kv_heads None: MHA
    with pytest.raises(ValueError, match="the 6 heads and 6 kv heads"):
        tp_fsdp_estimate(arch, 4, 4, 16)
    assert tp_fsdp_estimate(arch, 16, 2, 16, gpus_per_node=2).dp == 8  # tp == gpus_per_node


def test_a_module_outside_the_blocks_named_like_a_plan_entry_keeps_its_shape() -> None:
    """Only ``blocks.<i>.<name>`` is in the plan: a top-level ``proj`` is FSDP2's alone."""
    from torch import nn

    model = build_tp_model(CFG)
    model.proj = nn.Linear(16, 16)
    local = tp_local_shapes(model, PLAN, 2)
    assert local["proj.weight"] == (16, 16) and local["blocks.0.proj.weight"] == (16, 8)
    assert expected_layout(model, PLAN, 2, 2, 0)["proj.weight"] == ("(Shard(dim=0),)", (8, 16))


def test_the_tp_model_depends_only_on_its_seed_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_tp_model(CFG, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.rand(7)
    b = build_tp_model(CFG, 3)
    c = build_tp_model(CFG, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.blocks[0].q.weight, c.blocks[0].q.weight)
    torch.manual_seed(0)
    default = build_tp_model(CFG)
    assert torch.equal(default.blocks[1].fc1.weight,
                       build_tp_model(CFG, seed=0).blocks[1].fc1.weight)
    assert {p.device.type for p in default.parameters()} == {"cpu"}
    assert [type(b).__name__ for b in default.blocks] == ["TPBlock"] * CFG.n_layers
    assert default.blocks[0].q.bias is None and default.blocks[0].proj.bias is not None
    assert {p.device.type for p in build_tp_model(CFG, device="meta").parameters()} == {"meta"}
