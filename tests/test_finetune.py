"""The fine-tuning page's memory function against hand counts, and the page's checks proven to bite.

* :func:`guide.memory.finetune.finetune_state_bytes` against numbers worked out by hand (FSDP2's
  padded rows, the optimizer state on real rows, AdamW's step counters, a bf16 frozen base).
* Faults injected into ``examples/plot_finetune_lora.py``, each the shape of a real bug, must fail
  it with the check that names the cause: a frozen parameter left trainable in the sharded run, the
  non-persistent buffer not re-initialised after ``to_empty``, the base not frozen at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES
from faults import assert_fails_by_name, mistagged

from guide.memory import Architecture, StateBytes
from guide.memory.finetune import finetune_state_bytes, lora_shapes, lora_state_bytes

PAGE = EXAMPLES / "plot_finetune_lora.py"


def test_lora_shapes_are_a_then_b_per_linear() -> None:
    assert lora_shapes([(768, 256), (256, 1024)], 8) == [(8, 256), (768, 8), (8, 1024),
                                                         (256, 8)]


@pytest.mark.parametrize("bad", [[(4,)], [(4, 4, 4)]])
def test_lora_shapes_refuses_what_is_not_a_linear_weight(bad) -> None:
    with pytest.raises(ValueError, match="a linear weight is"):
        lora_shapes(bad, 8)


def test_lora_shapes_refuses_rank_zero() -> None:
    with pytest.raises(ValueError, match="rank"):
        lora_shapes([(4, 4)], 0)


def test_finetune_bytes_by_hand_bf16_base_fp32_adapters_two_ranks() -> None:
    # frozen (4, 4) in bf16: 2 rows x 4 x 2 B = 16 B per rank, no grad, no state.
    # adapters (2, 4) and (4, 2): 1 row x 4 + 2 rows x 2 = 8 elements per rank:
    # params 8 x 4 = 32, grads 32, AdamW 2 moments x 32 = 64, plus 2 step counters x 4 B = 8.
    want = StateBytes(params=16 + 32, grads=32, optimizer=64 + 8, buckets=0)
    got = finetune_state_bytes([(4, 4)], [(2, 4), (4, 2)], 2, frozen_precision="bf16",
                               trainable_precision="fp32", optimizer="adamw")
    assert got == [want, want]


def test_finetune_bytes_pad_params_and_grads_but_not_the_optimizer_state() -> None:
    # 3 ranks, adapter (5, 2): chunks of ceil(5/3) = 2 rows -> 2, 2, 1 real rows; every rank
    # allocates 2 padded rows (4 elements) of parameter and gradient; the moments follow the real
    # rows. Frozen (3, 1) fp32: 1 row each = 4 B.
    got = finetune_state_bytes([(3, 1)], [(5, 2)], 3, frozen_precision="fp32",
                               trainable_precision="fp32", optimizer="adamw")
    assert [s.params for s in got] == [4 + 16] * 3
    assert [s.grads for s in got] == [16] * 3
    assert [s.optimizer for s in got] == [2 * 4 * 4 + 4, 2 * 4 * 4 + 4, 2 * 2 * 4 + 4]


def test_finetune_bytes_without_a_frozen_part_is_plain_fsdp2() -> None:
    got = finetune_state_bytes([], [(8, 8)], 4, frozen_precision="fp32",
                               trainable_precision="fp32", optimizer="sgd")
    assert got == [StateBytes(64, 64, 0, 0)] * 4


def test_finetune_bytes_refuses_nothing_to_train() -> None:
    with pytest.raises(ValueError, match="trainable_shapes is empty"):
        finetune_state_bytes([(4, 4)], [], 2, frozen_precision="fp32",
                             trainable_precision="fp32", optimizer="adamw")


def _refusal(call, *args, **kwargs) -> str:
    """The whole message of the ValueError ``call`` raises."""
    with pytest.raises(ValueError) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_refusals_name_the_argument_and_what_it_counts() -> None:
    kw = dict(frozen_precision="fp32", trainable_precision="fp32", optimizer="adamw")
    assert _refusal(finetune_state_bytes, [(4, 4)], [(2, 4)], 0, **kw) == (
        "world_size must be a positive integer (the number of ranks), got 0.")
    assert _refusal(finetune_state_bytes, [(4, 4)], [], 2, **kw) == (
        "trainable_shapes is empty: fine-tuning trains something (the adapters).")
    assert _refusal(lora_shapes, [(4, 4)], 0) == (
        "rank must be a positive integer (the LoRA rank), got 0.")
    arch = Architecture(vocab=8, hidden=4, layers=1, heads=1, mlp=4, gated_mlp=False)
    assert _refusal(lora_state_bytes, arch, 0, 1, base_precision="fp32",
                    adapter_precision="fp32", optimizer="sgd") == (
        "lora_rank must be a positive integer (the adapters' rank), got 0.")


#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement), and
#: the message each must fail the page with.
FAULTS = {
    # A LayerNorm of the base left trainable in the sharded run only: its gradient is reduce-
    # scattered too.
    "frozen_param_trains": ([("sharded-shard",
                              "{statement}\nmodel.blocks[0].ln1.weight.requires_grad_(True)")],
                            r"\[reduce-scatter volume\] FSDP2 x2, LoRA: 196,864 elements per step, "
                            r"the trainable ones padded are 196,608"),
    # to_empty leaves the non-persistent buffer as whatever memory held.
    "buffer_not_reinitialised": ([("init-buffers", "")],
                                 r"\[pretrained load\] rank \d: the non-persistent buffer is not "
                                 r"the sinusoids"),
    # adapters on square weights only (issue 38's audit): GQA's k/v and the MLP go without.
    "square_only": ([("adapter", "if len(set(child.weight.shape)) == 1:\n    {statement}")],
                    r"\[adapters only\] add_lora: .*is the base frozen\?"),
    # add_lora forgets to freeze the base: everything trains, reference included.
    "base_not_frozen": ([("freeze-base", "")],
                        r"\[adapters only\] add_lora: .*is the base frozen\?"),
}


def test_every_fault_point_is_tagged_once() -> None:
    assert mistagged(PAGE, (edits for edits, _ in FAULTS.values())) == {}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_fails_the_page(fault: str, tmp_path: Path) -> None:
    edits, pattern = FAULTS[fault]
    assert_fails_by_name(PAGE, fault, edits, pattern, tmp_path, timeout=280)
