"""The mixed-precision pitfalls page (``examples/plot_mixed_precision_pitfalls.py``).

The page asserts three things torch does that users get wrong: the shards and AdamW's state keep
the dtype the model was built in, ``cast_forward_inputs`` decides what a block's ``forward``
receives, and ``output_dtype`` what the model returns. The tests read the page's ``RESULT`` after
one in-process run, and inject each mistake the page guards against at its tagged fault points
(tests/faults.py): the page must then fail by the check's name instead of passing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES
from faults import assert_fails_by_name, mistagged

PAGE = EXAMPLES / "plot_mixed_precision_pitfalls.py"

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the model "built in bf16" is built in fp32: the page's claim about bf16 shards must fail
    "built_dtype_ignored": [("build", "return RopeLM(VOCAB)")],
    # the blocks' cast_forward_inputs is not passed on: the fp32 table arrives in bf16
    "cast_forward_inputs_ignored": [
        ("block-policy", "fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(\n"
                         "    **dtypes, cast_forward_inputs=True))")],
    # the root's output_dtype is dropped: the logits stay bf16
    "output_dtype_dropped": [
        ("root-policy", "return fully_shard(model, mesh=mesh,\n"
                        "                   mp_policy=MixedPrecisionPolicy(**dtypes))")],
    # the single-process reference always fp32: the state comparison must notice
    "reference_always_fp32": [("reference-build", "model = build(torch.float32)")],
}
#: fault -> the check that must fail, by name
EXPECTED = {
    "built_dtype_ignored": r"\[dtype\] FSDP2 x2, built in bf16, rank 0: sharded parameters",
    "cast_forward_inputs_ignored": r"\[cast_forward_inputs\] .*cast_forward_inputs=False",
    "output_dtype_dropped": r"\[output_dtype\] .*logits in torch.bfloat16, expected torch.float32",
    "reference_always_fp32": r"\[optimizer state\] FSDP2 x2, built in bf16",
}


def test_every_fault_point_is_tagged_once() -> None:
    assert mistagged(PAGE, FAULTS.values()) == {}


def test_the_page_passes(page: dict) -> None:
    assert page["OUTPUT"].rstrip().endswith("All checks passed.")


def test_the_built_dtype_decides_shards_grads_and_adamw_state(page: dict) -> None:
    for key, want in (("fp32_built", torch.float32), ("bf16_built", torch.bfloat16)):
        for res in page["RESULT"]["results"][key]:
            assert set(res["shards"].values()) == {want}
            assert set(res["grads"].values()) == {want}
            assert set(res["state"].values()) == {want}
            assert res["wire"]["reduce_scatter"] == ["float32"]


def test_bf16_storage_loses_most_of_a_small_step(page: dict) -> None:
    shares = page["RESULT"]["shares"]
    assert shares["bf16_built"] < 0.2 < 0.9 < shares["fp32_built"]


def test_cast_forward_inputs_decides_the_rope_tables_dtype(page: dict) -> None:
    results, table = page["RESULT"]["results"], page["RESULT"]["TABLE"]
    default, off = results["fp32_built"][0], results["options"][0]
    assert default["rope"].dtype == torch.bfloat16 and off["rope"].dtype == torch.float32
    assert torch.equal(off["rope"], table)
    err = (default["rope"].float() - table).abs().max().item()
    assert 0 < err <= 2**-8


def test_output_dtype_decides_the_logits_dtype(page: dict) -> None:
    assert page["RESULT"]["results"]["fp32_built"][0]["logits"] == torch.bfloat16
    assert page["RESULT"]["results"]["options"][0]["logits"] == torch.float32


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_mistake_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED[fault], tmp_path, timeout=240)
