"""The browser calculator's model equals the Python model, run in Node.js instead of Chromium.

The same configurations and comparison as ``tests/test_calculator_widget.py`` (which needs
Chromium and Playwright), on the widget's ``MemoryWidget.model`` loaded into Node with a stub
``window``/``document`` (the model needs neither): every number of every row, the activations and
the smallest N, CPU offload's bytes, as exact integers. Skipped where ``node`` is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from guide.memory.widget import WIDGET_JS
from test_calculator_widget import (
    _JS_REPORTS,
    _reports,
    _reports_at,
    assert_switches_drawn,
    compare,
    configurations,
)

NODE = shutil.which("node")

_HARNESS = """
const fs = require("fs");
global.window = {};
global.document = {readyState: "complete", querySelectorAll: () => [],
                   getElementById: () => true, head: {append: () => {}}};
eval(fs.readFileSync(process.argv[1], "utf8"));
global.MemoryWidget = window.MemoryWidget;
const cfgs = JSON.parse(fs.readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify((%s)(cfgs)));
"""


def _node_reports(cfgs: list[dict], patch: str = "") -> list[dict]:
    script = _HARNESS % _JS_REPORTS
    if patch:
        script = script.replace("global.MemoryWidget = window.MemoryWidget;",
                                "global.MemoryWidget = window.MemoryWidget;\n"
                                "(function () { const M = MemoryWidget.model; " + patch + " })();")
    run = subprocess.run([NODE, "-e", script, str(WIDGET_JS)], input=json.dumps(cfgs),
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(run.stdout)


def node_sample() -> list[int]:
    """The configurations the Node test compares: the first 160 (presets: the list starts with
    every preset x precision x optimizer x checkpointing) and the first 16 after the presets (a
    parameter count alone, at least 10 of them, and random custom shapes), so both kinds of model
    are compared here, not only in Chromium."""
    cfgs = configurations()
    start = next(i for i, c in enumerate(cfgs) if "preset" not in c)
    return [*range(160), *range(start, start + 16)]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.timeout(1200)
def test_widget_model_in_node_equals_the_python_model(request):
    sample = node_sample()
    cfgs, py = _reports_at(sample)
    assert_switches_drawn(cfgs)
    kinds = {"preset" if "preset" in c else "params" if "params" in c else "shape" for c in cfgs}
    assert kinds == {"preset", "params", "shape"}
    assert sum("params" in c for c in cfgs) >= 10
    first, compared, largest = compare(cfgs, _node_reports(cfgs), py, sample)
    assert first is None, first
    assert largest == 0 and compared >= 59 * len(cfgs)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.parametrize(("patch", "field"), [
    ("const f = M.fsdp2BufferBytes; M.fsdp2BufferBytes = (a, k, p) => f(a, k, p) / 2n;", "buffers"),
    ("const f = M.logitsBytes; M.logitsBytes = (a, s, b) => f(a, s, b) / 2n;", "activations"),
    ("M.autocastWeightBytes = () => 0n;", "autocast"),
    # each of guide-memory's switches ignored by the port: the guard names what it changes
    ("const f = M.activationBytes; M.activationBytes = (a, s, b, c, e) => f(a, s, b, c, e);",
     "activations"),
    ("const f = M.perGpu; M.perGpu = (...x) => f(...x.slice(0, 8));", "buckets"),
    ("const f = M.fitReport; M.fitReport = (c) => f({...c, strategies: c.strategies.map("
     "(k) => (k === 'zero2' ? 'fsdp2_no_reshard' : k))});", "zero2"),
    # --cpu-offload ignored by the port, and two of its formulas changed
    ("const f = M.fitReport; M.fitReport = (c) => f({...c, cpu_offload: false});", "cpu_offload"),
    ("const f = M.offloadTraffic; M.offloadTraffic = (u, n, p) => f(u, n, p, 0, false);",
     "to_device"),
    ("const f = M.offloadMemory; M.offloadMemory = (...x) => { const m = f(...x); "
     "return {...m, gpu_saved: m.params + m.optimizer}; };", "gpu_saved"),
])
def test_node_guard_names_the_part_when_a_formula_changes(patch, field):
    cfgs, py = _reports(40)
    assert_switches_drawn(cfgs)
    assert compare(cfgs, _node_reports(cfgs), py)[0] is None  # the patch makes the difference
    first, _, _ = compare(cfgs, _node_reports(cfgs, patch), py)
    # the part named after the configuration (whose JSON names every switch anyway)
    assert first is not None and field in first.split("}: ", 1)[1], first
