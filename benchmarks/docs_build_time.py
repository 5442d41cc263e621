"""How long the site takes to build: cold, unchanged rebuild, and after a change to ``guide``.

Budget (foundation issue): the docs build with the main example <= 60 s cold on 2 cores once the venv
exists; a rebuild with nothing changed <= 15 s; a change to ``guide`` must re-execute the examples.
Prints numbers; asserts nothing (benchmarks are not tests).

    python benchmarks/docs_build_time.py [--all]    # --all: every example, not only the main one
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def build(out: Path, pattern: str | None) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(out)]
    if pattern:
        cmd += ["-D", f"sphinx_gallery_conf.filename_pattern={pattern}"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
                               **{k: v for k, v in __import__("os").environ.items()}})
    elapsed = time.monotonic() - start
    if proc.returncode:
        sys.exit(f"build failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def executed(log: str) -> str:
    m = re.search(r"executed (\d+) out of (\d+)", log)
    return f"{m[1]}/{m[2]} examples executed" if m else "examples: n/a"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="build every example")
    pattern = None if parser.parse_args().all else "plot_ddp_vs_fsdp2"
    out = Path("/tmp/guide-bench-html")
    for path in (out, DOCS / "auto_examples", DOCS / "_build" / ".jupyter_cache"):
        shutil.rmtree(path, ignore_errors=True)
    cold, log = build(out, pattern)
    print(f"cold build:             {cold:6.1f} s  ({executed(log)})")
    warm, log = build(out, pattern)
    print(f"rebuild, no change:     {warm:6.1f} s  ({executed(log)})")
    training = ROOT / "src" / "guide" / "training.py"
    original = training.read_text()
    try:
        training.write_text(original + "\n# benchmark: touched\n")
        changed, log = build(out, pattern)
    finally:
        training.write_text(original)
    print(f"rebuild, guide changed: {changed:6.1f} s  ({executed(log)})")
    build(out, pattern)  # leave the caches matching the restored sources


if __name__ == "__main__":
    main()
