"""The browser calculator's stamp: the widget in docs/_static carries the current Python model's
data and source hash, and a stale one fails, naming the fix."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from guide.memory import widget


def test_the_committed_widget_is_current():
    assert widget.check() == widget.source_hash()
    assert widget.main(["--check"]) == 0


def test_a_changed_model_makes_the_widget_stale(monkeypatch, tmp_path, capsys):
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text())
    assert widget.check(js)
    monkeypatch.setattr(widget, "source_hash", lambda: "0123456789ab")  # a formula changed
    with pytest.raises(widget.StaleWidget, match=r"the Python memory model changed .*: update "
                       r"docs/_static/memory_widget.js's port .* run `python -m "
                       r"guide.memory.widget` .* rerun `nox -s browser`"):
        widget.check(js)
    assert widget.main(["--check", "--path", str(js)]) == 1
    assert "the Python memory model changed" in capsys.readouterr().err
    assert widget.main(["--path", str(js)]) == 0  # stamping makes it current again
    assert widget.check(js) == "0123456789ab"


def test_changed_data_makes_the_widget_stale(tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text().replace('"sbh": 34', '"sbh": 35'))
    with pytest.raises(widget.StaleWidget, match="the Python memory model changed"):
        widget.check(js)


def test_a_widget_without_its_data_block_is_refused(tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text("// nothing here\n")
    with pytest.raises(ValueError, match="no single // DATA-BEGIN"):
        widget.check(js)


#: What the widget ports: fit_report, LoRA, CPU offload, the input checks and the display.
ROOTS = ("guide.memory.fit", "guide.memory.finetune", "guide.memory.offload",
         "guide.memory.inputs", "guide.memory.display")


def _imports(module) -> set[tuple[str, str]]:
    """(module, name) for each ``from guide... import name`` and ``import guide...`` of a
    module's source, read from its syntax tree (not from what happens to be loaded)."""
    tree = ast.parse(Path(module.__file__).read_text())
    out: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("guide"):
            out |= {(node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {(a.name, "") for a in node.names if a.name.startswith("guide")}
    return out


def test_every_source_the_model_imports_is_hashed():
    """Follow the imports of every mirrored module: each guide.memory module reached is hashed
    whole (fit.py was once left out), and each name from elsewhere is accounted for in OUTSIDE
    (its source hashed, its values in the DATA block, or named as not ported)."""
    hashed = {m.__name__ for m in widget.MIRRORED}
    # what the widget ports: fit_report, LoRA, CPU offload, the input checks, the display
    seen, todo, outside = set(), list(ROOTS), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in hashed, f"the widget mirrors {name}, which its stamp does not hash: add " \
            "it to guide.memory.widget.MIRRORED"
        for imported, attr in _imports(importlib.import_module(name)):
            if imported.startswith("guide.memory."):
                todo.append(imported)
            elif imported != "guide.memory":
                outside.add(f"{imported}.{attr}")
    missing = outside - set(widget.OUTSIDE)
    assert not missing, f"the mirrored modules import {sorted(missing)} from outside " \
        "guide.memory: say in guide.memory.widget.OUTSIDE how the stamp covers each"
    sources = widget.hashed_sources()
    assert set(sources) == hashed | {k for k, v in widget.OUTSIDE.items() if v == "source"}


def _reached(roots) -> set[str]:
    """The guide.memory modules ``roots`` are and import, followed to the end."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [m for m, _ in _imports(importlib.import_module(name))
                     if m.startswith("guide.memory.")]
    return seen


def test_every_model_module_the_command_uses_is_followed():
    """The widget ports every model input of guide-memory (tests/memory/test_widget_js.py
    checks its options), so each guide.memory module cli.py imports is a root of the walk above
    or reached from one: a module the command gains (as offload.py came with --cpu-offload)
    cannot stay out of the stamp."""
    from guide.memory import cli

    used = {m for m, _ in _imports(cli) if m.startswith("guide.memory.")}
    assert "guide.memory.offload" in used and "guide.memory.offload" in ROOTS
    left = used - _reached(ROOTS)
    assert not left, f"guide-memory uses {sorted(left)}, which the stamp test does not follow: " \
        "add it to ROOTS (and to guide.memory.widget.MIRRORED)"
    assert "guide.memory.offload" not in _reached(set(ROOTS) - {"guide.memory.offload"})


def test_the_hash_changes_with_each_hashed_source(monkeypatch):
    """Each source counts: change any one and the stamp changes."""
    before = widget.source_hash()
    texts = widget.hashed_sources()
    for name in texts:
        changed = {**texts, name: texts[name] + "\n# changed\n"}
        monkeypatch.setattr(widget, "hashed_sources", lambda c=changed: c)
        assert widget.source_hash() != before, name
    monkeypatch.undo()
    assert widget.source_hash() == before


def test_a_module_left_out_of_the_stamp_is_caught(monkeypatch):
    """The guard above fails when fit.py is dropped from MIRRORED (what happened once)."""
    for name in ("guide.memory.fit", "guide.memory.offload"):
        monkeypatch.setattr(widget, "MIRRORED",
                            tuple(m for m in widget.MIRRORED if m.__name__ != name))
        with pytest.raises(AssertionError, match=name):
            test_every_source_the_model_imports_is_hashed()
        monkeypatch.undo()
    outside = {k: v for k, v in widget.OUTSIDE.items() if k != "guide.layout.chunk_sizes"}
    monkeypatch.setattr(widget, "OUTSIDE", outside)
    with pytest.raises(AssertionError, match="guide.layout.chunk_sizes"):
        test_every_source_the_model_imports_is_hashed()
