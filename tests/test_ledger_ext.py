"""docs/ledger_ext.py at config time: which ledger records survive (no Sphinx build, a fake app).

A record file is named for its page with ``/`` spelled ``__`` (``pages/x`` -> ``pages__x.jsonl``,
:class:`guide.claims.Ledger`); the extension must map the stem back to ``pages/x`` to find the
page. Dropping the records of pages under ``docs/pages/`` would let an incremental build's cached
page contradict an example silently.
"""

from __future__ import annotations

import importlib
import json
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
        claims.Ledger(page).add_table(f"{page}.t", ["a"], [])  # and its tables' file
    assert len(list(ledger.glob("*.jsonl"))) == 5
    assert len(list(ledger.glob(f"*{claims.TABLES_SUFFIX}"))) == 5
    app = SimpleNamespace(outdir=str(tmp_path / "out"), srcdir=str(src))
    config = SimpleNamespace(ledger_dir=str(ledger),
                             sphinx_gallery_conf={"examples_dirs": str(gallery)})
    ledger_ext._configure(app, config)
    assert sorted(p.name for p in ledger.glob("*.jsonl")) == \
        ["pages__x.jsonl", "plot_y.jsonl", "top.jsonl"]
    assert sorted(p.name for p in ledger.glob(f"*{claims.TABLES_SUFFIX}")) == \
        [f"pages__x{claims.TABLES_SUFFIX}", f"plot_y{claims.TABLES_SUFFIX}",
         f"top{claims.TABLES_SUFFIX}"]
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
                     ("config", "ledger_claim_hint", "", ""),
                     ("node", ledger_ext.claim_ref),
                     ("role", "claim", ledger_ext._claim_role),
                     ("connect", "doctree-resolved", ledger_ext._resolve_claims),
                     ("connect", "config-inited", ledger_ext._configure),
                     ("connect", "env-before-read-docs", ledger_ext._ledger_last),
                     ("connect", "env-get-outdated", ledger_ext._ledger_always_outdated),
                     ("connect", "build-finished", ledger_ext._check)]


# -- the claim role, the ledger files and the build-finished check (issue 38) ----------------------

def _doc(*refs):
    """A doctree whose one paragraph holds ``refs`` (claim_ref nodes, as the role makes them)."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    doc = new_document("<test>", get_default_settings(Parser))
    para = nodes.paragraph()
    para.extend(refs)
    doc.append(para)
    return doc


def _role(ledger_ext, text: str):
    reporter = SimpleNamespace(error=lambda msg, line: ("error", msg, line))
    inliner = SimpleNamespace(reporter=reporter,
                              problematic=lambda raw, text, msg: ("bad", raw, text, msg))
    return ledger_ext._claim_role("claim", f":claim:`{text}`", text, 7, inliner)


def test_the_claim_role_reads_a_name_and_an_optional_unit(ledger_ext) -> None:
    (node,), msgs = _role(ledger_ext, "  m.peak  ")
    assert msgs == [] and isinstance(node, ledger_ext.claim_ref)
    assert (node["claim"], node["with_unit"], node["unit_as_written"]) == ("m.peak", False, None)
    assert node.rawsource == ":claim:`  m.peak  `" and node.astext() == "m.peak"
    (node,), _ = _role(ledger_ext, "m.peak <unit>")
    assert (node["claim"], node["with_unit"], node["unit_as_written"]) == ("m.peak", True, None)
    (node,), _ = _role(ledger_ext, "m.peak <MiB>")
    assert (node["claim"], node["with_unit"], node["unit_as_written"]) == ("m.peak", True, "MiB")
    (bad,), (msg,) = _role(ledger_ext, "two names")
    assert bad == ("bad", ":claim:`two names`", ":claim:`two names`", msg)
    assert msg[0] == "error" and msg[2] == 7
    assert msg[1] == ("claim role 'two names': write :claim:`name` or :claim:`name <unit>`.")


def _cite(ledger_ext, tmp_path, monkeypatch, docname: str, *refs, hint: str = ""):
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    doc = _doc(*refs)
    app = SimpleNamespace(config=SimpleNamespace(ledger_claim_hint=hint))
    ledger_ext._resolve_claims(app, doc, docname)
    found = list(doc.findall(lambda n: n.tagname == "abbreviation"))
    assert all(a.rawsource == a.astext() for a in found)
    assert not list(doc.findall(ledger_ext.claim_ref))  # every role resolved
    return [(a.astext(), a["explanation"], a["classes"]) for a in found]


def _ref(ledger_ext, name: str, unit: str | None = None):
    node = ledger_ext.claim_ref(f":claim:`{name}`", name)
    node["claim"], node["with_unit"], node["unit_as_written"] = name, unit is not None, \
        None if unit in (None, "unit") else unit
    return node


def test_the_claim_role_cites_the_citing_pages_own_record(ledger_ext, tmp_path,
                                                          monkeypatch) -> None:
    """Two pages record one value, shown and guarded differently: each page's role states its own
    record (the audit's bug cited the first page's for every page); a page without one states the
    first page's (records load in file-name order)."""
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    claims.Ledger("pages/a").claim("m.peak", 1314.0, "GiB", fmt=",.0f")
    claims.Ledger("plot_b").claim("m.peak", 1314.0, "GiB", fmt=".1f", guard="cited: a sheet")
    cite = lambda doc, *names: _cite(ledger_ext, tmp_path, monkeypatch, doc,
                                     *(_ref(ledger_ext, *n) for n in names))
    assert cite("auto_examples/plot_b", ("m.peak",), ("m.peak", "unit")) == [
        ("1314.0", "m.peak: cited: a sheet", ["claim"]),
        ("1314.0 GiB", "m.peak: cited: a sheet", ["claim"])]
    assert cite("pages/a", ("m.peak", "GiB")) == [("1,314 GiB", "m.peak: computed", ["claim"])]
    assert cite("index", ("m.peak",)) == [("1,314", "m.peak: computed", ["claim"])]
    assert cite("index") == []  # no role: nothing loaded, nothing changed


def test_the_claim_role_refuses_an_unknown_name_and_another_unit(ledger_ext, tmp_path,
                                                                 monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    claims.Ledger("plot_b").claim("m.peak", 2.5, "GiB")
    claims.Ledger("plot_c").claim("m.none", 3, "")
    with pytest.raises(ExtensionError) as err:
        _cite(ledger_ext, tmp_path, monkeypatch, "pages/x", _ref(ledger_ext, "m.nope"))
    assert str(err.value) == (
        "page 'pages/x': claim 'm.nope' (claim role) is not in the ledger: no page recorded it in "
        "this build. Record it (ledger.claim / ledger.record) on a page that runs, or fix the name.")
    with pytest.raises(ExtensionError) as err:  # the one-page site adds how to build the other
        _cite(ledger_ext, tmp_path, monkeypatch, "pages/x", _ref(ledger_ext, "m.nope"),
              hint=" Build the page that records it too.")
    assert str(err.value).endswith("or fix the name. Build the page that records it too.")
    with pytest.raises(ExtensionError) as err:
        _cite(ledger_ext, tmp_path, monkeypatch, "pages/x", _ref(ledger_ext, "m.peak", "MiB"))
    assert str(err.value) == ("page 'pages/x': claim 'm.peak' is in 'GiB', the claim role says "
                              "<MiB>: write :claim:`m.peak <GiB>` (or <unit>).")
    # a unitless claim with <unit> appends nothing
    assert _cite(ledger_ext, tmp_path, monkeypatch, "x", _ref(ledger_ext, "m.none", "unit")) == [
        ("3", "m.none: computed", ["claim"])]


def _record(value, shown="", page="plot_a", name="m.x"):
    return claims.Claim(name, value, "GiB", page, (("world_size", "2"),), "cited: a sheet", shown)


def test_the_ledger_files_hold_every_field_and_the_shown_text(ledger_ext, tmp_path) -> None:
    """``shown`` is the text the page states, also for a record made without a format (the
    audit's bug left the column empty then)."""
    import csv
    import json

    records = [_record(7559.6, "7,560"), _record(217_728, page="pages/b", name="m.y")]
    ledger_ext._ledger_files(tmp_path, records)
    rows = json.loads((tmp_path / "ledger.json").read_text())
    assert rows == [
        {"page": "plot_a", "name": "m.x", "value": 7559.6, "shown": "7,560", "unit": "GiB",
         "kind": "cited", "check": "a sheet", "guard": "cited: a sheet",
         "assumptions": {"world_size": "2"}},
        {"page": "pages/b", "name": "m.y", "value": 217_728, "shown": "217,728", "unit": "GiB",
         "kind": "cited", "check": "a sheet", "guard": "cited: a sheet",
         "assumptions": {"world_size": "2"}}]
    table = list(csv.DictReader((tmp_path / "ledger.csv").open()))
    assert [r["shown"] for r in table] == ["7,560", "217,728"]
    assert table[0] == {"page": "plot_a", "name": "m.x", "value": "7559.6", "shown": "7,560",
                        "unit": "GiB", "kind": "cited", "check": "a sheet",
                        "guard": "cited: a sheet", "assumptions": '{"world_size": "2"}'}
    ledger_ext._ledger_files(tmp_path, [_record(1.0, "1.0×")])
    assert "1.0×" in (tmp_path / "ledger.json").read_text()  # not escaped
    ledger_ext._ledger_files(tmp_path, [])
    assert (tmp_path / "ledger.json").read_text() == "[]"
    assert (tmp_path / "ledger.csv").read_text().splitlines() == ["name"]


def _html_app(tmp_path, scan: str):
    out = tmp_path / "site" / "html"
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(out),
                           config=SimpleNamespace(ledger_scan=scan)), out


def _page(out, rel: str, body: str) -> None:
    path = out / f"{rel}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<article>{body}</article>")


def test_a_strict_check_fails_naming_each_unrecorded_number(ledger_ext, tmp_path,
                                                            monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "ledger"))
    claims.Ledger("plot_a").claim("m.x", 1.25, "GiB")
    app, out = _html_app(tmp_path, "strict")
    _page(out, "auto_examples/plot_a", "<p>peak 1.25 GiB, then 9.87 GiB</p>")
    with pytest.raises(ExtensionError) as err:
        ledger_ext._check(app, None)
    assert str(err.value) == (
        "[ledger scan] printed numbers missing from the ledger (record them, or see the "
        "exemptions in guide.rendered):\n- plot_a: 9.87 (in 'peak 1.25 GiB, then 9.87 GiB')")
    assert type(err.value) is ExtensionError
    assert (out / "ledger.json").exists() and (out / "ledger.csv").exists()
    report = json.loads((tmp_path / "site" / "unrecorded.json").read_text())
    assert report["total"] == 1
    _page(out, "auto_examples/plot_a", "<p>peak 1.25 GiB</p>")
    ledger_ext._check(app, None)  # recorded: passes


def test_a_strict_check_lists_at_most_200_numbers(ledger_ext, tmp_path, monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "ledger"))
    claims.Ledger("plot_a").claim("m.x", 1.25, "GiB")
    app, out = _html_app(tmp_path, "strict")
    _page(out, "auto_examples/plot_a", "".join(f"<p>{i}.5</p>" for i in range(201)))
    with pytest.raises(ExtensionError) as err:
        ledger_ext._check(app, None)
    lines = str(err.value).splitlines()
    assert len(lines) == 201 and lines[-1].startswith("- plot_a: 199.5")


def test_a_report_check_logs_and_an_off_check_does_not_scan(ledger_ext, tmp_path,
                                                            monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "ledger"))
    claims.Ledger("plot_a").claim("m.x", 1.25, "GiB")
    logged = []
    monkeypatch.setattr(ledger_ext.logger, "info", logged.append)
    app, out = _html_app(tmp_path, "report")
    _page(out, "auto_examples/plot_a", "<p>9.87 GiB</p>")
    ledger_ext._check(app, None)
    report = tmp_path / "site" / "unrecorded.json"
    assert logged == [f"[ledger scan] 1 printed numbers on 1 pages are not in the ledger "
                      f"(most: plot_a 1); see {report}"]
    report.unlink()
    app.config.ledger_scan = "off"
    ledger_ext._check(app, None)
    assert not report.exists() and len(logged) == 1 and (out / "ledger.json").exists()
    app.config.ledger_scan = "loud"
    with pytest.raises(ExtensionError) as err:
        ledger_ext._check(app, None)
    assert str(err.value) == "ledger_scan = 'loud': use 'report', 'strict' or 'off'."


def test_a_recorded_table_missing_from_its_page_fails_whatever_the_scan(ledger_ext, tmp_path,
                                                                        monkeypatch) -> None:
    from sphinx.errors import ExtensionError

    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path / "ledger"))
    ledger = claims.Ledger("plot_a")
    ledger.claim("m.x", 1.25, "GiB")
    ledger.add_table("m.t", ["n"], [["1.25"]])
    ledger.add_table("m.u", ["n"], [])
    app, out = _html_app(tmp_path, "off")
    _page(out, "auto_examples/plot_a", "<p>1.25</p>")
    with pytest.raises(ExtensionError) as err:
        ledger_ext._check(app, None)
    why = ("is recorded but not on the rendered page (shown with report.show? a table printed as "
           "text does not count)")
    assert str(err.value) == ("[ledger] recorded tables missing from their rendered pages:\n"
                              f"- plot_a: table 'm.t' {why}\n- plot_a: table 'm.u' {why}")
    _page(out, "auto_examples/plot_a", "<table><tr><th>n</th></tr></table>")
    with pytest.raises(ExtensionError, match=r"- plot_a: table 'm\.t' is on the rendered page "
                                             r"with other cells than the ones recorded$"):
        ledger_ext._check(app, None)
    _page(out, "auto_examples/plot_a", "<table><tr><th>n</th></tr><tr><td>1.25</td></tr></table>"
                                       "<table><tr><th>n</th></tr></table>")
    ledger_ext._check(app, None)
