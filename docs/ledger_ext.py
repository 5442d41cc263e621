"""Sphinx extension: the ledger of claims (:mod:`guide.claims`) as a build check.

* At config time it points ``GUIDE_LEDGER_DIR`` at ``ledger_dir``: gallery scripts (run in this
  process) and notebook kernels (child processes) record there. Records of pages that no longer
  exist are dropped.
* ``ledger_page`` is read after every other page (it lists what they recorded) and on every build.
* When the build finishes, two records of one claim that disagree fail it, naming both pages.
"""

from __future__ import annotations

import os
from pathlib import Path

from sphinx.errors import ExtensionError

from guide import claims


def _configure(app, config) -> None:
    directory = Path(config.ledger_dir or Path(app.outdir).parent / "ledger")
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[claims.LEDGER_ENV] = str(directory)
    srcdir = Path(app.srcdir)
    for path in directory.glob("*.jsonl"):
        page = path.stem.replace("__", "/")
        sources = [srcdir / f"{page}.md", srcdir / f"{page}.rst",
                   *(Path(d if os.path.isabs(d) else srcdir / d) / f"{page}.py"
                     for d in _gallery_dirs(config))]
        if not any(p.exists() for p in sources):
            path.unlink()


def _gallery_dirs(config) -> list[str]:
    conf = getattr(config, "sphinx_gallery_conf", None) or {}
    dirs = conf.get("examples_dirs", [])
    return [dirs] if isinstance(dirs, str) else list(dirs)


def _ledger_last(app, env, docnames) -> None:
    page = app.config.ledger_page
    if page in docnames:
        docnames.remove(page)
        docnames.append(page)


def _ledger_always_outdated(app, env, added, changed, removed):
    page = app.config.ledger_page
    return [page] if page in env.found_docs else []


def _check(app, exception) -> None:
    if exception is not None:
        return
    try:
        claims.raise_on_contradictions(claims.load(os.environ[claims.LEDGER_ENV]))
    except AssertionError as err:
        raise ExtensionError(str(err)) from None


def setup(app):
    app.add_config_value("ledger_dir", "", "env")
    app.add_config_value("ledger_page", "pages/ledger", "env")
    app.connect("config-inited", _configure)
    app.connect("env-before-read-docs", _ledger_last)
    app.connect("env-get-outdated", _ledger_always_outdated)
    app.connect("build-finished", _check)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
