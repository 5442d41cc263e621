"""Busy-machine soak: run every executed page N times with CPU hogs beside it; a table of passes.

A flake that shows only when the machine is busy (a rank descheduled at the wrong moment, a timeout
too tight for a loaded CI runner) passes every quiet run. This script makes the machine busy on
purpose: ``--hogs`` processes spin (``while True: pass``) for the whole soak, and each page runs
``--runs`` times in its own process:

* an example (``examples/plot_*.py``) as a script would (``python plot_x.py`` in a fresh temporary
  working directory, ``OMP_NUM_THREADS=1``);
* a MyST-NB page with code cells (``docs/**.md``) as the docs build runs it: every cell in a
  Jupyter kernel, in the page's folder, recording into a scratch copy of the last build's ledger
  (``docs/_build/ledger``; the ledger page lists it, so it is skipped, saying so, if there is none).

It prints, per page, the runs that passed and failed, the median time of a run and the load average
(1 min) sampled after each run, and saves the output of every failed run under ``--logs``
(``<tmp>/guide-soak-logs``). Exits 1 if any run failed.

    python benchmarks/soak.py                          # every page, 5 runs, 4 hogs (nox -s soak)
    python benchmarks/soak.py --runs 20 plot_checkpoint
    python benchmarks/soak.py --hogs 2 --runs 3 plot_checkpoint how_fsdp2_shards

Not part of CI: every page N times takes about N times a docs build (each run is 5-170 s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from guide.report import table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
#: The ledger of the last docs build: MyST pages record into a scratch copy of it.
BUILT_LEDGER = DOCS / "_build" / "ledger"
#: What a hog runs: one CPU kept busy, nothing else.
HOG = "while True: pass"
#: Runs a MyST-NB page's cells in a kernel, in the page's folder, as myst-nb does in the build.
RUN_MYST = """
import sys
from pathlib import Path
import nbclient
from myst_nb.core.read import read_myst_markdown_notebook
page = Path(sys.argv[1])
nb = read_myst_markdown_notebook(page.read_text())
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                        resources={"metadata": {"path": str(page.parent)}}).execute()
"""


def myst_pages() -> list[Path]:
    """The MyST-NB pages the docs build executes (those with a code cell)."""
    return [p for p in sorted(DOCS.rglob("*.md"))
            if "_build" not in p.parts and "```{code-cell}" in p.read_text()]


def pages(names: list[str]) -> list[Path]:
    """The pages named (an example's or a MyST page's stem, with or without its suffix), or every
    ``examples/plot_*.py`` and every executed MyST page."""
    every = sorted(EXAMPLES.glob("plot_*.py")) + myst_pages()
    if not names:
        return every
    by_stem = {p.stem: p for p in every}
    chosen = []
    for name in names:
        stem = name.removesuffix(".py").removesuffix(".md")
        if stem not in by_stem:
            sys.exit(f"{name}: no such page; choose from {sorted(by_stem)}.")
        chosen.append(by_stem[stem])
    return chosen


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:  # only the processes this script started
        hog.kill()
        hog.wait()


def run_page(page: Path, timeout_s: float) -> tuple[bool, float, str]:
    """Run ``page`` once (an example as a script, a MyST page's cells in a kernel): (passed,
    seconds, its output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0",
           "GUIDE_PROGRESS": "0"}
    env.pop("GUIDE_LEDGER_DIR", None)  # a soak records nothing in a docs build's ledger
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="guide-soak-") as cwd:
        if page.suffix == ".md":
            ledger = Path(cwd) / "ledger"  # a scratch copy: the build's ledger is left as it was
            shutil.copytree(BUILT_LEDGER, ledger) if BUILT_LEDGER.is_dir() else ledger.mkdir()
            env["GUIDE_LEDGER_DIR"] = str(ledger)
            command, where = [sys.executable, "-c", RUN_MYST, str(page)], page.parent
        else:
            command, where = [sys.executable, str(page)], Path(cwd)
        try:
            proc = subprocess.run(command, cwd=where, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
            ok, out = proc.returncode == 0, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            ok = False
            out = f"timed out after {timeout_s:g} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return ok, time.monotonic() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="example stems (default: every plot_*.py)")
    parser.add_argument("--runs", type=int, default=5, help="runs per page (default 5)")
    parser.add_argument("--hogs", type=int, default=4, help="CPU-bound processes beside (4)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (900)")
    parser.add_argument("--logs", type=Path,
                        default=Path(tempfile.gettempdir()) / "guide-soak-logs",
                        help="where the output of failed runs goes (default <tmp>/guide-soak-logs)")
    args = parser.parse_args()
    if args.runs < 1 or args.hogs < 0:
        sys.exit("--runs must be at least 1 and --hogs at least 0.")
    chosen = pages(args.pages)
    ledger_page = DOCS / "pages" / "ledger.md"
    if ledger_page in chosen and not BUILT_LEDGER.is_dir():
        print(f"skipped {ledger_page.stem}: it lists a finished build's ledger and "
              f"{BUILT_LEDGER.relative_to(ROOT)} does not exist (build the site first).", flush=True)
        chosen.remove(ledger_page)
    if "GUIDE_LEDGER_DIR" in os.environ:
        print("note: GUIDE_LEDGER_DIR is ignored: the soak records nothing.", flush=True)
    rows, failed_runs, loads = [], 0, []
    start = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the hogs are stopped too
    hogs = start_hogs(args.hogs)
    try:
        for page in chosen:
            passed, seconds, page_loads = 0, [], []
            for i in range(1, args.runs + 1):
                ok, took, out = run_page(page, args.timeout)
                load = os.getloadavg()[0]
                passed += ok
                seconds.append(took)
                page_loads.append(load)
                status = "pass" if ok else "FAIL"
                print(f"{page.stem} run {i}/{args.runs}: {status} in {took:.0f} s, "
                      f"load {load:.1f}", flush=True)
                if not ok:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    log = args.logs / f"{page.stem}-run{i}.log"
                    log.write_text(out)
                    print(f"  output: {log}\n  " + "\n  ".join(out.strip().splitlines()[-8:]),
                          flush=True)
            failed_runs += args.runs - passed
            loads += page_loads
            rows.append([page.stem, args.runs, passed, args.runs - passed,
                         statistics.median(seconds), statistics.mean(page_loads),
                         max(page_loads)])
    finally:
        stop_hogs(hogs)
    print()
    print(table(rows, ["page", "runs", "passed", "failed", "median s", "load (mean)",
                       "load (max)"],
                formats={"median s": ".0f", "load (mean)": ".1f", "load (max)": ".1f"},
                title=f"Soak: {args.runs} runs per page beside {args.hogs} CPU hogs on "
                      f"{os.cpu_count()} cores (load: 1-min average after each run)"))
    print(f"\n{failed_runs} failed runs of {args.runs * len(chosen)}; load average over the soak "
          f"{statistics.mean(loads):.1f} (max {max(loads):.1f}); took "
          f"{time.monotonic() - start:.0f} s")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
