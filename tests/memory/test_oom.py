"""guide.memory.oom: the out-of-memory ladder, priced with the site's memory model.

Each test names the guard it exercises; removing that guard (or breaking the count) fails it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from guide.memory import PRESETS, Architecture, GiB, per_rank_state_bytes, unsharded_param_bytes
from guide.memory.activations import activation_bytes
from guide.memory.fit import per_gpu
from guide.memory.oom import (BASELINE, STEPS, Setup, Step, ladder, offloaded_bytes,
                              predicted_bytes)
from guide.memory.transient import fsdp2_buffer_bytes, fsdp2_split_root_buffer_bytes

LLAMA = PRESETS["llama-3-8b"]
RUN = dict(seq_len=8192, micro_batch=1, optimizer="adamw")
#: A small untied model whose unit sizes are easy to count by hand.
TINY = Architecture(vocab=64, hidden=8, layers=4, heads=2, mlp=16)


def _block(arch: Architecture) -> int:
    return sum(math.prod(s) for s in arch.fsdp2_units()[1])


def test_steps_are_in_the_documented_order_and_label_what_is_not_predicted():
    assert [s.key for s in STEPS] == ["mixed_precision", "reshard", "units", "allocator", "nccl",
                                      "selective_ac", "full_ac", "offload"]
    assert {s.key for s in STEPS if s.change is None} == {"allocator", "nccl"}
    assert all(s.gpu_only for s in STEPS if s.change is None)


def test_ladder_rungs_are_cumulative_and_saved_is_the_difference():
    rungs = ladder(LLAMA, 8, **RUN)
    assert rungs[0].step is None and rungs[0].setup == BASELINE and rungs[0].saved is None
    before = rungs[0].bytes["total"]
    for r in rungs[1:]:
        if r.step.change is None:  # not predicted: nothing counted, nothing changed
            assert r.bytes is None and r.saved is None
            continue
        assert r.saved == before - r.bytes["total"] >= 0
        assert all(getattr(r.setup, k) == v for k, v in r.step.change.items())
        before = r.bytes["total"]
    assert rungs[-1].setup == Setup("bf16_mixed", True, "full", True, True)


def test_reshard_saves_every_block_but_two_by_formula():
    """The independent value the page checks: (layers - 2) blocks' bf16 parameters, from the
    config (no padding at N = 8 for llama-3-8b)."""
    r = {x.step.key: x for x in ladder(LLAMA, 8, **RUN) if x.step}["reshard"]
    h, kv, m = LLAMA.hidden, LLAMA.kv_heads * LLAMA.hidden // LLAMA.heads, LLAMA.mlp
    assert r.saved == (LLAMA.layers - 2) * (2 * h + 2 * h * h + 2 * h * kv + 3 * h * m) * 2


def test_predicted_bytes_is_the_calculators_per_gpu_plus_nothing():
    """Without the ladder's own pieces (split root, offload) a setup is per_gpu's total exactly."""
    from guide.memory import activation_bytes
    for setup, key in ((BASELINE, "fsdp2_no_reshard"), (Setup("bf16_mixed", True), "fsdp2")):
        act = activation_bytes(LLAMA, 8192, 1, bytes_per_element=2 if setup.precision != "fp32"
                               else 4)
        want = per_gpu(LLAMA, key, 8, setup.precision, "adamw", activations=act,
                       ddp_buckets=False).total
        assert predicted_bytes(LLAMA, setup, 8, **RUN)["total"] == want


def test_split_root_buffers_by_hand():
    """blocks' backward: 2 blocks gathered + one block's grads and reduce-scatter input; head's
    backward: norm and head gathered, their grads and reduce-scatter input, one block prefetched."""
    wide_vocab = dataclasses.replace(TINY, vocab=1024)  # its head's backward is the larger moment
    for arch in (TINY, wide_vocab):
        block, head, norm = _block(arch), arch.vocab * 8, 8
        for precision, (c, g) in (("fp32", (4, 4)), ("bf16_mixed", (2, 4))):
            blocks_phase = 2 * block * c + block * (c + g)
            head_phase = (head + norm) * (2 * c + g) + block * c
            assert (head_phase > blocks_phase) == (arch is wide_vocab)
            assert fsdp2_split_root_buffer_bytes(arch, precision) == max(blocks_phase, head_phase)
    # llama-3-8b: the head's backward is the larger moment, and it is below the root's buffers
    assert (fsdp2_split_root_buffer_bytes(LLAMA, "bf16_mixed")
            < fsdp2_buffer_bytes(LLAMA, "fsdp2", "bf16_mixed"))


def test_split_root_refuses_tied_embeddings():
    with pytest.raises(ValueError, match="tied embeddings"):
        fsdp2_split_root_buffer_bytes(PRESETS["llama-3.2-1b"], "bf16_mixed")


def test_split_root_needs_reshard_first():
    with pytest.raises(ValueError, match="reshard_after_forward=True"):
        predicted_bytes(LLAMA, Setup("bf16_mixed", reshard=False, split_root=True), 8, **RUN)


def test_unknown_precision_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        predicted_bytes(LLAMA, Setup("fp8"), 8, **RUN)


def test_offload_moves_the_whole_model_state_off_the_gpu():
    on = Setup("bf16_mixed", True, "full", True, False)
    off = dataclasses.replace(on, offload=True)
    a, b = (predicted_bytes(LLAMA, s, 8, **RUN) for s in (on, off))
    assert b["state"] == 0 and a["state"] == offloaded_bytes(LLAMA, 8, "bf16_mixed", "adamw")
    assert a["total"] - b["total"] == a["state"]
    # 16 bytes per parameter over N, plus AdamW's fp32 step count per tensor
    assert a["state"] == 16 * LLAMA.n_params // 8 + 4 * len(LLAMA.param_shapes())


def test_no_reshard_gathers_every_parameter_in_the_compute_dtype():
    parts = predicted_bytes(LLAMA, Setup("bf16_mixed"), 8, **RUN)
    assert parts["gathered"] == unsharded_param_bytes(LLAMA.param_shapes(), 8, "bf16_mixed")
    assert parts["gathered"] == LLAMA.n_params * 2


def test_a_step_that_adds_bytes_is_refused():
    """The ladder's order guard: going back to fp32 after bf16 adds bytes and must fail."""
    back = Step("back", "fp32 again", "", {"precision": "fp32"}, "", "")
    with pytest.raises(ValueError, match="step 'back' adds"):
        ladder(LLAMA, 8, **RUN, steps=(STEPS[0], back))


def test_llama_3_8b_fits_an_h100_from_the_reshard_step():
    """What the page's verdict says: the first two steps bring it under an H100's memory."""
    from guide.memory.fit import GPU_BYTES
    cap = GPU_BYTES["H100 (80 GB)"]
    rungs = [r for r in ladder(LLAMA, 8, **RUN) if r.bytes]
    assert rungs[0].bytes["total"] > cap and rungs[1].bytes["total"] > cap
    assert rungs[2].step.key == "reshard" and rungs[2].bytes["total"] <= cap
    assert rungs[0].bytes["total"] / GiB > rungs[-1].bytes["total"] / GiB


def test_world_size_is_refused_by_the_calculators_guard():
    """predicted_bytes has no world-size rule of its own: per_gpu's applies."""
    with pytest.raises(ValueError, match="world_size"):
        predicted_bytes(LLAMA, BASELINE, 0, **RUN)


def test_offloaded_bytes_is_the_model_state_of_the_fsdp2_shards():
    for precision in ("fp32", "bf16_mixed"):
        sb = per_rank_state_bytes(LLAMA.param_shapes(), "fsdp2", 8, precision, "adamw",
                                  ddp_buckets=False)
        assert offloaded_bytes(LLAMA, 8, precision, "adamw") == sb.params + sb.grads + sb.optimizer


# The landing page and the site search lead to the OOM path: the landing page's bullet names
# "out of memory" and "OOM" and links the section's label, which the OOM page defines right above
# a heading that says "Out of memory (OOM)" (Sphinx's search indexes a heading's words as title
# terms; docs/_static/search_scorer.js puts the page whose file name holds the query first).
ROOT = Path(__file__).resolve().parents[2]
LABEL = "oom-path"


def oom_path_link_problems(index_md: str, page_py: str) -> list[str]:
    """What keeps a reader of the landing page, or of the search, from the OOM path."""
    problems = []
    bullets = [line for line in index_md.split("\n* ") if f"<{LABEL}>`" in line]
    if not bullets:
        problems.append(f"docs/index.md does not link the OOM path ({{ref}}`... <{LABEL}>`)")
    elif not re.search(r"out of memory", bullets[0], re.I) or "OOM" not in bullets[0]:
        problems.append("the landing page's OOM bullet does not say 'out of memory' and 'OOM'")
    heading = re.search(rf"^# \.\. _{LABEL}:\n#\n# (.+)\n# -+\n", page_py, re.M)
    if heading is None:
        problems.append(f"the OOM page defines no section labelled {LABEL}")
    elif not ("Out of memory" in heading[1] and "(OOM)" in heading[1]):
        problems.append(f"the OOM path's heading {heading[1]!r} does not say "
                        "'Out of memory (OOM)'")
    return problems


def test_landing_page_and_search_lead_to_the_oom_path():
    index_md = (ROOT / "docs" / "index.md").read_text()
    page_py = (ROOT / "examples" / "plot_oom_ddp_vs_fsdp2.py").read_text()
    assert oom_path_link_problems(index_md, page_py) == []
    # "OOM" ranks the page first through the scorer's file-name rule (tests/test_site.py's
    # SEARCH_FIRST checks the ranking in the browser on the built site)
    scorer = (ROOT / "docs" / "_static" / "search_scorer.js").read_text()
    assert 'file.includes(q.replace(/ /g, "_"))' in scorer


def test_oom_path_link_guard_catches_each_break():
    index_md = (ROOT / "docs" / "index.md").read_text()
    page_py = (ROOT / "examples" / "plot_oom_ddp_vs_fsdp2.py").read_text()
    unlinked = index_md.replace(f"<{LABEL}>`", "<somewhere>`")
    assert "does not link" in oom_path_link_problems(unlinked, page_py)[0]
    unnamed = index_md.replace("Out of memory (OOM) with FSDP2?", "Too big for FSDP2?")
    assert "does not say" in oom_path_link_problems(unnamed, page_py)[0]
    unlabelled = page_py.replace(f"# .. _{LABEL}:\n", "# .. _elsewhere:\n")
    assert "no section labelled" in oom_path_link_problems(index_md, unlabelled)[0]
    renamed = page_py.replace("# Out of memory (OOM) with FSDP2?", "# Too big for FSDP2?")
    assert "heading" in oom_path_link_problems(index_md, renamed)[0]


def _refusal(call, *args, **kwargs) -> str:
    """The whole message of the ValueError ``call`` raises."""
    with pytest.raises(ValueError) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_refusals_of_predicted_bytes_in_full():
    assert _refusal(predicted_bytes, LLAMA, Setup("fp8"), 8, **RUN) == (
        "unknown precision 'fp8'; choose one of fp32, bf16_mixed, bf16, zero_mixed.")
    assert _refusal(predicted_bytes, LLAMA, Setup("bf16_mixed", split_root=True), 8, **RUN) == (
        "split_root prices the root's units with reshard_after_forward=True; "
        "apply the reshard step first.")


def test_a_step_that_adds_bytes_is_refused_with_how_many():
    back = Step("back", "fp32 again", "", {"precision": "fp32"}, "", "")
    added = (predicted_bytes(LLAMA, BASELINE, 8, **RUN)["total"]
             - predicted_bytes(LLAMA, Setup("bf16_mixed"), 8, **RUN)["total"])
    assert added > 0
    assert _refusal(ladder, LLAMA, 8, **RUN, steps=(STEPS[0], back)) == (
        f"step 'back' adds {added:,} bytes per GPU: it does not belong on the way out of memory "
        "in this order.")


def test_a_step_that_saves_nothing_is_kept_with_saved_zero():
    again = Step("again", "bf16 again", "", {"precision": "bf16_mixed"}, "", "")
    rungs = ladder(LLAMA, 8, **RUN, steps=(STEPS[0], again))
    assert rungs[2].saved == 0 and rungs[2].bytes == rungs[1].bytes


def test_an_unpredicted_step_keeps_the_setup_before_it():
    rungs = ladder(LLAMA, 8, **RUN)
    for before, rung in zip(rungs, rungs[1:]):
        if rung.step.change is None:
            assert rung.setup == before.setup and rung.setup is not None


def test_predicted_bytes_prices_the_setups_checkpointing_and_the_given_norm():
    for checkpointing in ("none", "selective", "full"):
        for norm in ("fused", "composite"):
            setup = Setup("fp32", True, checkpointing)
            parts = predicted_bytes(LLAMA, setup, 8, **RUN, norm=norm)
            assert parts["activations"] == activation_bytes(
                LLAMA, 8192, 1, checkpointing=checkpointing, norm=norm, bytes_per_element=4)
    assert (activation_bytes(LLAMA, 8192, 1, checkpointing="full")
            < activation_bytes(LLAMA, 8192, 1) < activation_bytes(LLAMA, 8192, 1,
                                                                 norm="composite"))


def test_the_ladder_prices_every_rung_in_its_norm():
    for norm in ("fused", "composite"):
        for rung in ladder(LLAMA, 8, **RUN, norm=norm):
            if rung.bytes is not None:
                assert rung.bytes == predicted_bytes(LLAMA, rung.setup, 8, **RUN, norm=norm)


def test_predicted_bytes_parts_by_name_with_the_split_roots_buffers():
    setup = Setup("bf16_mixed", True, "none", True)
    split = per_gpu(LLAMA, "fsdp2", 8, "bf16_mixed", "adamw",
                    activations=activation_bytes(LLAMA, 8192, 1), ddp_buckets=False)
    buffers = fsdp2_split_root_buffer_bytes(LLAMA, "bf16_mixed")
    assert buffers != split.buffers
    parts = {"state": split.params + split.grads + split.optimizer, "gathered": 0,
             "buffers": buffers, "activations": split.activations}
    assert predicted_bytes(LLAMA, setup, 8, **RUN) == parts | {"total": sum(parts.values())}
