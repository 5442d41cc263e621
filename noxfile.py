"""Sessions: ``docs`` builds the site with every example executed (the test of the whole site);
``tests`` runs pytest. Both install from ``constraints.txt`` (torch pinned to the CPU 2.13.0 wheel)."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "docs"]

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints.txt")
# One intra-op thread per rank is set by the launcher; this keeps the parent (and any fork of it)
# from spinning up an OpenMP pool that competes with the ranks for two cores.
ENV = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}


def _install(session: nox.Session, extras: str) -> None:
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the HTML site into docs/_build/html, running every example; warnings are errors."""
    _install(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html",
                *session.posargs, env=ENV)
    session.log(f"open file://{os.path.abspath('docs/_build/html/index.html')}")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (launcher, checks with injected faults, models, docs plumbing)."""
    _install(session, "docs,test")
    session.run("pytest", *session.posargs, env=ENV)


@nox.session(python=PYTHON)
def browser(session: nox.Session) -> None:
    """Check the built site in headless Chromium (Debian's /usr/bin/chromium, via Playwright): every
    page loads without console errors, images load, internal links and anchors resolve, search finds
    fully_shard, figures fit a phone screen. Screenshots go to docs/_build/screenshots. Run
    ``nox -s docs`` first; ``apt-get install -y chromium`` provides the browser."""
    _install(session, "docs,test,browser")
    session.run("pytest", "tests/test_site.py", "-k", "browser", *session.posargs,
                env={**ENV, "GUIDE_SITE_TESTS": "browser"})


@nox.session(python=PYTHON)
def downloads(session: nox.Session) -> None:
    """Run each example's downloaded .py and .ipynb (from docs/_build/html/_downloads) in a fresh
    virtual environment holding only this package, and check the zips hold every example. Run
    ``nox -s docs`` first. With ``GUIDE_DOWNLOADS=main`` only the main example's downloads run (the
    zips are still checked for every example)."""
    _install(session, "test")
    session.run("pytest", "tests/test_site.py", "-k", "download", *session.posargs,
                env={**ENV, "GUIDE_SITE_TESTS": "downloads"})
