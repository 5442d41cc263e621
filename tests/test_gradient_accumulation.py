"""The gradient accumulation page (``examples/plot_gradient_accumulation.py``): its accumulation
without re-gathering and its HSDP all-reduce deferral must fail the page when the switch it teaches
is set wrong.

Each fault is injected into the page's own code and the page run as a script; it must stop at
the named check (before the end of the page).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_python

PAGE = EXAMPLES / "plot_gradient_accumulation.py"

#: fault -> (anchor, replacement, the check that must stop the page)
FAULTS = {
    # the gathered parameters kept after the last micro-batch: the next forward would use the
    # values from before opt.step(), and fewer all-gathers are counted than the shapes say
    "reshard_never": ("        model.set_reshard_after_backward(last)",
                      "        model.set_reshard_after_backward(False)",
                      r"\[(accumulation without re-gathering|loss equivalence|parameter "
                      r"equivalence)\]"),
    # the gradient sync left on in the re-gathering loop: reduce-scatters are K x the model's
    "sync_every_micro_batch": ("        model.set_requires_gradient_sync(last)  # reduce-scatter",
                               "        model.set_requires_gradient_sync(True)  # reduce-scatter",
                               r"\[accumulation without re-gathering\]"),
    # HSDP's all-reduce not deferred: all-reduces per optimizer step are K x the model's
    "all_reduce_every_micro_batch": ("model.set_requires_all_reduce(last)",
                                     "model.set_requires_all_reduce(True)",
                                     r"\[HSDP accumulation\]"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_fault_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    anchor, replacement, pattern = FAULTS[fault]
    source = PAGE.read_text()
    assert source.count(anchor) == 1, f"fault {fault!r}: anchor found {source.count(anchor)} times"
    script = tmp_path / PAGE.name
    script.write_text(source.replace(anchor, replacement))
    run = run_python(script, timeout=900)
    assert run.returncode != 0, f"{fault}: the page passed with the fault\n{run.output[-3000:]}"
    assert re.search(pattern, run.output), f"{fault}: {pattern} not found\n{run.output[-3000:]}"
    assert "All checks passed." not in run.output
