"""The mixed-precision pitfalls page (``examples/plot_mixed_precision_pitfalls.py``).

The page asserts three things torch does that users get wrong: the shards and AdamW's state keep
the dtype the model was built in, ``cast_forward_inputs`` decides what a block's ``forward``
receives, and ``output_dtype`` what the model returns. The tests read the page's results after one
in-process run, and inject each mistake the page guards against into its source: the page must
then fail by the check's name instead of passing.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import warnings
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES, run_python

PAGE = EXAMPLES / "plot_mixed_precision_pitfalls.py"

#: fault -> ((anchor, replacement), the check that must fail)
FAULTS = {
    # the model "built in bf16" is built in fp32: the page's claim about bf16 shards must fail
    "built_dtype_ignored": (("        return RopeLM(VOCAB).to(dtype)\n",
                             "        return RopeLM(VOCAB)\n"),
                            r"\[dtype\] FSDP2 x2, built in bf16, rank 0: sharded parameters"),
    # the blocks' cast_forward_inputs is not passed on: the fp32 table arrives in bf16
    "cast_forward_inputs_ignored": (("            **dtypes, cast_forward_inputs=cast_forward_inputs))",
                                     "            **dtypes, cast_forward_inputs=True))"),
                                    r"\[cast_forward_inputs\] .*cast_forward_inputs=False"),
    # the root's output_dtype is dropped: the logits stay bf16
    "output_dtype_dropped": (("MixedPrecisionPolicy(**dtypes, output_dtype=output_dtype))",
                              "MixedPrecisionPolicy(**dtypes))"),
                             r"\[output_dtype\] .*logits in torch.bfloat16, expected "
                             r"torch.float32"),
    # the single-process reference always fp32: the state comparison must notice
    "reference_always_fp32": (("    model = build(dtype)\n    opt = torch.optim.AdamW",
                               "    model = build(torch.float32)\n    opt = torch.optim.AdamW"),
                              r"\[optimizer state\] FSDP2 x2, built in bf16"),
}


def inject(source: str, fault: str) -> str:
    (anchor, replacement), _ = FAULTS[fault]
    assert source.count(anchor) == 1, f"fault {fault!r}: anchor found {source.count(anchor)} times"
    return source.replace(anchor, replacement)


@pytest.fixture(scope="module")
def page() -> dict:
    """The page's globals after one run in this process (its output under ``"OUTPUT"``)."""
    import matplotlib.pyplot as plt

    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = runpy.run_path(str(PAGE), run_name="__main__")
    plt.close("all")
    return {**namespace, "OUTPUT": out.getvalue()}


def test_the_page_passes(page: dict) -> None:
    assert page["OUTPUT"].rstrip().endswith("All checks passed.")


def test_the_built_dtype_decides_shards_grads_and_adamw_state(page: dict) -> None:
    for key, want in (("fp32_built", torch.float32), ("bf16_built", torch.bfloat16)):
        for res in page["results"][key]:
            assert set(res["shards"].values()) == {want}
            assert set(res["grads"].values()) == {want}
            assert set(res["state"].values()) == {want}
            assert res["wire"]["reduce_scatter"] == ["float32"]


def test_bf16_storage_loses_most_of_a_small_step(page: dict) -> None:
    shares = page["shares"]
    assert shares["bf16_built"] < 0.2 < 0.9 < shares["fp32_built"]


def test_cast_forward_inputs_decides_the_rope_tables_dtype(page: dict) -> None:
    default, off = page["results"]["fp32_built"][0], page["results"]["options"][0]
    assert default["rope"].dtype == torch.bfloat16 and off["rope"].dtype == torch.float32
    assert torch.equal(off["rope"], page["TABLE"])
    err = (default["rope"].float() - page["TABLE"]).abs().max().item()
    assert 0 < err <= 2**-8


def test_output_dtype_decides_the_logits_dtype(page: dict) -> None:
    assert page["results"]["fp32_built"][0]["logits"] == torch.bfloat16
    assert page["results"]["options"][0]["logits"] == torch.float32


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_mistake_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    import re

    script = tmp_path / PAGE.name
    script.write_text(inject(PAGE.read_text(), fault))
    run = run_python(script, timeout=240)
    assert run.returncode != 0, f"{fault}: the page passed with the fault\n{run.output[-3000:]}"
    assert re.search(FAULTS[fault][1], run.output), f"{fault}: not found:\n{run.output[-3000:]}"
