"""The browser calculator's stamp: the widget in docs/_static carries the current Python model's
data and source hash, and a stale one fails, naming the fix."""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import re
import sys
import types
from pathlib import Path

import pytest

from guide.memory import widget

#: The stamp in a widget's DATA block.
STAMP = re.compile(r'"source_hash": "([0-9a-f]{12})"')
#: What a stale widget's message asks for, after the two stamps.
FIX = ("update docs/_static/memory_widget.js's port of guide.memory.fit if a formula changed, run "
       "`python -m guide.memory.widget` to stamp it, and rerun `nox -s browser` "
       "(tests/test_calculator_widget.py) to prove it equal to the Python model.")


def _stale(sources: str, checked: str) -> str:
    return (f"the Python memory model changed (sources {sources}, the widget was checked against "
            f"{checked}): {FIX}")


@pytest.fixture
def committed_stamp(monkeypatch) -> str:
    """The committed widget's stamp, made the model's: the tests that take it hold in mutmut's
    copy too, whose rewritten sources hash to another stamp (the one test of the real stamp,
    test_the_committed_widget_is_current, is deselected there)."""
    stamps = STAMP.findall(widget.WIDGET_JS.read_text())
    assert len(stamps) == 1, f"{widget.WIDGET_JS} has {len(stamps)} stamps, not one"
    monkeypatch.setattr(widget, "source_hash", lambda: stamps[0])
    return stamps[0]


@pytest.fixture
def widget_copy(tmp_path, monkeypatch, committed_stamp) -> Path:
    """A copy of the committed widget, which the command reads and stamps by default (no
    ``--path``); ``sys.argv`` is bare, so a command that parsed it instead of its arguments would
    stamp the copy, not check it."""
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text())
    monkeypatch.setattr(widget, "WIDGET_JS", js)
    monkeypatch.setattr(sys, "argv", ["python -m guide.memory.widget"])
    return js


def test_the_committed_widget_is_current():
    assert widget.check() == widget.source_hash()
    assert widget.main(["--check"]) == 0


def _data_text(js: str) -> str:
    return js[js.index("const DATA = ") + len("const DATA = "):js.index(";\n  // DATA-END")]


def test_the_committed_block_is_the_models_data_byte_for_byte(committed_stamp):
    """The committed DATA block, stamp aside, is data() as _block writes it (sorted keys, one
    space an indent level, indented into the script): rendering it again gives the file back."""
    js = widget.WIDGET_JS.read_text()
    assert json.loads(_data_text(js)) == widget.data()  # value by value (pytest shows which)
    assert widget.render(js) == js  # and the text: ints stay ints, keys sorted, indents
    assert widget.check() == committed_stamp


def test_the_stamp_is_12_hex_digits_of_sha256_over_the_hashed_sources():
    expected = hashlib.sha256("".join(widget.hashed_sources().values()).encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{12}", widget.source_hash())
    assert widget.source_hash() == expected[:12]


def test_a_checkout_with_crlf_line_endings_hashes_as_one_with_lf(monkeypatch, tmp_path):
    text = Path(widget.MIRRORED[0].__file__).read_text()
    assert "\r" not in text and text.count("\n") > 10
    hashed = []
    for name, ending in (("lf.py", b"\n"), ("crlf.py", b"\r\n")):
        path = tmp_path / name
        path.write_bytes(text.encode().replace(b"\n", ending))
        module = types.SimpleNamespace(__name__="mirrored", __file__=str(path))
        monkeypatch.setattr(widget, "MIRRORED", (module,))
        hashed.append(widget.hashed_sources()["mirrored"])
    assert hashed == [text, text]


def test_a_changed_model_makes_the_widget_stale(committed_stamp, monkeypatch, tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text())
    assert widget.check(js) == committed_stamp
    monkeypatch.setattr(widget, "source_hash", lambda: "0123456789ab")  # a formula changed
    with pytest.raises(widget.StaleWidget) as err:
        widget.check(js)
    assert str(err.value) == _stale("0123456789ab", committed_stamp)


def test_a_widget_without_a_stamp_is_stale_against_nothing(committed_stamp, tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text().replace(f'"{committed_stamp}"', "null"))
    with pytest.raises(widget.StaleWidget) as err:
        widget.check(js)
    assert str(err.value) == _stale(committed_stamp, "nothing")


def test_changed_data_makes_the_widget_stale(committed_stamp, tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text(widget.WIDGET_JS.read_text().replace('"sbh": 34', '"sbh": 35'))
    with pytest.raises(widget.StaleWidget) as err:
        widget.check(js)
    assert str(err.value) == _stale(committed_stamp, committed_stamp)  # the data, not the stamp


def test_a_missing_widget_is_refused_naming_its_path(tmp_path):
    missing = tmp_path / "memory_widget.js"
    with pytest.raises(widget.StaleWidget) as err:
        widget.check(missing)
    assert str(err.value) == f"no browser calculator at {missing}."


def test_a_widget_without_its_data_block_is_refused(tmp_path):
    js = tmp_path / "memory_widget.js"
    js.write_text("// nothing here\n")
    with pytest.raises(ValueError, match="no single // DATA-BEGIN"):
        widget.check(js)


def test_the_command_checks_then_stamps_the_widget(widget_copy, committed_stamp, monkeypatch,
                                                   capsys):
    committed = widget_copy.read_text()
    assert widget.main(["--check"]) == 0
    assert capsys.readouterr() == (f"widget current: model sources {committed_stamp}\n", "")
    monkeypatch.setattr(widget, "source_hash", lambda: "0123456789ab")  # a formula changed
    assert widget.main(["--check"]) == 1
    assert capsys.readouterr() == ("", f"error: {_stale('0123456789ab', committed_stamp)}\n")
    assert widget_copy.read_text() == committed  # checking writes nothing
    assert widget.main([]) == 0
    assert capsys.readouterr() == (f"stamped {widget_copy} with model sources 0123456789ab\n",
                                   "")
    assert widget_copy.read_text() == committed.replace(committed_stamp, "0123456789ab")
    assert widget.main(["--check"]) == 0  # current again
    assert capsys.readouterr().out == "widget current: model sources 0123456789ab\n"


def test_the_command_checks_and_stamps_the_file_its_path_names(widget_copy, committed_stamp,
                                                               tmp_path, capsys):
    other = tmp_path / "other.js"
    other.write_text(widget_copy.read_text().replace('"sbh": 34', '"sbh": 35'))
    assert widget.main(["--check", "--path", str(other)]) == 1
    assert capsys.readouterr().err == f"error: {_stale(committed_stamp, committed_stamp)}\n"
    assert widget.main(["--path", str(other)]) == 0
    assert capsys.readouterr().out == f"stamped {other} with model sources {committed_stamp}\n"
    assert other.read_text() == widget_copy.read_text()  # the data is back; the copy untouched
    assert widget.main(["--check", "--path", str(other)]) == 0


def test_the_commands_help_names_it_and_says_what_it_does(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at the terminal's width: no wrapping
    with pytest.raises(SystemExit) as exit_:
        widget.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m guide.memory.widget [-h] [--check] [--path PATH]\n")
    assert " ".join(widget.__doc__.split()) in " ".join(out.split())
    assert re.search(r"^  --check +only check; exit 1 if stale$", out, re.M)
    assert re.search(r"^  --path PATH$", out, re.M)


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
