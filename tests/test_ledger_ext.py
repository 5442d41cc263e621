"""docs/ledger_ext.py at config time: which ledger records survive (no Sphinx build, a fake app).

A record file is named for its page with ``/`` spelled ``__`` (``pages/x`` -> ``pages__x.jsonl``,
:class:`guide.claims.Ledger`); the extension must map the stem back to ``pages/x`` to find the
page. Dropping the records of pages under ``docs/pages/`` would let an incremental build's cached
page contradict an example silently.
"""

from __future__ import annotations

import importlib
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
