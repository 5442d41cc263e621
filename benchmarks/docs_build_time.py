"""How long the whole site takes to build, and where the time goes.

Budget (issue "a newcomer on any machine"), on a 2-core machine with the venv ready: cold <= 180 s,
unchanged rebuild <= 15 s, one example touched <= that example's own time + 15 s; a change to
``guide`` re-executes every page. Prints numbers; asserts nothing (benchmarks are not tests).

    python benchmarks/docs_build_time.py            # the whole site: every example and page
    python benchmarks/docs_build_time.py --cold     # only the cold build (and the per-page table)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OUT = Path("/tmp/guide-bench-html")
_TIME = re.compile(r"\*\*Total running time of the script:\*\*\s*\((\d+) minutes\s+([\d.]+) seconds\)")


def build() -> tuple[float, str]:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(OUT)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - start
    if proc.returncode:
        sys.exit(f"build failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def executed(log: str) -> str:
    m = re.search(r"executed (\d+) out of (\d+)", log)
    return f"{m[1]}/{m[2]} examples executed" if m else "examples: none executed"


def example_seconds() -> dict[str, float]:
    """Each example's own running time, as sphinx-gallery recorded it in its generated page."""
    out = {}
    for rst in sorted((DOCS / "auto_examples").glob("plot_*.rst")):
        if m := _TIME.search(rst.read_text()):
            out[rst.stem] = 60 * int(m[1]) + float(m[2])
    return out


def touched(path: Path):
    """Append a comment to ``path`` for one build, then restore it."""
    class _Touch:
        def __enter__(self):
            self.original = path.read_text()
            path.write_text(self.original + "\n# benchmark: touched\n")

        def __exit__(self, *exc):
            path.write_text(self.original)
    return _Touch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="only the cold build")
    args = parser.parse_args()
    for path in (OUT, DOCS / "auto_examples", DOCS / "_build" / ".jupyter_cache",
                 DOCS / "jupyter_execute"):
        shutil.rmtree(path, ignore_errors=True)
    cold, log = build()
    print(f"cold build (whole site):      {cold:6.1f} s  ({executed(log)})")
    per_example = example_seconds()
    for name, seconds in sorted(per_example.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<34}{seconds:6.1f} s")
    print(f"    {'sum of examples':<34}{sum(per_example.values()):6.1f} s")
    if args.cold:
        return
    warm, log = build()
    print(f"rebuild, no change:           {warm:6.1f} s  ({executed(log)})")
    main_example = ROOT / "examples" / "plot_ddp_vs_fsdp2.py"
    with touched(main_example):
        one, log = build()
    print(f"rebuild, main example touched:{one:6.1f} s  ({executed(log)}; the example alone: "
          f"{per_example.get('plot_ddp_vs_fsdp2', float('nan')):.1f} s)")
    with touched(ROOT / "src" / "guide" / "training.py"):
        changed, log = build()
    print(f"rebuild, guide touched:       {changed:6.1f} s  ({executed(log)})")
    build()  # leave the caches matching the restored sources


if __name__ == "__main__":
    main()
