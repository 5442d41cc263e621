"""The one-page site (``nox -s page -- plot_x``, ``GUIDE_ONLY=plot_x``; docs/one_page.py): a bad
name fails at once naming the choices, the gallery patterns select exactly the named example, a
link to a page not built renders as text while a broken link still fails, the named page re-runs
on every build, and the full build (no ``GUIDE_ONLY``) keeps its settings and its re-run on a
change to ``guide``.

One test really builds a one-page site (the template, with links planted to pages it does not
build) with sphinx-build, in a copy of docs/: about 10 s on two quiet cores.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT
from docutils import nodes
from sphinx import addnodes

DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
import one_page  # noqa: E402

TEMPLATE = "plot_page_template"
ALL = sorted(p.stem for p in EXAMPLES.glob("plot_*.py"))
#: The gallery settings of docs/conf.py that the one-page site narrows.
FULL = {"filename_pattern": r"/plot_", "ignore_pattern": r"__init__\.py|/_"}


def test_a_bad_name_fails_naming_every_choice() -> None:
    for bad in ("plot_nope", "plot_page_templat", "plot_page_template,plot_nope", "", " , "):
        with pytest.raises(ValueError) as err:
            one_page.pages(bad)
        assert all(name in str(err.value) for name in ALL), str(err.value)
    with pytest.raises(ValueError, match="nox -s page -- plot_nope: no example 'plot_nope'"):
        one_page.pages("plot_nope", asked="nox -s page -- plot_nope")


def test_a_name_may_be_written_as_a_file_and_several_are_kept_in_order_once() -> None:
    assert one_page.pages("examples/plot_page_template.py") == (TEMPLATE,)
    assert one_page.pages(f"{TEMPLATE}, plot_pitfalls,{TEMPLATE}") == (TEMPLATE, "plot_pitfalls")


@pytest.mark.parametrize("stem", ALL)
def test_the_gallery_patterns_select_exactly_the_named_example(stem: str) -> None:
    conf = one_page.gallery_conf(FULL, (stem,))
    assert one_page.selected(conf) == [stem]
    # Each pattern alone, too: only the named file is rendered, and only it would run.
    assert [p.stem for p in sorted(EXAMPLES.iterdir())
            if re.search(conf["filename_pattern"], str(p))] == [stem]
    assert conf["download_all_examples"] is False
    # sphinx-gallery's own collection of the examples folder (its ignore_pattern) agrees.
    from sphinx_gallery.utils import _collect_gallery_files

    sg_conf = {**conf, "example_extensions": {".py"}, "source_suffix": {".rst": "restructuredtext"}}
    collected = _collect_gallery_files([str(EXAMPLES)], sg_conf)
    assert [Path(f).stem for f in collected] == [stem]


def test_two_named_examples_select_those_two_and_the_full_patterns_select_all() -> None:
    assert one_page.selected(one_page.gallery_conf(FULL, ("plot_pitfalls", TEMPLATE))) == \
        sorted(["plot_pitfalls", TEMPLATE])
    assert one_page.selected(FULL) == ALL  # the reference: nothing else narrows the full build


def test_only_the_named_pages_are_read_and_the_first_is_the_root() -> None:
    assert one_page.include_patterns((TEMPLATE, "plot_pitfalls")) == [
        f"auto_examples/{TEMPLATE}.rst", "auto_examples/plot_pitfalls.rst"]
    assert one_page.root_doc((TEMPLATE, "plot_pitfalls")) == f"auto_examples/{TEMPLATE}"
    assert f"nox -s page -- {TEMPLATE} plot_other" in one_page.claim_hint((TEMPLATE,))


def _xref(reftype: str, target: str, refdoc: str = f"auto_examples/{TEMPLATE}",
          domain: str = "std") -> addnodes.pending_xref:
    return addnodes.pending_xref("", refdomain=domain, reftype=reftype, reftarget=target,
                                 refdoc=refdoc)


@pytest.mark.parametrize("reftype, target, page", [
    ("doc", "../pages/install", "pages/install"),
    ("doc", "/pages/ledger", "pages/ledger"),
    ("doc", "plot_communication", "auto_examples/plot_communication"),
    ("doc", "index", "auto_examples/index"),
    ("ref", "sphx_glr_auto_examples_plot_checkpoint.py", "auto_examples/plot_checkpoint"),
    ("ref", "whenbreaks-order", "auto_examples/plot_when_fsdp2_breaks"),
    ("ref", "pitfalls-other-method", "auto_examples/plot_pitfalls"),
    # broken in the full site too: still a warning, so -W still fails the one-page build
    ("doc", "../pages/no_such_page", None),
    ("doc", "plot_no_such_example", None),
    ("ref", "sphx_glr_auto_examples_plot_no_such_example.py", None),
    ("ref", "no-such-label", None),
])
def test_a_link_to_a_page_not_built_is_told_from_a_broken_link(reftype: str, target: str,
                                                             page: str | None) -> None:
    assert one_page.unbuilt_target(_xref(reftype, target)) == page


def test_a_link_to_a_page_not_built_renders_as_its_text_and_a_broken_one_is_left_to_sphinx(
) -> None:
    text = nodes.inline("", "the install page")
    node = one_page.resolve_unbuilt(_xref("doc", "../pages/install"), text)
    assert isinstance(node, nodes.abbreviation) and node.astext() == "the install page"
    assert one_page.NOT_BUILT in node["classes"] and "pages/install" in node["explanation"]
    assert one_page.resolve_unbuilt(_xref("doc", "../pages/nope"), text) is None
    assert one_page.resolve_unbuilt(_xref("func", "guide.launch", domain="py"), text) is None


def test_the_named_pages_rerun_and_are_read_again_on_every_build(tmp_path: Path) -> None:
    gallery = tmp_path / "auto_examples"
    gallery.mkdir()
    for stem in (TEMPLATE, "plot_pitfalls"):
        (gallery / f"{stem}.py.md5").write_text("0" * 32)
    one_page.always_rerun((TEMPLATE,), tmp_path)
    assert sorted(p.name for p in gallery.iterdir()) == ["plot_pitfalls.py.md5"]
    env = type("Env", (), {"found_docs": {f"auto_examples/{TEMPLATE}"}})()
    assert one_page._reread((TEMPLATE,))(None, env, set(), set(), set()) == [
        f"auto_examples/{TEMPLATE}"]


def test_the_one_page_ledger_starts_empty(tmp_path: Path) -> None:
    stale = tmp_path / "ledger" / "plot_pitfalls.jsonl"
    stale.parent.mkdir()
    stale.write_text("{}\n")
    assert one_page.ledger_dir(tmp_path) == tmp_path / "ledger"
    assert list((tmp_path / "ledger").iterdir()) == []


# ------------------------------------------------------------------------------------------------
# docs/conf.py itself, evaluated in a copy of docs/ (its side effects stay in tmp_path).


def _docs_copy(tmp_path: Path, template: str | None = None) -> Path:
    """docs/ copied to ``tmp_path/docs`` and the examples linked beside it (the template replaced
    by ``template`` if given)."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns(
        "_build", "auto_examples", "jupyter_execute", "__pycache__", "_landing_sections.rst"))
    examples = tmp_path / "examples"
    examples.mkdir()
    for path in EXAMPLES.iterdir():
        if path.is_file():
            (examples / path.name).symlink_to(path)
    if template is not None:
        (examples / f"{TEMPLATE}.py").unlink()
        (examples / f"{TEMPLATE}.py").write_text(template)
    return docs


@pytest.fixture
def conf_of(monkeypatch: pytest.MonkeyPatch):
    """``conf_of(docs, only)``: the namespace of ``docs/conf.py`` evaluated with ``GUIDE_ONLY``
    set to ``only`` (unset if None); the modules it imports from its folder are its own."""
    saved = {name: sys.modules.pop(name) for name in ("one_page", "gallery_order")
             if name in sys.modules}
    monkeypatch.setenv("GUIDE_OFFLINE", "1")

    def evaluate(docs: Path, only: str | None) -> dict:
        if only is None:
            monkeypatch.delenv(one_page.ENV, raising=False)
        else:
            monkeypatch.setenv(one_page.ENV, only)
        for name in ("one_page", "gallery_order"):
            sys.modules.pop(name, None)
        monkeypatch.setattr(sys, "path", list(sys.path))
        return runpy.run_path(str(docs / "conf.py"))

    yield evaluate
    for name in ("one_page", "gallery_order"):
        sys.modules.pop(name, None)
    sys.modules.update(saved)


def test_conf_refuses_a_bad_name_before_anything_else(tmp_path: Path, conf_of) -> None:
    docs = _docs_copy(tmp_path)
    with pytest.raises(RuntimeError, match="no example 'plot_nope'.*plot_page_template"):
        conf_of(docs, "plot_nope")
    assert not (docs / "_landing_sections.rst").exists()  # it stopped before writing anything


def _stale_build(docs: Path) -> Path:
    """An earlier full build's checksums and fingerprint of ``guide`` (the current one)."""
    gallery = docs / "auto_examples"
    gallery.mkdir()
    for stem in (TEMPLATE, "plot_pitfalls"):
        (gallery / f"{stem}.py.md5").write_text("0" * 32)
    return gallery


def test_conf_with_guide_only_builds_that_page_and_always_reruns_it(tmp_path: Path,
                                                                    conf_of) -> None:
    docs = _docs_copy(tmp_path)
    gallery = _stale_build(docs)
    (gallery / ".guide-fingerprint").write_text("an older guide")  # guide changed since
    ns = conf_of(docs, TEMPLATE)
    assert one_page.selected(ns["sphinx_gallery_conf"], tmp_path / "examples") == [TEMPLATE]
    assert ns["include_patterns"] == [f"auto_examples/{TEMPLATE}.rst"]
    assert ns["root_doc"] == f"auto_examples/{TEMPLATE}"
    assert ns["ledger_claim_hint"] and ns["intersphinx_mapping"] == {}
    # Its page re-runs; the full build's pages and fingerprint are left for the full build.
    assert sorted(p.name for p in gallery.glob("*.md5")) == ["plot_pitfalls.py.md5"]
    assert (gallery / ".guide-fingerprint").read_text() == "an older guide"
    ns = conf_of(docs, TEMPLATE)  # and again, guide unchanged or not
    assert not (gallery / f"{TEMPLATE}.py.md5").exists()


def test_conf_without_guide_only_is_the_full_site_rerun_on_a_guide_change(tmp_path: Path,
                                                                          conf_of) -> None:
    docs = _docs_copy(tmp_path)
    gallery = _stale_build(docs)
    (gallery / ".guide-fingerprint").write_text("an older guide")
    ns = conf_of(docs, None)
    assert ns["ONLY"] == () and "include_patterns" not in ns and "root_doc" not in ns
    assert "ledger_claim_hint" not in ns
    assert {k: ns["sphinx_gallery_conf"][k] for k in FULL} == FULL
    assert ns["sphinx_gallery_conf"]["download_all_examples"] is True
    assert ns["ledger_scan"] == "strict"
    assert list(gallery.glob("*.md5")) == []  # guide changed: every page re-runs
    assert (gallery / ".guide-fingerprint").read_text() != "an older guide"


# ------------------------------------------------------------------------------------------------
# A real one-page build.

PLANTED = ("\n   See :doc:`the install page <../pages/install>` and "
           ":ref:`the checkpoint page <sphx_glr_auto_examples_plot_checkpoint.py>`.\n")


def test_a_one_page_site_of_the_template_builds_with_its_checks(tmp_path: Path) -> None:
    """The template, with two links planted to pages the one-page site does not build, passes
    ``-W --keep-going``: the links render as text; the page's ledger, claim role, strict scan and
    recorded table are checked, and nothing else is built."""
    source = (EXAMPLES / f"{TEMPLATE}.py").read_text()
    anchor = "elements apart).\n"
    assert anchor in source
    docs = _docs_copy(tmp_path, source.replace(anchor, anchor.rstrip("\n") + PLANTED, 1))
    out = tmp_path / "page"
    env = {**os.environ, "GUIDE_ONLY": TEMPLATE, "GUIDE_OFFLINE": "1", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
               [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
                          "-d", str(out / "doctrees"), str(docs), str(out / "html")],
                         capture_output=True, text=True, env=env, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    html = out / "html"
    built = sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                   if p.parent.name != "_static")  # the theme's and the site's static files
    assert built == [f"auto_examples/{TEMPLATE}.html", "genindex.html", "search.html"]
    page = (html / "auto_examples" / f"{TEMPLATE}.html").read_text()
    assert re.search(r'<abbr class="not-built" title="pages/install: [^"]*">the install page', page)
    assert 'class="not-built" title="auto_examples/plot_checkpoint' in page
    assert 'class="claim"' in page  # the claim role resolved from this run's ledger
    assert (out / "doctrees" / "ledger" / f"{TEMPLATE}.jsonl").is_file()  # its own ledger
    records = json.loads((html / "ledger.json").read_text())
    assert records and {r["page"] for r in records} == {TEMPLATE}
    assert "[ledger scan] 0 printed numbers on 0 pages" in log
    assert "executed 1 out of 1 file" in log
    assert json.loads((out / "unrecorded.json").read_text())["total"] == 0
    print(f"one-page build of the template: {time.monotonic() - started:.1f} s")
