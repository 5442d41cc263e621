"""The gradient accumulation page (``examples/plot_gradient_accumulation.py``): its accumulation
without re-gathering and its HSDP all-reduce deferral must fail the page when the switch it teaches
is set wrong.

Each fault is injected into the page's tagged fault points (``tests/faults.py``) and the page run
as a script; it must stop at the named check (before the end of the page).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES
from faults import assert_fails_by_name

PAGE = EXAMPLES / "plot_gradient_accumulation.py"

#: Faults injected into the page's tagged fault points: (tag, replacement).
FAULTS = {
    # the gathered parameters kept after the last micro-batch: the next forward would use the
    # values from before opt.step(), and fewer all-gathers are counted than the shapes say
    "reshard_never": [("reshard-on-last", "model.set_reshard_after_backward(False)")],
    # the gradient sync left on in the re-gathering loop: reduce-scatters are K x the model's
    "sync_every_micro_batch": [("sync-on-last", "model.set_requires_gradient_sync(True)")],
    # HSDP's all-reduce not deferred: all-reduces per optimizer step are K x the model's
    "all_reduce_every_micro_batch": [("all-reduce-on-last",
                                      "model.set_requires_all_reduce(True)")],
}
#: fault -> the check that must stop the page
EXPECTED = {
    "reshard_never": r"\[(accumulation without re-gathering|loss equivalence|parameter "
                     r"equivalence)\]",
    "sync_every_micro_batch": r"\[accumulation without re-gathering\]",
    "all_reduce_every_micro_batch": r"\[HSDP accumulation\]",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_fault_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED[fault], tmp_path, timeout=900)
