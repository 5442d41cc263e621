"""guide.unshard_timeline: FSDP2's profiler events read in order, and units gathered at once."""

from __future__ import annotations

import pytest
import torch

from guide.unshard_timeline import ROOT, UnshardEvent, UnshardTimeline, max_gathered, order_text


def ev(text: str) -> list[UnshardEvent]:
    """``"AG root, AG b0, F b0"`` -> events (``AG`` gather, ``F`` forward, ``B`` backward)."""
    kinds = {"AG": "gather", "F": "forward", "B": "backward"}
    out = []
    for item in text.split(","):
        kind, unit = item.split()
        out.append(UnshardEvent(kinds[kind], ROOT if unit == "root" else f"blocks.{unit[1:]}"))
    return out


#: One step of two blocks, FSDP2's default order on CPU: one block at a time in forward, one
#: prefetched in backward (the root's backward starts b1's all-gather, b1's starts b0's).
DEFAULT = ev("AG root, AG b0, F b0, AG b1, F b1, F root, AG b1, AG b0, B b1, B b0, B root")
RESHARDS = {ROOT: False, "blocks.0": True, "blocks.1": True}


def test_default_order_holds_the_root_and_one_block_in_forward_and_two_in_backward() -> None:
    assert max_gathered(DEFAULT, RESHARDS, "forward") == 2
    assert max_gathered(DEFAULT, RESHARDS, "backward") == 3
    assert max_gathered(DEFAULT, RESHARDS) == 3


def test_a_forward_frees_only_a_unit_that_reshards_after_forward() -> None:
    kept = RESHARDS | {"blocks.1": False}  # b1 stays gathered from its forward to its backward
    step = ev("AG root, AG b0, F b0, AG b1, F b1, F root, AG b0, B b1, B b0, B root")
    assert max_gathered(step, kept, "forward") == 2
    assert max_gathered(step, kept, "backward") == 3
    # Read as if b1 resharded, the same events would show one unit fewer in backward.
    assert max_gathered(step, RESHARDS, "backward") == 2


def test_a_backward_frees_a_unit_that_also_resharded_after_forward() -> None:
    # b0 reshards after forward, is gathered again for backward and freed there: the root's
    # all-gather after it finds nothing else held. A replay that frees only at the forward
    # would count b0 still held (2).
    assert max_gathered(ev("AG b0, F b0, AG b0, B b0, AG root"), RESHARDS) == 1
    assert max_gathered(DEFAULT + DEFAULT, RESHARDS) == 3  # a second step starts from nothing


def test_sizes_weigh_the_units() -> None:
    sizes = {ROOT: 10, "blocks.0": 3, "blocks.1": 3}
    assert max_gathered(DEFAULT, RESHARDS, sizes=sizes) == 16
    with pytest.raises(ValueError, match="blocks.1"):
        max_gathered(DEFAULT, RESHARDS, sizes={ROOT: 10, "blocks.0": 3})


def test_an_unknown_unit_or_phase_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"\['blocks.1'\].*every unit, the root included"):
        max_gathered(DEFAULT, {ROOT: False, "blocks.0": True})
    with pytest.raises(ValueError, match="phase 'fwd'"):
        max_gathered(DEFAULT, RESHARDS, "fwd")
    with pytest.raises(ValueError, match="kind 'gathered'"):
        UnshardEvent("gathered", ROOT)


def test_order_text_names_events_in_order() -> None:
    assert order_text(DEFAULT[:3], {"blocks.0": "b0"}) == "AG root · AG b0 · F b0"


def test_the_timeline_reads_fsdp2_event_names_from_the_profiler_in_order() -> None:
    names = ["FSDP::all_gather", "FSDP::pre_forward (blocks.0)", "FSDP::all_gather (blocks.0)",
             "FSDP::all_gather_copy_out (blocks.0)", "FSDP::post_forward (blocks.0)",
             "FSDP::post_forward", "FSDP::post_backward_reshard (blocks.0)"]
    with UnshardTimeline() as timeline:
        for name in names:
            with torch.profiler.record_function(name):
                torch.ones(2).sum()
    assert timeline.events == [UnshardEvent("gather", ROOT), UnshardEvent("gather", "blocks.0"),
                               UnshardEvent("forward", "blocks.0"), UnshardEvent("forward", ROOT),
                               UnshardEvent("backward", "blocks.0")]
