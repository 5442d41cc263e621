"""The memory pages' guards: a real bug injected into a shipped page must fail it by name."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES
from faults import assert_fails_by_name, mistagged

MODEL_STATE_PAGE = EXAMPLES / "plot_memory_model_state.py"
OOM_PAGE = EXAMPLES / "plot_oom_ddp_vs_fsdp2.py"

#: Faults injected into each page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    MODEL_STATE_PAGE: {
        # fully_shard on the blocks only, run on N=2, fp32 AdamW only
        "root_not_sharded": [
            ("sizes", "WORLD_SIZES = (PAGE.world_size,) if guide.under_torchrun() else (2,)"),
            ("runs", 'RUNS = (("fp32", "adamw"),)'),
            # the root's call left out of the page's plain shard_fsdp2
            ("shard-root", "")],
    },
    OOM_PAGE: {
        # a headroom above what DDP needs
        "headroom_too_large": [("headroom", "HEADROOM = 8.0")],
        # shard_to_fit ignoring split_root: neither the embedding nor the head is its own unit
        "root_not_split": [("embedding-unit", "pass"), ("head-unit", "pass")],
        # the fp32 policy where the step asks for bf16
        "mixed_precision_not_applied": [("mp-policy", "mp = MixedPrecisionPolicy()")],
    },
}


@pytest.mark.parametrize("page", sorted(FAULTS), ids=lambda page: page.stem)
def test_every_fault_point_is_tagged_once(page):
    assert mistagged(page, FAULTS[page].values()) == {}


def test_model_state_page_fails_when_fsdp2_root_is_not_sharded(tmp_path):
    """``fully_shard`` on the blocks only (embeddings and head stay whole on every rank), run on
    N=2, fp32 AdamW only: the page must fail naming the check, the strategy, N, the rank and the
    part that differs from the prediction."""
    fault = "root_not_sharded"
    assert_fails_by_name(MODEL_STATE_PAGE, fault, FAULTS[MODEL_STATE_PAGE][fault],
                         r"CheckFailed: \[model-state bytes\] FSDP2 at N=2, rank 0, fp32 adamw: "
                         r"params measured [\d,]+ B, predicted [\d,]+ B", tmp_path, timeout=240)


def test_oom_page_fails_when_the_budget_does_not_separate_the_strategies(tmp_path):
    """A headroom above what DDP needs would let DDP train, and the page's claim would rest on
    nothing: the page must stop before the budgeted runs, naming the check."""
    fault = "headroom_too_large"
    assert_fails_by_name(OOM_PAGE, fault, FAULTS[OOM_PAGE][fault],
                         r"CheckFailed: \[DDP out of memory\] DDP x2: expected the headroom < "
                         r"DDP's unconstrained peak, got [\d.]+ vs [\d.]+", tmp_path, timeout=240)


def test_oom_path_fails_when_the_embedding_and_head_are_not_their_own_units(tmp_path):
    """``shard_to_fit`` ignoring ``split_root`` (the root keeps its embedding and head gathered
    from forward to backward): the OOM path's CPU measurement must stop the page, naming the
    run and what differs from the shapes' prediction; it runs first, so this fails early."""
    fault = "root_not_split"
    assert_fails_by_name(OOM_PAGE, fault, FAULTS[OOM_PAGE][fault],
                         r"CheckFailed: \[OOM path, measured\] units: gathered after forward: "
                         r"bytes differs by", tmp_path, timeout=240)


def test_oom_path_fails_when_mixed_precision_is_not_applied(tmp_path):
    """A ``MixedPrecisionPolicy`` left at fp32 where the step asks for bf16: the gathered bytes
    do not halve, and the page must say so before any budgeted run."""
    fault = "mixed_precision_not_applied"
    assert_fails_by_name(OOM_PAGE, fault, FAULTS[OOM_PAGE][fault],
                         r"CheckFailed: \[OOM path, measured\] mixed_precision: gathered after "
                         r"forward", tmp_path, timeout=240)
