"""The switch page (``examples/plot_ddp_to_fsdp2.py``): its scripts' mistakes fail it by name.

Each fault is a mistake a reader could make in the FSDP2 script (or the DDP one), injected at the
page's tagged fault points (tests/faults.py); the page must then stop with the check that names
it, not render.
"""

from __future__ import annotations


import pytest
from conftest import EXAMPLES, run_python
from faults import assert_fails_by_name, mistagged

PAGE = EXAMPLES / "plot_ddp_to_fsdp2.py"

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the optimizer built before fully_shard (before the mesh, and returned right after the root's
    # fully_shard): it holds the tensors FSDP2 replaced
    "optimizer_before_fully_shard": [
        ("fsdp2-mesh", "opt = torch.optim.AdamW(model.parameters(), lr=lr)\n{statement}"),
        ("fsdp2-root", "{statement}\nreturn model, opt")],
    # accumulation without set_requires_gradient_sync: a reduce-scatter per micro-batch (the
    # default, True, restored before each micro-batch)
    "sync_every_micro_batch": [
        ("fsdp2-micro-step", "model.set_requires_gradient_sync(True)\n{statement}")],
    # clipping by each rank's own shards' norm (recorded as a replicated DTensor, so that the
    # script's norm.full_tensor() hands back this rank's norm unchanged)
    "clip_by_local_norm": [
        ("clip", "norm = torch.stack([p.grad.to_local().norm()\n"
                 "                    for p in model.parameters()]).norm()\n"
                 "for p in model.parameters():\n"
                 "    p.grad.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))\n"
                 "from torch.distributed.tensor import DTensor, Replicate\n"
                 "norm = DTensor.from_local(norm, p.device_mesh, [Replicate()])")],
    # the DDP load forgets the optimizer: AdamW restarts from zero moments
    "ddp_load_forgets_optimizer": [("ddp-load-optim", "")],
}
EXPECTED = {
    # the optimizer holds tensors the model no longer has: get_state_dict (in the worker's
    # gathered_state, before any check) fails with torch's KeyError on every rank
    "optimizer_before_fully_shard": r"rank \d: raised KeyError: 0",
    "sync_every_micro_batch": r"\[comm volume\] FSDP2 script x2: reduce_scatter in float32 moved",
    "clip_by_local_norm": r"\[(loss equivalence|clip norm)\] FSDP2 script x2",
    "ddp_load_forgets_optimizer": r"\[checkpoint round trip\] DDP script x2, checkpoint",
}


def test_every_fault_point_is_tagged_once() -> None:
    assert mistagged(PAGE, FAULTS.values()) == {}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_mistake_in_a_script_fails_the_page_by_name(fault: str, tmp_path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED[fault], tmp_path, timeout=300)


def test_the_page_passes_and_prints_its_checks(tmp_path) -> None:
    run = run_python(PAGE, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    assert "All checks passed: both scripts train as one process does" in run.output
