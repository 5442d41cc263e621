"""guide.memory.predicted: the ZeRO model's arithmetic, the one switch for DDP's buckets, the sequence
limit, the smallest world that fits, and one clear ValueError per mistake."""

from __future__ import annotations

import pytest

from guide import constants
from guide.memory import (
    GB,
    GPU_MEMORY_CONSTANTS,
    GPU_TOTAL_MEMORY_GIB,
    PRESETS,
    GiB,
    StateBytes,
    activation_bytes,
    min_world_size,
    per_rank_state_bytes,
    state_bytes_by_rank,
    state_bytes_for_count,
    unsharded_param_bytes,
    zero1_partition,
)
from guide.memory import fsdp2_buffer_bytes, predicted
from guide.memory.fit import per_gpu
from guide.sharding import Strategy
from guide.optimizers import OPTIMIZERS

# -- ZeRO's formulas and bytes per parameter --------------------------------------------------------


def test_zero_paper_figure_1():
    """ZeRO (arXiv 1910.02054) Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB."""
    got = [state_bytes_for_count(7_500_000_000, s, 64, "zero_mixed", "adamw",
                                 ddp_buckets=False).total / GB
           for s in ("ddp", "zero1", "zero2", "fsdp2")]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize(("precision", "optimizer", "bytes_per_param"), [
    ("fp32", "adamw", 16), ("bf16_mixed", "adamw", 16), ("zero_mixed", "adamw", 16),
    ("bf16", "adamw", 8), ("fp32", "sgd", 8), ("fp32", "sgd_momentum", 12), ("bf16", "sgd", 4),
])
def test_bytes_per_parameter(precision, optimizer, bytes_per_param):
    sb = state_bytes_for_count(1000, "ddp", 1, precision, optimizer, ddp_buckets=False)
    assert sb.model_state == sb.total == 1000 * bytes_per_param


def test_optimizer_moments_come_from_training():
    """One vocabulary: the memory model reads moments and step bytes from optimizers.OPTIMIZERS, so
    a change there changes the prediction (no private copy to drift)."""
    shapes = [(10, 10)]
    for key, spec in OPTIMIZERS.items():
        sb = per_rank_state_bytes(shapes, "ddp", 1, "fp32", key, ddp_buckets=False)
        assert sb.optimizer == 100 * 4 * spec.moments + spec.step_bytes, key


def test_seed_notebook_numbers():
    """The seed's code (8 B/param) gave 521.5 GiB for 70B DDP; 16 B/param is 1,043.1 GiB of model
    state (1,303.9 GiB held, with DDP's buckets), and its "~140 GiB at N=8" is 140 GB = 130.4 GiB."""
    psi = 70_000_000_000
    seed = state_bytes_for_count(psi, "ddp", 1, "bf16", "adamw", ddp_buckets=False)
    assert round(seed.total / GiB, 1) == 521.5
    ddp = state_bytes_for_count(psi, "ddp", 8, "bf16_mixed", "adamw", ddp_buckets=True)
    assert round(ddp.model_state / GiB, 1) == 1043.1 and round(ddp.total / GiB, 1) == 1303.9
    n8 = state_bytes_for_count(psi, "fsdp2", 8, "bf16_mixed", "adamw", ddp_buckets=True).total
    assert n8 == 140 * GB and round(n8 / GiB, 1) == 130.4


# -- the shape-based model ---------------------------------------------------------------------------


def test_fsdp2_pads_params_and_grads_but_not_optimizer_state():
    # 5 rows over 4 ranks: torch.chunk gives 2, 2, 1, 0 rows; every rank allocates 2 rows.
    ranks = state_bytes_by_rank([(5, 3)], "fsdp2", 4, "fp32", "adamw", ddp_buckets=True)
    assert [r.params for r in ranks] == [2 * 3 * 4] * 4
    assert [r.grads for r in ranks] == [2 * 3 * 4] * 4
    assert [r.optimizer for r in ranks] == [2 * 3 * 8 + 4, 2 * 3 * 8 + 4, 1 * 3 * 8 + 4, 4]
    assert per_rank_state_bytes([(5, 3)], "fsdp2", 4, "fp32", "adamw", ddp_buckets=True) == ranks[0]
    # reshard_after_forward=False holds the same state between steps
    assert state_bytes_by_rank([(5, 3)], "fsdp2_no_reshard", 4, "fp32", "adamw",
                               ddp_buckets=True) == ranks


def test_chunking_gives_the_last_ranks_what_is_left_possibly_nothing():
    """torch.chunk semantics: 9 rows over 4 ranks are 3, 3, 3, 0, not 2, 2, 2, 3."""
    ranks = state_bytes_by_rank([(9,)], "fsdp2", 4, "fp32", "sgd_momentum", ddp_buckets=False)
    assert [r.optimizer // 4 for r in ranks] == [3, 3, 3, 0]


def test_fsdp2_is_one_nth_of_ddp_when_shapes_divide():
    shapes = [(64, 32), (64,), (128, 64)]
    ddp = per_rank_state_bytes(shapes, "ddp", 1, "fp32", "sgd_momentum", ddp_buckets=False)
    for n in (1, 2, 4, 8, 16, 32):
        fsdp = per_rank_state_bytes(shapes, "fsdp2", n, "fp32", "sgd_momentum", ddp_buckets=False)
        assert fsdp.total * n == ddp.total, n


def test_zero1_partition_is_greedy_largest_first():
    # sizes 10, 7, 5, 5, 3 -> r0: 10, r1: 7, r1: 5 (7 < 10), r0: 5 (10 < 12), r1: 3 (15 > 12)
    shapes = [(10,), (7,), (5,), (5,), (3,)]
    assert zero1_partition(shapes, 2) == [[0, 3], [1, 2, 4]]
    ranks = state_bytes_by_rank(shapes, "zero1", 2, "fp32", "adamw", ddp_buckets=False)
    assert [r.optimizer for r in ranks] == [15 * 8 + 2 * 4, 15 * 8 + 3 * 4]
    assert all(r.params == 30 * 4 and r.grads == 30 * 4 for r in ranks)


def test_zero1_floor_is_the_largest_tensor():
    """One big tensor cannot be split by ZeRO-1: its owner keeps all of its optimizer state."""
    shapes = [(1000, 1000)] + [(10,)] * 10
    top = per_rank_state_bytes(shapes, "zero1", 8, "fp32", "adamw", ddp_buckets=False)
    assert top.optimizer == 1000 * 1000 * 8 + 4


def test_unsharded_param_bytes_pads_to_n_chunks_in_the_compute_dtype():
    assert unsharded_param_bytes([(5, 3)], 4, "bf16_mixed") == 8 * 3 * 2
    assert unsharded_param_bytes([(5, 3)], 4, "fp32") == 8 * 3 * 4


# -- DDP's buckets: one switch, no default -----------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy))
def test_buckets_exactly_where_ddp_is_underneath(strategy):
    shapes = [(3, 4), (5,)]
    on = per_rank_state_bytes(shapes, strategy, 2, "fp32", "adamw", ddp_buckets=True)
    off = per_rank_state_bytes(shapes, strategy, 2, "fp32", "adamw", ddp_buckets=False)
    assert on.buckets == (17 * 4 if strategy.ddp_underneath else 0)
    assert off.buckets == 0 and on.model_state == off.model_state
    assert on.total == on.model_state + on.buckets
    count = state_bytes_for_count(17, strategy, 2, "bf16", "adamw", ddp_buckets=True)
    assert count.buckets == (17 * 2 if strategy.ddp_underneath else 0)


@pytest.mark.parametrize("call", [
    lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adamw"),
    lambda: state_bytes_for_count(16, "ddp", 2, "fp32", "adamw"),
    lambda: min_world_size(PRESETS["llama-3-8b"], "fsdp2", 80 * GiB, "bf16_mixed", "adamw",
                           seq_len=None),
])
def test_the_bucket_switch_has_no_default(call):
    with pytest.raises(TypeError, match="ddp_buckets"):
        call()


def test_the_bucket_switch_is_a_bool():
    with pytest.raises(ValueError, match="ddp_buckets must be True"):
        per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adamw", ddp_buckets="yes")


def test_strategy_by_enum_key_or_label_is_the_same():
    shapes = [(7, 3)]
    got = {per_rank_state_bytes(shapes, s, 2, "fp32", "adamw", ddp_buckets=True)
           for s in (Strategy.FSDP2, "fsdp2", "FSDP2")}
    assert len(got) == 1


def test_statebytes_is_frozen_and_adds():
    a = StateBytes(1, 2, 3, 4)
    assert (a + a).total == 20 and (a + a).model_state == 12
    assert a.gib()["total"] == 10 / GiB
    with pytest.raises(AttributeError):
        a.params = 5  # type: ignore[misc]


# -- activations and the smallest world that fits ---------------------------------------------------


def test_no_sequence_beyond_the_model_is_priced():
    """gpt2-xl has 1,024 learned positions: 1,024 tokens are priced, 1,025 are refused."""
    gpt2 = PRESETS["gpt2-xl"]
    assert activation_bytes(gpt2, 1024, 1) > 0
    with pytest.raises(ValueError, match=r"max_seq_len=1,024"):
        activation_bytes(gpt2, 1025, 1)
    with pytest.raises(ValueError, match=r"max_seq_len=1,024"):
        min_world_size(gpt2, "ddp", 80 * GiB, "bf16_mixed", "adamw", ddp_buckets=True,
                       seq_len=2048)


def test_min_world_size_is_the_first_n_that_fits():
    arch = PRESETS["llama-3-70b"]
    shapes = arch.param_shapes()
    cap = 80 * GiB
    n = min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", ddp_buckets=True, seq_len=None)
    held = {m: per_rank_state_bytes(shapes, "fsdp2", m, "bf16_mixed", "adamw",
                                    ddp_buckets=True).total + fsdp2_buffer_bytes(arch, "fsdp2",
                                                                                 "bf16_mixed")
            for m in (n // 2, n)}
    assert held[n] <= cap < held[n // 2]
    # activations are added on top, so the minimum can only grow
    with_act = min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", ddp_buckets=True,
                              seq_len=1024)
    assert with_act >= n
    assert per_rank_state_bytes(shapes, "fsdp2", with_act, "bf16_mixed", "adamw",
                                ddp_buckets=True).total + activation_bytes(arch, 1024, 1) \
        + fsdp2_buffer_bytes(arch, "fsdp2", "bf16_mixed") <= cap
    # DDP never shrinks with N: no world fits
    assert min_world_size(arch, "ddp", cap, "bf16_mixed", "adamw", ddp_buckets=True,
                          seq_len=None) is None


# -- bad input: one clear ValueError ------------------------------------------------------------------


@pytest.mark.parametrize(("call", "match"), [
    (lambda: per_rank_state_bytes([(4, 4)], "zero3", 2, "fp32", "adamw", ddp_buckets=True),
     "unknown strategy"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 0, "fp32", "adamw", ddp_buckets=True),
     "world_size"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2.0, "fp32", "adamw", ddp_buckets=True),
     "world_size"),
    (lambda: per_rank_state_bytes([(4, -4)], "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     "integer >= 0"),
    (lambda: per_rank_state_bytes([], "ddp", 2, "fp32", "adamw", ddp_buckets=True), "empty"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp16", "adamw", ddp_buckets=True),
     "unknown precision"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adam", ddp_buckets=True),
     "unknown optimizer"),
    (lambda: state_bytes_for_count(-1, "ddp", 2, "fp32", "adamw", ddp_buckets=True), "n_params"),
    (lambda: activation_bytes(PRESETS["llama-3-8b"], 0, 1), "seq_len"),
    (lambda: activation_bytes(PRESETS["llama-3-8b"], 128, 0), "micro_batch"),
    (lambda: unsharded_param_bytes([(4, 4)], 2, "fp8"), "unknown precision"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gpu_totals_are_the_cited_constants_in_gib():
    """The GPU sizes the pages price against are read from guide.constants (MiB, nvidia-smi's
    total), not typed a second time; a constant given in another unit is refused by name."""
    assert set(GPU_TOTAL_MEMORY_GIB) == set(GPU_MEMORY_CONSTANTS)
    for gpu, key in GPU_MEMORY_CONSTANTS.items():
        assert GPU_TOTAL_MEMORY_GIB[gpu] == constants.value(key) / 1024
    wrong = constants.Constant("h100.memory_total", 80, "GB", "a datasheet")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(constants.CONSTANTS, "h100.memory_total", wrong)
        with pytest.raises(ValueError, match="h100.memory_total must be in MiB"):
            predicted._total_gib("h100.memory_total")


# -- the GPU totals, recomputed at test time (GPU_TOTAL_MEMORY_GIB is built at import) -------------


@pytest.mark.parametrize(("key", "gib"), [
    ("h100.memory_total", 79.6),  # nvidia-smi: 81,559 MiB on an H100 80GB HBM3
    ("h200.memory_total", 140.4),  # nvidia-smi: 143,771 MiB on an H200 141GB HBM3e
])
def test_total_gib_is_nvidia_smis_mib_over_1024(key, gib):
    """_total_gib runs at import time, so a test calls it again: MiB / 1,024 = GiB."""
    got = predicted._total_gib(key)
    assert round(got, 1) == gib
    assert got == constants.value(key) / 1024


def test_a_gpu_total_in_another_unit_names_the_unit_received():
    wrong = constants.Constant("h200.memory_total", 141, "GB", "a datasheet")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(constants.CONSTANTS, "h200.memory_total", wrong)
        with pytest.raises(ValueError, match=r"h200\.memory_total must be in MiB "
                                             r"\(nvidia-smi's unit\), not GB\.$"):
            predicted._total_gib("h200.memory_total")


# -- messages that name the fix ---------------------------------------------------------------------


@pytest.mark.parametrize(("call", "match"), [
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp16", "adamw", ddp_buckets=True),
     r"^unknown precision 'fp16'; choose one of fp32, bf16_mixed, bf16, zero_mixed\.$"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adam", ddp_buckets=True),
     r"^unknown optimizer 'adam'; choose one of " + ", ".join(OPTIMIZERS) + r"\.$"),
    (lambda: per_rank_state_bytes("4096", "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes must be a sequence of shapes such as \[\(4096, 4096\), \(4096,\)\], "
     r"got str\.$"),
    (lambda: per_rank_state_bytes(b"\x04", "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"got bytes\.$"),
    (lambda: per_rank_state_bytes({(4, 4)}, "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes must be a sequence of shapes .*got set\.$"),
    (lambda: per_rank_state_bytes([(4, 4), 7], "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes\[1\] = 7 is not a shape; pass a tuple of dimension sizes\.$"),
    (lambda: per_rank_state_bytes([], "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes is empty: pass one shape per parameter tensor\.$"),
    (lambda: per_rank_state_bytes([(4, True)], "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes\[0\] = \(4, True\): every dimension must be an integer >= 0\.$"),
    (lambda: per_rank_state_bytes([(4.0, 4)], "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^param_shapes\[0\] = \(4\.0, 4\): every dimension must be an integer >= 0\.$"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adamw", ddp_buckets=1),
     r"^ddp_buckets must be True \(DDP's default, gradient_as_bucket_view=False: its reducer "
     r"keeps a second copy of the gradients\) or False \(gradient_as_bucket_view=True\), got 1\.$"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 0, "fp32", "adamw", ddp_buckets=True),
     r"^world_size must be a positive integer \(the number of ranks\), got 0\.$"),
    (lambda: zero1_partition([(4, 4)], 0),
     r"^world_size must be a positive integer \(the number of ranks\), got 0\.$"),
    (lambda: unsharded_param_bytes([(4, 4)], 0, "fp32"),
     r"^world_size must be a positive integer \(the number of ranks\), got 0\.$"),
    (lambda: state_bytes_for_count(16, "ddp", 0, "fp32", "adamw", ddp_buckets=True),
     r"^world_size must be a positive integer \(the number of ranks\), got 0\.$"),
    (lambda: state_bytes_for_count(True, "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^n_params must be an integer >= 0, got True\.$"),
    (lambda: state_bytes_for_count(16.0, "ddp", 2, "fp32", "adamw", ddp_buckets=True),
     r"^n_params must be an integer >= 0, got 16\.0\.$"),
    (lambda: state_bytes_for_count(16, "ddp", 2, "fp32", "adamw", ddp_buckets="no"),
     r"^ddp_buckets must be True"),
], ids=["precision", "optimizer", "shapes_str", "shapes_bytes", "shapes_set", "shape_int", "empty",
        "dim_bool", "dim_float", "buckets_int", "world_by_rank", "world_zero1", "world_unsharded",
        "world_count", "n_params_bool", "n_params_float", "count_buckets_str"])
def test_each_mistake_names_the_argument_and_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_zero_parameters_and_zero_sized_dimensions_are_valid():
    """0 is a size (an empty tensor), not a mistake: nothing to hold."""
    assert state_bytes_for_count(0, "fsdp2", 4, "fp32", "adamw", ddp_buckets=True).total == 0
    sb = per_rank_state_bytes([(0, 4)], "ddp", 2, "fp32", "adamw", ddp_buckets=False)
    assert (sb.params, sb.grads, sb.optimizer) == (0, 0, 4)  # AdamW's step tensor only


# -- a 0-d parameter is one element ------------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(Strategy))
def test_a_scalar_parameter_counts_as_one_element(strategy):
    """A 0-d tensor (a learned temperature) holds one element, exactly as a (1,) tensor does."""
    for n in (1, 2, 3):
        scalar = state_bytes_by_rank([(), (6, 2)], strategy, n, "fp32", "adamw", ddp_buckets=True)
        one = state_bytes_by_rank([(1,), (6, 2)], strategy, n, "fp32", "adamw", ddp_buckets=True)
        assert scalar == one, n
        assert unsharded_param_bytes([()], n, "fp32") == unsharded_param_bytes([(1,)], n, "fp32")


def test_fsdp2_rows_are_dim0_and_a_row_is_the_other_dims():
    """(3, 2, 5) over 2 ranks: 3 rows of 10 elements, split 2 + 1 (not 30 elements 15 + 15)."""
    ranks = state_bytes_by_rank([(3, 2, 5)], "fsdp2", 2, "fp32", "sgd_momentum",
                                ddp_buckets=False)
    assert [r.params for r in ranks] == [2 * 10 * 4] * 2
    assert [r.optimizer for r in ranks] == [2 * 10 * 4, 1 * 10 * 4]
    assert unsharded_param_bytes([(3, 2, 5)], 2, "fp32") == 4 * 10 * 4
    # every parameter is gathered: the padded sizes add up
    assert unsharded_param_bytes([(3, 2, 5), (5,), ()], 2, "fp32") == (4 * 10 + 6 + 2) * 4
    # equal shapes are counted once per tensor, however many there are
    three = state_bytes_by_rank([(3, 2, 5)] * 3 + [(4,)], "fsdp2", 2, "fp32", "sgd_momentum",
                                ddp_buckets=False)
    assert [r.params for r in three] == [(3 * 2 * 10 + 2) * 4] * 2
    assert [r.optimizer for r in three] == [(3 * 2 * 10 + 2) * 4, (3 * 1 * 10 + 2) * 4]


# -- ZeRO-2 and the count-based model, component by component ---------------------------------------


def test_zero2_splits_grads_and_optimizer_state_evenly_and_replicates_params():
    """17 elements over 4 ranks, flat like torch.chunk: 5, 5, 5, 2; over 6: 3, 3, 3, 3, 3, 2."""
    shapes = [(10,), (7,)]
    ranks = state_bytes_by_rank(shapes, "zero2", 4, "fp32", "adamw", ddp_buckets=True)
    assert [r.params for r in ranks] == [17 * 4] * 4
    assert [r.grads for r in ranks] == [5 * 4, 5 * 4, 5 * 4, 2 * 4]
    assert [r.optimizer for r in ranks] == [5 * 8 + 2 * 4] * 3 + [2 * 8 + 2 * 4]
    assert [r.buckets for r in ranks] == [0] * 4  # no DDP underneath: no reducer
    # 9 elements over 4 ranks: 3, 3, 3, 0; a rank with no elements keeps no step tensors either
    empty = state_bytes_by_rank([(9,)], "zero2", 4, "fp32", "adamw", ddp_buckets=False)[3]
    assert (empty.grads, empty.optimizer) == (0, 0)


@pytest.mark.parametrize(("strategy", "params", "grads", "optimizer"), [
    ("ddp", 1001, 1001, 1001), ("zero1", 1001, 1001, 126), ("zero2", 1001, 126, 126),
    ("fsdp2", 126, 126, 126), ("fsdp2_no_reshard", 126, 126, 126),
])
def test_count_model_shards_what_the_zero_stage_shards(strategy, params, grads, optimizer):
    """ZeRO §5: stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 (FSDP2)
    also the parameters; a share is ceil(1001 / 8) = 126 elements. zero_mixed: 2 + 2 + 12 bytes."""
    sb = state_bytes_for_count(1001, strategy, 8, "zero_mixed", "adamw", ddp_buckets=False)
    assert (sb.params, sb.grads, sb.optimizer) == (params * 2, grads * 2, optimizer * 12)


# -- the smallest world that fits: its edge and its assumptions ------------------------------------


def _fsdp2_total(arch, n: int) -> int:
    """FSDP2's bytes per GPU at N without activations: model state and its transient buffers."""
    return per_gpu(arch, "fsdp2", n, "bf16_mixed", "adamw", activations=0,
                   ddp_buckets=True).total


def test_min_world_size_accepts_an_exact_fit():
    """Bytes equal to the capacity fit: 'fits' is <=."""
    arch = PRESETS["llama-3-8b"]
    cap = _fsdp2_total(arch, 4)
    assert min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", ddp_buckets=True,
                          seq_len=None) == 4
    assert min_world_size(arch, "fsdp2", cap - 1, "bf16_mixed", "adamw", ddp_buckets=True,
                          seq_len=None) == 8


def test_min_world_size_adds_one_micro_batch_without_checkpointing_by_default():
    """The defaults are one sequence and no checkpointing: an exact fit at N=4 with those
    activations; two sequences do not fit at 4, and full checkpointing needs less."""
    arch = PRESETS["llama-3-8b"]
    act = activation_bytes(arch, 2048, 1, checkpointing="none")
    cap = _fsdp2_total(arch, 4) + act
    kw = dict(ddp_buckets=True, seq_len=2048)
    assert min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", **kw) == 4
    assert min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", micro_batch=2, **kw) != 4
    full = activation_bytes(arch, 2048, 1, checkpointing="full")
    assert full < act
    tight = _fsdp2_total(arch, 4) + full
    assert min_world_size(arch, "fsdp2", tight, "bf16_mixed", "adamw", checkpointing="full",
                          **kw) == 4
    assert min_world_size(arch, "fsdp2", tight, "bf16_mixed", "adamw", **kw) != 4


def test_min_world_size_tries_only_the_given_worlds_in_order():
    arch = PRESETS["llama-3-8b"]
    cap = _fsdp2_total(arch, 4)
    assert min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", ddp_buckets=True,
                          seq_len=None, world_sizes=(3, 5, 6)) == 5
    assert min_world_size(arch, "fsdp2", cap, "bf16_mixed", "adamw", ddp_buckets=True,
                          seq_len=None, world_sizes=(1, 2, 3)) is None
    # the default is WORLD_SIZES: powers of two up to 1,024
    assert predicted.WORLD_SIZES == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
