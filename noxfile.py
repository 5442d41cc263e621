"""Sessions: ``docs`` builds the site with every example executed (the test of the whole site);
``tests`` runs pytest; ``modes`` runs every example at every world size it declares, with torchrun
and python; ``browser`` and ``downloads`` check the built site; ``compat`` runs the tests
and the examples on the lowest and the newest torch the project claims; ``mutation`` checks that the
checks bite; ``soak`` runs every executed page N times beside CPU hogs (flakes that need a busy
machine).

Every session runs on the interpreter that runs nox (any supported Python, see
:data:`SUPPORTED_PYTHONS`), never on a hard-coded one: a pinned interpreter that is missing makes nox
*skip* the session and exit 0, a pass for a build that never happened. ``--force-python X`` with a
missing ``X`` is an error (``error_on_missing_interpreters``), and so is an unsupported Python.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "docs"]

#: The Pythons the project supports and CI or the closing notes have run. On 3.10, constraints.txt
#: pins the last releases that support it (Sphinx 8.1, NumPy 2.2, IPython 8: ``python_version``
#: markers); 3.11 and newer get the current ones.
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
#: The torch releases the ``compat`` session runs: the floor pyproject.toml claims, and the newest
#: the package index serves on these machines.
COMPAT_TORCH = ("2.9.0", "2.14.1")
CONSTRAINTS = ("-c", "constraints.txt")
# One intra-op thread per rank is set by the launcher; this keeps the parent (and any fork of it)
# from spinning up an OpenMP pool that competes with the ranks for two cores.
ENV = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}


def _workers() -> list[str]:
    """pytest-xdist options for the test suite: one worker per core, at most 4 (a test starts up to
    8 rank processes of about 0.4 GB each), whole files per worker (module fixtures run once).
    Serially the suite keeps 0.7 of one core busy: its ranks mostly wait on each other and on
    imports. ``GUIDE_TEST_WORKERS=N`` sets the count (1: one process, no xdist; CI's compat lane
    runs beside the other sessions with 1); ``nox -s tests -- -n 0`` works too."""
    asked = os.environ.get("GUIDE_TEST_WORKERS", "").strip()
    if asked and not (asked.isdigit() and int(asked) >= 1):
        raise ValueError(f"GUIDE_TEST_WORKERS={asked!r}: give a whole number of pytest workers, "
                         "at least 1 (1 runs the suite in one process)")
    workers = int(asked) if asked else min(4, os.cpu_count() or 1)
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


def _require_supported_python(session: nox.Session) -> None:
    """Fail (never skip) on a Python the project does not support."""
    ask = ("python", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
    # run_always runs under --install-only and is skipped under --no-install (nox -R); run is the
    # other way round: one of the two answers in every mode.
    version = (session.run_always(*ask, silent=True, external=True)
               or session.run(*ask, silent=True, external=True) or "").strip()
    if not version:
        session.error("could not tell which Python this session runs (python -c printed nothing).")
    if version not in SUPPORTED_PYTHONS:
        session.error(f"Python {version} is not supported; use one of {', '.join(SUPPORTED_PYTHONS)} "
                      f"(e.g. `pipx run --python python3.12 nox -s {session.name}`).")


@contextlib.contextmanager
def _one_install_at_a_time() -> Iterator[None]:
    """Hold a lock on .nox/install.lock while pip installs this checkout: an editable install
    writes src/*.egg-info and build/ in the tree, and two sessions installing at once (CI's compat
    lane beside the others, .ci/run) must not write them together. No lock without fcntl."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    Path(".nox").mkdir(exist_ok=True)
    with open(".nox/install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install(session: nox.Session, extras: str) -> None:
    _require_supported_python(session)
    with _one_install_at_a_time():
        session.install(*CONSTRAINTS, "-e", f".[{extras}]")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the HTML site into docs/_build/html, running every example; warnings are errors."""
    _install(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html",
                *session.posargs, env=ENV)
    session.log(f"open file://{os.path.abspath('docs/_build/html/index.html')}")


def _one_page(session: nox.Session) -> tuple[str, ...]:
    """The examples ``nox -s page -- plot_x [plot_y]`` names, checked by docs/one_page.py before
    anything is installed: a wrong name fails at once, naming every example."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("one_page", Path("docs/one_page.py"))
    one_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(one_page)
    try:
        return one_page.pages(" ".join(session.posargs),
                              asked=f"nox -s page -- {' '.join(session.posargs)}".rstrip())
    except ValueError as err:
        session.error(str(err))


def _install_unless_unchanged(session: nox.Session, extras: str) -> None:
    """:func:`_install`, skipped when pyproject.toml and constraints.txt are as they were at this
    venv's last install (the package is installed editable: a change under src/ needs none). The
    one-page loop saves pip's seconds; delete the venv (.nox/page) to force an install."""
    import hashlib

    stamp = Path(session.virtualenv.location) / ".guide-installed"
    digest = hashlib.sha256(extras.encode() + Path("pyproject.toml").read_bytes()
                            + Path("constraints.txt").read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        _require_supported_python(session)
        session.log("install skipped: pyproject.toml and constraints.txt unchanged since this "
                    "venv's last install")
        return
    _install(session, extras)
    if "--install-only" not in sys.argv and "--no-install" not in sys.argv:
        stamp.write_text(digest)


@nox.session
def page(session: nox.Session) -> None:
    """The one-page loop: ``nox -s page -- plot_x`` builds a site of that example alone into
    docs/_build/page-plot_x/html (docs/one_page.py): the example runs on every build, whatever
    changed, with its checks (ledger, strict scan of the rendered numbers, recorded tables); links
    to pages not built render as text. Name a second example if the first cites its claims. Only
    ``nox -s docs`` builds and checks the whole site: run it before you stop."""
    only = _one_page(session)
    _install_unless_unchanged(session, "docs")
    out = Path("docs/_build") / f"page-{only[0]}"
    started = time.monotonic()
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "-d", str(out / "doctrees"),
                "docs", str(out / "html"), env={**ENV, "GUIDE_ONLY": ",".join(only)})
    session.log(f"one-page site built in {time.monotonic() - started:.1f} s: open "
                f"file://{(out / 'html' / 'auto_examples' / only[0]).resolve()}.html")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (launcher, checks with injected faults, models, docs plumbing) on one
    pytest-xdist worker per core, at most 4 (``-- -n 0``: one process; see :func:`_workers`)."""
    _install(session, "docs,test")
    session.run("pytest", *_workers(), *session.posargs, env=ENV)


@nox.session
def modes(session: nox.Session) -> None:
    """Every example at every world size it declares (1, 2, 4, 8 where supported) under
    ``torchrun --standalone``, each once with ``python``, the main example's notebook in a Jupyter
    kernel, and every unsupported size refused at once: tests/modes, test_example_modes.py and
    test_world_sizes.py. Long on 2 cores (the README gives the measured matrix); pick parts with
    ``-k``, e.g. ``nox -s modes -- -k "n2 or n4"``. Prints the matrix with each run's seconds."""
    _install(session, "docs,test")
    session.run("pytest", "-q", "tests/modes", "tests/test_example_modes.py",
                "tests/test_world_sizes.py", *session.posargs, env={**ENV, "GUIDE_MODES": "1"})


@nox.session
def browser(session: nox.Session) -> None:
    """Check the built site in headless Chromium (Debian's /usr/bin/chromium, via Playwright): every
    page loads without console errors, images load, internal links and anchors resolve, search finds
    fully_shard, figures fit a phone screen, code fits the column; the memory calculator's
    JavaScript equals the Python model on 320 configurations (tests/test_calculator_widget.py,
    which serves docs/_static itself). Screenshots go to
    docs/_build/screenshots. Run ``nox -s docs`` first; ``apt-get install -y chromium`` provides the
    browser."""
    _install(session, "docs,test,browser")
    session.run("pytest", "tests/test_site.py", "tests/test_calculator_widget.py", "-k", "browser",
                *_workers(), *session.posargs,
                env={**ENV, "GUIDE_SITE_TESTS": "browser"})


@nox.session
def downloads(session: nox.Session) -> None:
    """Run each example's downloaded .py and .ipynb (from docs/_build/html/_downloads) in a fresh
    virtual environment holding only this package, and check the zips hold every example. Run
    ``nox -s docs`` first. With ``GUIDE_DOWNLOADS=main`` only the main example's downloads run (the
    zips are still checked for every example)."""
    _install(session, "test")
    session.run("pytest", "tests/test_site.py", "-k", "download", *session.posargs,
                env={**ENV, "GUIDE_SITE_TESTS": "downloads"})


def _constraints_without_torch(session: nox.Session) -> str:
    """constraints.txt minus its torch pin, so that a session can install another torch."""
    out = Path(session.create_tmp()) / "constraints-no-torch.txt"
    lines = Path("constraints.txt").read_text().splitlines()
    out.write_text("\n".join(line for line in lines if not line.startswith("torch==")) + "\n")
    return str(out)


@nox.session
@nox.parametrize("torch", COMPAT_TORCH)
def compat(session: nox.Session, torch: str) -> None:
    """The test suite and the examples (as scripts) on another torch, in its own venv.

    These are CUDA wheels (several GB); they run on the CPU. By default the whole test suite and
    every example run. ``GUIDE_COMPAT=main`` (what CI runs, to stay within its budget) runs the
    suite without its three whole-page files (injected faults, the built site, the four ways of
    running, which the default torch covers) and the main example only.
    """
    _require_supported_python(session)
    constraints = _constraints_without_torch(session)
    session.install("-c", constraints, f"torch=={torch}")  # the GB-sized wheel: nothing in the tree
    with _one_install_at_a_time():
        session.install("-c", constraints, f"torch=={torch}", "-e", ".[docs,test]")
    versions = session.run("python", "-c", "import torch, sys; print(sys.version.split()[0], "
                           "torch.__version__)", silent=True)
    if versions is None:  # --install-only: nothing ran
        return
    versions = versions.split()
    quick = os.environ.get("GUIDE_COMPAT") == "main"
    started = time.monotonic()
    skip = ([f"--ignore=tests/{f}" for f in ("test_faults.py", "test_site.py",
                                              "test_example_modes.py")] if quick else [])
    tests = session.run("pytest", "-q", "-p", "no:cacheprovider", *_workers(), *skip,
                        *session.posargs, env=ENV, silent=True)
    print(tests[-2000:])
    summary = tests.strip().splitlines()[-1].strip("= ")
    examples = (["examples/plot_ddp_vs_fsdp2.py"] if quick
                else sorted(str(p) for p in Path("examples").glob("plot_*.py")))
    for example in examples:
        session.run("python", example, env=ENV)
    _record_compat({"python": versions[0], "torch": versions[1],
                    "suite": "without test_faults, test_site, test_example_modes" if quick
                    else "whole",
                    "tests": summary,
                    "examples": [Path(e).stem for e in examples],
                    "minutes": round((time.monotonic() - started) / 60, 1),
                    "date": datetime.date.today().isoformat()})
    session.log(f"compat: python {versions[0]}, torch {versions[1]}: {summary}; "
                f"{len(examples)} example(s) passed")


def _record_compat(run: dict) -> None:
    """Keep the newest run per (python, torch) in docs/compat_runs.json: the install page states
    the versions that were run from this file, not from memory. ``GUIDE_COMPAT_RECORD=path``
    records elsewhere: CI's compat lane runs while the docs build reads this file, and the site
    must show the committed record, whole. The file is replaced at once, never half written."""
    path = Path(os.environ.get("GUIDE_COMPAT_RECORD") or "docs/compat_runs.json")
    runs = json.loads(path.read_text()) if path.exists() and path.stat().st_size else []
    runs = [r for r in runs if (r["python"], r["torch"]) != (run["python"], run["torch"])] + [run]
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(sorted(runs, key=lambda r: (r["torch"], r["python"])), indent=1)
                       + "\n")
    os.replace(partial, path)


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the checks, the launcher, checkpoint, comm, training, memory
    and docs/ledger_ext.py (benchmarks/mutation.py's SCOPE): each mutant is a one-line bug; a
    surviving mutant is a check nobody tests. Slow (see README); not part of CI."""
    _install(session, "docs,test")
    session.install(*CONSTRAINTS, "mutmut")
    session.run("python", "benchmarks/mutation.py", *session.posargs, env=ENV)


@nox.session
def soak(session: nox.Session) -> None:
    """Every executed page (examples and MyST-NB pages) N times (default 5) beside CPU-bound hogs
    (default 4), then a table of passes per page and the load average (benchmarks/soak.py;
    posargs go to it, e.g. ``-- --runs 20 plot_checkpoint``). Long: about N docs builds; not part of CI."""
    _install(session, "docs,test")
    session.run("python", "benchmarks/soak.py", *session.posargs, env=ENV)
