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
    capacity_bytes,
    fit_report,
    hsdp_shard_size,
    per_gpu,
    smallest_world_size,
)
from guide.memory.predicted import state_bytes_by_rank
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
