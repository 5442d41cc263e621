"""docs/ledger_ext.py at config time: which ledger records survive (no Sphinx build, a fake app).

A record file is named for its page with ``/`` spelled ``__`` (``pages/x`` -> ``pages__x.jsonl``,
:class:`guide.claims.Ledger`); the extension must map the stem back to ``pages/x`` to find the
page. Dropping the records of pages under ``docs/pages/`` would let an incremental build's cached
page contradict an example silently.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from guide import claims

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ledger_ext(monkeypatch):
    """``docs/ledger_ext.py``, imported as ``docs.ledger_ext`` (the name the mutation session
    knows it by; Sphinx imports the same file as ``ledger_ext``)."""
    monkeypatch.syspath_prepend(str(ROOT))
    module = importlib.import_module("docs.ledger_ext")
    assert Path(module.__file__) == ROOT / "docs" / "ledger_ext.py"
    yield module
    for name in ("docs.ledger_ext", "docs"):
        sys.modules.pop(name, None)


def test_records_of_existing_pages_survive_and_of_gone_pages_are_dropped(
        ledger_ext, tmp_path, monkeypatch) -> None:
    src, ledger, gallery = tmp_path / "docs", tmp_path / "ledger", tmp_path / "examples"
    (src / "pages").mkdir(parents=True)
    (src / "pages" / "x.md").write_text("# x\n")
    (src / "top.md").write_text("# top\n")
    gallery.mkdir()
    (gallery / "plot_y.py").write_text("")
    monkeypatch.setenv(claims.LEDGER_ENV, str(ledger))
    for page in ("pages/x", "top", "plot_y", "pages/gone", "gone"):
        claims.Ledger(page).claim(f"{page}.n", 1, "parameters")  # the file the ledger names
    assert len(list(ledger.glob("*.jsonl"))) == 5
    app = SimpleNamespace(outdir=str(tmp_path / "out"), srcdir=str(src))
    config = SimpleNamespace(ledger_dir=str(ledger),
                             sphinx_gallery_conf={"examples_dirs": str(gallery)})
    ledger_ext._configure(app, config)
    assert sorted(p.name for p in ledger.glob("*.jsonl")) == \
        ["pages__x.jsonl", "plot_y.jsonl", "top.jsonl"]
    assert os.environ[claims.LEDGER_ENV] == str(ledger)


def test_the_default_ledger_sits_beside_the_output_and_a_relative_gallery_is_found(
        ledger_ext, tmp_path, monkeypatch) -> None:
    """No ``ledger_dir``: ``<outdir>/../ledger``, made with its parents. A gallery directory given
    relative to the source directory (as conf.py does) is looked up there, not in the cwd."""
    src = tmp_path / "docs"
    (src / "gallery").mkdir(parents=True)
    (src / "gallery" / "plot_y.py").write_text("")
    monkeypatch.chdir(tmp_path)  # the cwd is not the source directory
    app = SimpleNamespace(outdir=str(tmp_path / "build" / "deep" / "html"), srcdir=str(src))
    config = SimpleNamespace(ledger_dir="", sphinx_gallery_conf={"examples_dirs": ["gallery"]})
    ledger = tmp_path / "build" / "deep" / "ledger"
    monkeypatch.setenv(claims.LEDGER_ENV, str(ledger))
    claims.Ledger("plot_y").claim("y.n", 1, "parameters")
    claims.Ledger("plot_gone").claim("y.n", 1, "parameters")
    ledger_ext._configure(app, config)
    assert os.environ[claims.LEDGER_ENV] == str(ledger)
    assert sorted(p.name for p in ledger.glob("*.jsonl")) == ["plot_y.jsonl"]
    fresh = SimpleNamespace(outdir=str(tmp_path / "new" / "a" / "html"), srcdir=str(src))
    ledger_ext._configure(fresh, config)  # parents made as needed
    assert (tmp_path / "new" / "a" / "ledger").is_dir()


def test_gallery_dirs_in_every_form(ledger_ext) -> None:
    conf = SimpleNamespace
    assert ledger_ext._gallery_dirs(conf(sphinx_gallery_conf={"examples_dirs": "ex"})) == ["ex"]
    assert ledger_ext._gallery_dirs(conf(sphinx_gallery_conf={"examples_dirs": ["a", "b"]})) == \
        ["a", "b"]
    assert ledger_ext._gallery_dirs(conf(sphinx_gallery_conf=None)) == []
    assert ledger_ext._gallery_dirs(conf(sphinx_gallery_conf={})) == []
    assert ledger_ext._gallery_dirs(conf()) == []


def test_the_ledger_page_is_read_last_and_always(ledger_ext) -> None:
    app = SimpleNamespace(config=SimpleNamespace(ledger_page="pages/ledger"))
    docnames = ["pages/ledger", "a", "pages/b"]
    ledger_ext._ledger_last(app, None, docnames)
    assert docnames == ["a", "pages/b", "pages/ledger"]
    other = ["a", "b"]
    ledger_ext._ledger_last(app, None, other)
    assert other == ["a", "b"]
    env = SimpleNamespace(found_docs={"a", "pages/ledger"})
    assert ledger_ext._ledger_always_outdated(app, env, set(), set(), set()) == ["pages/ledger"]
    assert ledger_ext._ledger_always_outdated(app, SimpleNamespace(found_docs={"a"}),
                                              set(), set(), set()) == []


def test_a_contradiction_fails_the_build_naming_both_pages(ledger_ext, tmp_path,
                                                           monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    claims.Ledger("plot_a").claim("model.params", 1, "parameters")
    claims.Ledger("pages/b").claim("model.params", 1, "parameters")
    app = SimpleNamespace(builder=SimpleNamespace(format="text"))  # no HTML: no files, no scan
    ledger_ext._check(app, None)  # they agree
    claims.Ledger("plot_c").claim("model.params", 2, "parameters")
    ledger_ext._check(app, RuntimeError("the build already failed"))  # not checked then
    with pytest.raises(ExtensionError, match=r"(?s)contradicts itself.*'model\.params'.*"
                                             r"page '(plot_a|pages/b)' says 1.*'plot_c' says 2") as info:
        ledger_ext._check(app, None)
    assert type(info.value) is ExtensionError


def test_setup_registers_the_config_values_and_the_hooks(ledger_ext) -> None:
    calls = []
    app = SimpleNamespace(add_config_value=lambda *a: calls.append(("config", *a)),
                          add_node=lambda *a: calls.append(("node", *a)),
                          add_role=lambda *a: calls.append(("role", *a)),
                          connect=lambda *a: calls.append(("connect", *a)))
    assert ledger_ext.setup(app) == {"parallel_read_safe": False, "parallel_write_safe": True}
    assert calls == [("config", "ledger_dir", "", "env"),
                     ("config", "ledger_page", "pages/ledger", "env"),
                     ("config", "ledger_scan", "report", ""),
                     ("node", ledger_ext.claim_ref),
                     ("role", "claim", ledger_ext._claim_role),
                     ("connect", "doctree-resolved", ledger_ext._resolve_claims),
                     ("connect", "config-inited", ledger_ext._configure),
                     ("connect", "env-before-read-docs", ledger_ext._ledger_last),
                     ("connect", "env-get-outdated", ledger_ext._ledger_always_outdated),
                     ("connect", "build-finished", ledger_ext._check)]
