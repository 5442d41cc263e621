"""The memory pages' guards: a real bug injected into a shipped page must fail it by name."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import EXAMPLES, run_python

MODEL_STATE_PAGE = EXAMPLES / "plot_memory_model_state.py"


def _inject(page: Path, edits: list[tuple[str, str]], dest: Path) -> Path:
    source = page.read_text()
    for anchor, replacement in edits:
        assert source.count(anchor) == 1, f"anchor not found once in {page.name}: {anchor!r}"
        source = source.replace(anchor, replacement)
    out = dest / page.name
    out.write_text(source)
    return out


def test_model_state_page_fails_when_fsdp2_root_is_not_sharded(tmp_path):
    """``fully_shard`` on the blocks only (embeddings and head stay whole on every rank), run on
    N=2, fp32 AdamW only: the page must fail naming the check, the strategy, N, the rank and the
    part that differs from the prediction."""
    faulty = _inject(MODEL_STATE_PAGE, [
        ("else (1, 2, 4)\n", "else (2,)\n"),
        ('RUNS = (("fp32", "adamw"), ', 'RUNS = (("fp32", "adamw"),)  # '),
        # the root's call left out of the page's plain shard_fsdp2
        ("    fully_shard(model, mesh=mesh, **options)\n", ""),
    ], tmp_path)
    run = run_python(faulty, timeout=240)
    assert run.returncode != 0, run.output[-2000:]
    assert re.search(r"CheckFailed: \[model-state bytes\] FSDP2 at N=2, rank 0, fp32 adamw: params "
                     r"measured [\d,]+ B, predicted [\d,]+ B", run.output), run.output[-3000:]


OOM_PAGE = EXAMPLES / "plot_oom_ddp_vs_fsdp2.py"


def test_oom_page_fails_when_the_budget_does_not_separate_the_strategies(tmp_path):
    """A headroom above what DDP needs would let DDP train, and the page's claim would rest on
    nothing: the page must stop before the budgeted runs, naming the check."""
    faulty = _inject(OOM_PAGE, [("HEADROOM = 3.5  #", "HEADROOM = 8.0  #")], tmp_path)
    run = run_python(faulty, timeout=240)
    assert run.returncode != 0, run.output[-2000:]
    assert re.search(r"CheckFailed: \[DDP out of memory\] DDP x2: expected the headroom < DDP's "
                     r"unconstrained peak, got [\d.]+ vs [\d.]+", run.output), run.output[-3000:]


def test_oom_path_fails_when_the_embedding_and_head_are_not_their_own_units(tmp_path):
    """``shard_to_fit`` ignoring ``split_root`` (the root keeps its embedding and head gathered
    from forward to backward): the OOM path's CPU measurement must stop the page, naming the
    run and what differs from the shapes' prediction; it runs first, so this fails early."""
    faulty = _inject(OOM_PAGE, [("    if split_root:\n", "    if False:\n")], tmp_path)
    run = run_python(faulty, timeout=240)
    assert run.returncode != 0, run.output[-2000:]
    assert re.search(r"CheckFailed: \[OOM path, measured\] units: gathered after forward: bytes "
                     r"differs by", run.output), run.output[-3000:]


def test_oom_path_fails_when_mixed_precision_is_not_applied(tmp_path):
    """A ``MixedPrecisionPolicy`` left at fp32 where the step asks for bf16: the gathered bytes
    do not halve, and the page must say so before any budgeted run."""
    faulty = _inject(OOM_PAGE, [("MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                                 "reduce_dtype=torch.float32) if bf16\n",
                                 "MixedPrecisionPolicy() if bf16\n")], tmp_path)
    run = run_python(faulty, timeout=240)
    assert run.returncode != 0, run.output[-2000:]
    assert re.search(r"CheckFailed: \[OOM path, measured\] mixed_precision: gathered after "
                     r"forward", run.output), run.output[-3000:]
