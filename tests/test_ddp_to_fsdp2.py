"""The switch page (``examples/plot_ddp_to_fsdp2.py``): its scripts' mistakes fail it by name.

Each fault is a mistake a reader could make in the FSDP2 script (or the DDP one), injected into
the page's source; the page must then stop with the check that names it, not render.
"""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, run_python

PAGE = EXAMPLES / "plot_ddp_to_fsdp2.py"

FAULTS = {
    # the optimizer built before fully_shard: it holds the tensors FSDP2 replaced
    "optimizer_before_fully_shard": [
        ("    opt = torch.optim.AdamW(model.parameters(), lr=lr)  # after fully_shard: on the "
         "DTensors\n", ""),
        ("    mesh = init_device_mesh(device.type, (dist.get_world_size(),))\n",
         "    opt = torch.optim.AdamW(model.parameters(), lr=lr)\n"
         "    mesh = init_device_mesh(device.type, (dist.get_world_size(),))\n")],
    # accumulation without set_requires_gradient_sync: a reduce-scatter per micro-batch
    "sync_every_micro_batch": [
        ("            model.set_requires_gradient_sync(m == k)  # reduce-scatter on the last "
         "only\n", "")],
    # clipping by each rank's own shards' norm
    "clip_by_local_norm": [
        ("        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
         "        opt.step()\n        opt.zero_grad()\n        losses.append(loss)\n"
         "        norms.append(norm.full_tensor().item())  # the norm is a DTensor\n",
         "        norm = torch.stack([p.grad.to_local().norm() for p in model.parameters()]).norm()\n"
         "        for p in model.parameters():\n"
         "            p.grad.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))\n"
         "        opt.step()\n        opt.zero_grad()\n        losses.append(loss)\n"
         "        norms.append(norm.item())\n")],
    # the DDP load forgets the optimizer: AdamW restarts from zero moments
    "ddp_load_forgets_optimizer": [('    opt.load_state_dict(state["optim"])\n', "")],
}
EXPECTED = {
    # the optimizer holds tensors the model no longer has: get_state_dict (in the worker's
    # gathered_state, before any check) fails with torch's KeyError on every rank
    "optimizer_before_fully_shard": r"rank \d: raised KeyError: 0",
    "sync_every_micro_batch": r"\[comm volume\] FSDP2 script x2: reduce_scatter in float32 moved",
    "clip_by_local_norm": r"\[(loss equivalence|clip norm)\] FSDP2 script x2",
    "ddp_load_forgets_optimizer": r"\[checkpoint round trip\] DDP script x2, checkpoint",
}


def inject(source: str, fault: str) -> str:
    for anchor, replacement in FAULTS[fault]:
        count = source.count(anchor)
        assert count == 1, f"fault {fault!r}: anchor found {count} times:\n{anchor}"
        source = source.replace(anchor, replacement)
    return source


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_anchors_are_in_the_page(fault: str) -> None:
    inject(PAGE.read_text(), fault)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_mistake_in_a_script_fails_the_page_by_name(fault: str, tmp_path) -> None:
    script = tmp_path / PAGE.name
    script.write_text(inject(PAGE.read_text(), fault))
    run = run_python(script, timeout=300)
    assert run.returncode != 0, f"{fault}: the page passed with the fault\n{run.output[-3000:]}"
    assert re.search(EXPECTED[fault], run.output), f"{fault}: not found:\n{run.output[-3000:]}"


def test_the_page_passes_and_prints_its_checks(tmp_path) -> None:
    run = run_python(PAGE, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    assert "All checks passed: both scripts train as one process does" in run.output
