"""guide.memory.fit: the five layouts' per-GPU split is the predicted model's, HSDP's mesh is
checked, the smallest N is the first that fits, and the fast FSDP2 count equals the per-tensor
loop it replaced."""

from __future__ import annotations

import math
import random

import pytest

from guide.layout import chunk_sizes
from guide.memory import PRESETS, per_rank_state_bytes, unsharded_param_bytes
from guide.memory.fit import (
    FIT_STRATEGIES,
    FIT_WORLD_SIZES,
    GPU_BYTES,
    GpuSplit,
    capacity_bytes,
    fit_report,
    hsdp_shard_size,
    min_world_size,
    per_gpu,
    smallest_world_size,
)
from guide.memory.activations import activation_bytes
from guide.memory.predicted import PRECISIONS, state_bytes_by_rank
from guide.memory.state import StateBytes

ARCH = PRESETS["llama-3-8b"]
KW = dict(activations=123, ddp_buckets=True)


def test_no_reshard_is_fsdp2_plus_the_unsharded_parameters():
    for n in (1, 3, 8, 64):
        fsdp2 = per_gpu(ARCH, "fsdp2", n, "bf16_mixed", "adamw", **KW)
        zero2 = per_gpu(ARCH, "fsdp2_no_reshard", n, "bf16_mixed", "adamw", **KW)
        assert zero2.unsharded == unsharded_param_bytes(ARCH.param_shapes(), n, "bf16_mixed")
        # it keeps every block gathered, so of FSDP2's buffers only the gradient ones remain:
        # the two gathered blocks and the root's gathered copy are in `unsharded`
        root, block = (sum(math.prod(s) for s in u) for u in ARCH.fsdp2_units()[:2])
        assert fsdp2.buffers - zero2.buffers == (root + 2 * block) * 2
        assert zero2.total == fsdp2.total - fsdp2.buffers + zero2.buffers + zero2.unsharded
        assert fsdp2.unsharded == 0


def test_hsdp_holds_what_fsdp2_holds_on_its_shard_group():
    for n, g in ((4, 8), (8, 8), (64, 8), (48, 6)):
        split = per_gpu(ARCH, "hsdp", n, "bf16_mixed", "adamw", shard_group=g, **KW)
        sb = per_rank_state_bytes(ARCH.param_shapes(), "fsdp2", min(n, g), "bf16_mixed",
                                  "adamw", ddp_buckets=True)
        assert (split.params, split.grads, split.optimizer, split.buckets) == \
            (sb.params, sb.grads, sb.optimizer, 0)
        assert split.buffers == per_gpu(ARCH, "fsdp2", n, "bf16_mixed", "adamw", **KW).buffers
        assert split.shard_group == min(n, g)
        assert split.total == sb.total + 123 + split.buffers


def test_hsdp_refuses_a_mesh_that_does_not_exist():
    with pytest.raises(ValueError, match="HSDP needs N to be a multiple of the shard group size "
                                         "8, got N=12; use N=8 or 16"):
        hsdp_shard_size(12, 8)
    report = fit_report(ARCH, ["hsdp"], [12], "bf16", "adamw", capacity=10**12, **KW)
    assert report["rows"][0]["total"] is None and "multiple" in report["rows"][0]["error"]


def test_ddp_and_zero1_carry_the_buckets_and_the_sharded_ones_do_not():
    for key in FIT_STRATEGIES:
        split = per_gpu(ARCH, key, 8, "fp32", "adamw", **KW)
        assert (split.buckets > 0) == (key in ("ddp", "zero1"))


def test_smallest_world_size_is_the_first_that_fits():
    cap = GPU_BYTES["H100 (80 GB)"]
    act = 5 * 2**30
    for key in FIT_STRATEGIES:
        got = smallest_world_size(PRESETS["llama-3-70b"], key, cap, "bf16_mixed", "adamw",
                                  activations=act, ddp_buckets=True)
        fits = [n for n in FIT_WORLD_SIZES
                if per_gpu(PRESETS["llama-3-70b"], key, n, "bf16_mixed", "adamw",
                           activations=act, ddp_buckets=True).total <= cap]
        assert got == (fits[0] if fits else None), key
    assert smallest_world_size(PRESETS["llama-3-70b"], "fsdp2", cap, "bf16_mixed", "adamw",
                               activations=act, ddp_buckets=True) == 32


def test_capacity_from_a_preset_or_gib():
    assert capacity_bytes("H100 (80 GB)") == 81_559 * 2**20
    assert capacity_bytes(gib=80) == 80 * 2**30
    assert capacity_bytes(gib=0.1) == math.floor(0.1 * 2**30)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive number of GiB"):
            capacity_bytes(gib=bad)
    with pytest.raises(ValueError, match="unknown GPU 'A100'"):
        capacity_bytes("A100")


def _fsdp2_per_tensor(shapes, n, param, grad, per_elem, step) -> list[StateBytes]:
    """The FSDP2 branch as it was: every tensor, one by one."""
    padded, real = 0, [0] * n
    for shape in shapes:
        dim0, row = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        sizes = chunk_sizes(dim0, n)
        padded += sizes[0] * row
        for r, rows in enumerate(sizes):
            real[r] += rows * row
    return [StateBytes(padded * param, padded * grad, real[r] * per_elem + len(shapes) * step, 0)
            for r in range(n)]


def test_grouped_fsdp2_count_equals_the_per_tensor_loop():
    rng = random.Random(0)
    for _ in range(50):
        shapes = [tuple(rng.randint(0, 40) for _ in range(rng.randint(0, 3)))
                  for _ in range(rng.randint(1, 12))]
        shapes *= rng.randint(1, 3)
        n = rng.randint(1, 50)
        got = state_bytes_by_rank(shapes, "fsdp2", n, "fp32", "adamw", ddp_buckets=True)
        assert got == _fsdp2_per_tensor(shapes, n, 4, 4, 8, 4), (shapes, n)


def _refusal(call, *args, **kwargs) -> str:
    """The whole message of the ValueError ``call`` raises."""
    with pytest.raises(ValueError) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_an_unknown_strategy_is_refused_naming_every_choice():
    assert _refusal(per_gpu, ARCH, "zero3", 8, "bf16_mixed", "adamw", **KW) == (
        "unknown strategy 'zero3'; choose one of ddp, zero1, fsdp2_no_reshard, fsdp2, hsdp, "
        "zero2.")


def test_capacity_refusals_say_what_to_give():
    once = "give the GPU's memory once: a GPU preset or its size in GiB."
    assert _refusal(capacity_bytes) == once
    assert _refusal(capacity_bytes, "H100 (80 GB)", 80) == once
    assert _refusal(capacity_bytes, "A100") == (
        "unknown GPU 'A100'; choose one of H100 (80 GB), H200 (141 GB), "
        "or give its memory in GiB.")
    # a bool is not a size, though it is an int
    assert _refusal(capacity_bytes, gib=True) == (
        "GPU memory must be a positive number of GiB, got True.")


def test_world_size_and_shard_group_refusals_name_the_argument_and_what_it_counts():
    world = "world_size must be a positive integer (the number of GPUs), got 0."
    group = "shard_group must be a positive integer (GPUs per HSDP shard group), got 0."
    assert _refusal(per_gpu, ARCH, "ddp", 0, "bf16_mixed", "adamw", **KW) == world
    assert _refusal(hsdp_shard_size, 0, 8) == world
    assert _refusal(hsdp_shard_size, 8, 0) == group
    # ddp never reads the shard group: only the function's own guard can refuse it
    assert _refusal(fit_report, ARCH, ["ddp"], [1], "bf16_mixed", "adamw", shard_group=0,
                    **KW) == group
    assert _refusal(smallest_world_size, ARCH, "ddp", 10**12, "bf16_mixed", "adamw",
                    shard_group=0, **KW) == group


def test_activations_must_be_a_whole_number_of_bytes():
    for bad in (-1, True, 1.5):
        assert _refusal(per_gpu, ARCH, "fsdp2", 8, "bf16_mixed", "adamw", activations=bad,
                        ddp_buckets=True) == (
            f"activations must be a number of bytes >= 0, got {bad!r}.")


def test_a_parameter_count_is_priced_by_zeros_ideal_formulas_field_by_field():
    """10**9 parameters, bf16 mixed (fp32 master, grads; 2-byte compute), AdamW (8 bytes per
    parameter), 8 GPUs: ZeRO-1 shards the optimizer state over all 8 and nothing else;
    no-reshard FSDP2 keeps every parameter gathered in bf16; no autocast or buffers counted."""
    kw = dict(activations=7, ddp_buckets=True)
    assert per_gpu(10**9, "zero1", 8, "bf16_mixed", "adamw", **kw) == GpuSplit(
        "zero1", 8, 1, 4 * 10**9, 0, 4 * 10**9, 10**9, 4 * 10**9, 7, 0, 0)
    assert per_gpu(10**9, "ddp", 8, "bf16_mixed", "adamw", **kw) == GpuSplit(
        "ddp", 8, 1, 4 * 10**9, 0, 4 * 10**9, 8 * 10**9, 4 * 10**9, 7, 0, 0)
    assert per_gpu(10**9, "fsdp2_no_reshard", 8, "bf16_mixed", "adamw", **kw) == GpuSplit(
        "fsdp2_no_reshard", 8, 8, 10**9 // 2, 2 * 10**9, 10**9 // 2, 10**9, 0, 7, 0, 0)
    assert per_gpu(10**9, "fsdp2", 8, "bf16_mixed", "adamw", **kw) == GpuSplit(
        "fsdp2", 8, 8, 10**9 // 2, 0, 10**9 // 2, 10**9, 0, 7, 0, 0)


def test_zero1_shards_the_optimizer_state_over_every_gpu_of_an_architecture():
    split = per_gpu(ARCH, "zero1", 8, "bf16_mixed", "adamw", **KW)
    sb = per_rank_state_bytes(ARCH.param_shapes(), "zero1", 8, "bf16_mixed", "adamw",
                              ddp_buckets=True)
    assert (split.shard_group, split.params, split.grads, split.optimizer, split.buckets) == \
        (1, sb.params, sb.grads, sb.optimizer, sb.buckets)
    assert split.optimizer < per_gpu(ARCH, "ddp", 8, "bf16_mixed", "adamw", **KW).optimizer


def test_fit_report_rows_and_keys_exactly_with_and_without_a_capacity():
    cap = GPU_BYTES["H100 (80 GB)"]
    bad = ("HSDP needs N to be a multiple of the shard group size 4, got N=6; "
           "use N=4 or 8, or another shard group size.")
    empty = dict.fromkeys(("params", "unsharded", "grads", "optimizer", "buckets",
                           "activations", "autocast", "buffers", "total"))
    for capacity in (None, cap):
        report = fit_report(ARCH, ["hsdp"], [6, 8], "bf16_mixed", "adamw", shard_group=4,
                            capacity=capacity, **KW)
        verdict = {} if capacity is None else {"fits": None, "headroom": None}
        # the refused N is a row of its own, and the next N is still priced
        assert report["rows"][0] == {"strategy": "hsdp", "label": "HSDP", "N": 6, "error": bad,
                                     "shard_group": None, **empty, **verdict}
        split = per_gpu(ARCH, "hsdp", 8, "bf16_mixed", "adamw", shard_group=4, **KW)
        assert split.shard_group == 4
        priced = report["rows"][1]
        assert priced["shard_group"] == 4 and priced["total"] == split.total
        assert len(report["rows"]) == 2
    assert set(fit_report(ARCH, ["ddp"], [8], "bf16_mixed", "adamw", **KW)) == \
        {"shard_group", "rows"}
    assert report == {"shard_group": 4, "rows": report["rows"], "capacity": cap,
                      "world_sizes_searched": list(FIT_WORLD_SIZES),
                      "smallest_world_size": {"hsdp": smallest_world_size(
                          ARCH, "hsdp", cap, "bf16_mixed", "adamw", shard_group=4, **KW)}}


def test_the_smallest_n_uses_the_reports_shard_group():
    """A capacity HSDP meets with groups of 4 GPUs but never with groups of 2."""
    cap = per_gpu(ARCH, "hsdp", 4, "bf16_mixed", "adamw", shard_group=4, **KW).total
    report = fit_report(ARCH, ["hsdp"], [2], "bf16_mixed", "adamw", shard_group=2,
                        capacity=cap, **KW)
    assert report["smallest_world_size"] == {"hsdp": None}
    assert smallest_world_size(ARCH, "hsdp", cap, "bf16_mixed", "adamw", shard_group=2,
                               **KW) is None
    assert smallest_world_size(ARCH, "hsdp", cap, "bf16_mixed", "adamw", shard_group=4,
                               **KW) == 4


def test_the_smallest_n_skips_hsdp_meshes_that_do_not_exist_and_only_those():
    tiny, huge = 1, 10**15
    # groups of 6: no power of two above 6 is a multiple, so none is priced (pricing one raises)
    assert smallest_world_size(ARCH, "hsdp", tiny, "bf16_mixed", "adamw", shard_group=6,
                               **KW) is None
    assert smallest_world_size(ARCH, "hsdp", huge, "bf16_mixed", "adamw", shard_group=6,
                               **KW) == 1
    # the shard group is HSDP's alone: DDP and FSDP2 search every N whatever it is
    for key in ("ddp", "fsdp2"):
        want = smallest_world_size(ARCH, key, huge, "bf16_mixed", "adamw", **KW)
        assert want == 1
        assert smallest_world_size(ARCH, key, huge, "bf16_mixed", "adamw", shard_group=6,
                                   **KW) == want
    cap = per_gpu(ARCH, "fsdp2", 16, "bf16_mixed", "adamw", **KW).total
    assert smallest_world_size(ARCH, "fsdp2", cap, "bf16_mixed", "adamw", shard_group=6,
                               **KW) == 16


def _first_fit(key, cap, precision, act) -> int | None:
    return next((n for n in FIT_WORLD_SIZES
                 if per_gpu(ARCH, key, n, precision, "adamw", activations=act,
                            ddp_buckets=True).total <= cap), None)


def test_min_world_size_prices_activations_in_the_norm_and_dtype_it_is_given():
    """A capacity chosen so that the default norm, or bf16's 2 bytes, would fit sooner."""
    for norm, precision in (("composite", "bf16_mixed"), ("fused", "fp32")):
        act = activation_bytes(ARCH, 8192, 1, norm=norm,
                               bytes_per_element=PRECISIONS[precision].compute)
        lighter = activation_bytes(ARCH, 8192, 1)  # fused, 2 bytes
        assert act > lighter
        cap = per_gpu(ARCH, "fsdp2", 4, precision, "adamw", activations=lighter,
                      ddp_buckets=True).total
        want = _first_fit("fsdp2", cap, precision, act)
        assert want != _first_fit("fsdp2", cap, precision, lighter)
        assert min_world_size(ARCH, "fsdp2", cap, precision, "adamw", ddp_buckets=True,
                              seq_len=8192, norm=norm, world_sizes=FIT_WORLD_SIZES) == want
