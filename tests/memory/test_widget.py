"""The browser calculator's stamp: the widget in docs/_static carries the current Python model's
data and source hash, and a stale one fails, naming the fix."""

from __future__ import annotations

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
