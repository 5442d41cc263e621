"""Fault -> exit code -> seconds to fail -> message, for every fault in ``tests/faults.py`` and the
checkpoint faults of ``tests/test_checkpoint.py``.

Runs the main example with each fault injected, as a user would (``python example.py``), then each
checkpoint fault as a script (``python tests/test_checkpoint.py FAULT``: a published checkpoint with
the fault injected, loaded through ``guide.checkpoint.verify``), and prints a Markdown table. The
seconds include starting Python and torch and the runs before the fault fires.

    python benchmarks/fault_table.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import MAIN_EXAMPLE, ROOT, run_python  # noqa: E402
from faults import FAULTS, write_faulty_example  # noqa: E402
from test_checkpoint import SCRIPT_FAULTS  # noqa: E402

HEADLINE = re.compile(r"^(guide\.[\w.]+\.)?(CheckFailed|RankRaised|RankDied|RankHung|JobTimeout|"
                      r"RankOutOfMemory|LaunchError|CheckpointError): .*$", re.MULTILINE)


def main() -> None:
    print("| fault | exit code | seconds | message |\n|---|---|---|---|")
    for fault in FAULTS:
        with tempfile.TemporaryDirectory() as tmp:
            run = run_python(write_faulty_example(MAIN_EXAMPLE, fault, Path(tmp)), timeout=300)
        line = next((m.group(0) for m in HEADLINE.finditer(run.output)), "(no headline)")
        print(f"| {fault} | {run.returncode} | {run.seconds:.1f} | `{line[:160]}` |")
    for fault in SCRIPT_FAULTS:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "tests" / "test_checkpoint.py"), fault],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds = time.monotonic() - start
        line = next((m.group(0) for m in HEADLINE.finditer(proc.stdout + proc.stderr)),
                    "(no headline)")
        print(f"| checkpoint: {fault} | {proc.returncode} | {seconds:.1f} | `{line[:200]}` |")


if __name__ == "__main__":
    main()
