"""Fault -> exit code -> seconds to fail -> message, for every fault in ``tests/faults.py``.

Runs the main example with each fault injected, as a user would (``python example.py``), and prints a
Markdown table. The seconds include starting Python and torch and the runs before the fault fires.

    python benchmarks/fault_table.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import MAIN_EXAMPLE, run_python  # noqa: E402
from faults import FAULTS, write_faulty_example  # noqa: E402

HEADLINE = re.compile(r"^(guide\.\w+\.)?(CheckFailed|RankRaised|RankDied|RankHung|JobTimeout|"
                      r"RankOutOfMemory|LaunchError): .*$", re.MULTILINE)


def main() -> None:
    print("| fault | exit code | seconds | message |\n|---|---|---|---|")
    for fault in FAULTS:
        with tempfile.TemporaryDirectory() as tmp:
            run = run_python(write_faulty_example(MAIN_EXAMPLE, fault, Path(tmp)), timeout=300)
        line = next((m.group(0) for m in HEADLINE.finditer(run.output)), "(no headline)")
        print(f"| {fault} | {run.returncode} | {run.seconds:.1f} | `{line[:160]}` |")


if __name__ == "__main__":
    main()
