"""docs/world_sizes_ext.py builds: the ``world-sizes`` directive in a throwaway Sphinx project
lists every example under the exact sizes it declares (two examples share a line only if they
support the same sizes, not merely the same default), each restricted one with its reason, and
each generated page states its sizes under its title.

The extension is imported as ``docs.world_sizes_ext`` (the name the mutation session knows it by;
the site's conf.py loads the same file as ``world_sizes_ext``).
"""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: stem -> the declaration its example makes. b and c share a default (4), not their sizes.
EXAMPLES = {
    "plot_a": "guide.world_size(2, supports=(1, 2, 4, 8))",
    "plot_b": 'guide.world_size(4, supports=(4, 8), why="needs a 2-D mesh")',
    "plot_c": 'guide.world_size(4, supports=(4,), why="one size, by design")',
    "plot_d": "guide.world_size(1, supports=(1, 2, 4, 8))",
}


@pytest.fixture
def ext(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    module = importlib.import_module("docs.world_sizes_ext")
    assert Path(module.__file__) == ROOT / "docs" / "world_sizes_ext.py"
    yield module
    for name in ("docs.world_sizes_ext", "docs"):
        sys.modules.pop(name, None)


def _project(tmp_path: Path, examples: dict[str, str] = EXAMPLES) -> Path:
    """A site with ``index`` (the directive) and one generated-looking page per example, its
    gallery at the extension's default place (``../examples`` from the docs)."""
    src, gallery = tmp_path / "src", tmp_path / "examples"
    (src / "auto_examples").mkdir(parents=True)
    gallery.mkdir()
    for stem, call in examples.items():
        (gallery / f"{stem}.py").write_text(f'"""{stem}"""\nimport guide\nN = {call}\n')
        title = f"Page {stem}"
        (src / "auto_examples" / f"{stem}.rst").write_text(
            f".. _sphx_glr_auto_examples_{stem}.py:\n\n{title}\n{'=' * len(title)}\n\nBody.\n")
    (src / "conf.py").write_text("extensions = ['docs.world_sizes_ext']\n")
    (src / "index.rst").write_text(
        "Index\n=====\n\n.. world-sizes::\n\n.. toctree::\n   :glob:\n\n   auto_examples/*\n")
    return src


def _build(src: Path):
    from sphinx.application import Sphinx

    out = src.parent / "out"
    warnings = io.StringIO()
    app = Sphinx(str(src), str(src), str(out), str(src.parent / "doctrees"), "text",
                 status=None, warning=warnings, freshenv=True)
    app.build()
    assert "WARNING" not in warnings.getvalue(), warnings.getvalue()
    return app, out


def test_the_directive_lists_each_example_under_the_sizes_it_declares(ext, tmp_path) -> None:
    app, out = _build(_project(tmp_path))
    index = (out / "index.txt").read_text()
    lines = [line.replace("*", "").strip() for line in index.splitlines() if "ranks:" in line]
    assert lines == [
        "1, 2, 4 and 8 ranks: plot_a, plot_d",
        "4 ranks: plot_c (one size, by design)",
        "4 and 8 ranks: plot_b (needs a 2-D mesh)",
    ], index
    page = (out / "auto_examples" / "plot_b.txt").read_text()
    assert "*World sizes under torchrun: 4 and 8 ranks (needs a 2-D mesh).*" in page
    # an edited declaration rebuilds the list: the index depends on every example's file
    assert {Path(d).name for d in app.env.dependencies["index"]} == \
        {f"{stem}.py" for stem in EXAMPLES}
    assert app.config.world_sizes_examples_dir == "../examples"
    assert app.config._options["world_sizes_examples_dir"].rebuild == "env"  # a new dir rereads
    refs = list(app.env.get_doctree("index").findall(ext.addnodes.pending_xref))
    assert {r["refdoc"] for r in refs} == {"index"} and len(refs) == len(EXAMPLES)


def test_the_list_nodes_link_each_page_and_keep_each_reason(ext) -> None:
    from guide.world_sizes import Contract

    contracts = {"plot_x": Contract(4, (4, 8), "why x"), "plot_y": Contract(4, (4,), "why y"),
                 "plot_z": Contract(2, (2, 4))}
    items = ext.world_sizes_list(contracts, "pages/cluster")
    assert "world-sizes" in items["classes"]
    texts = [item.astext() for item in items.children]
    assert texts == ["2 and 4 ranks: plot_z", "4 ranks: plot_y (why y)",
                     "4 and 8 ranks: plot_x (why x)"]
    paragraphs = [item.children[0] for item in items.children]
    assert all(type(p) is ext.nodes.paragraph for p in paragraphs)
    assert [p.children[0].astext() for p in paragraphs] == \
        ["2 and 4 ranks: ", "4 ranks: ", "4 and 8 ranks: "]  # only the sizes in bold
    assert all(type(p.children[0]) is ext.nodes.strong for p in paragraphs)
    refs = [ref for item in items.children for ref in item.findall(ext.addnodes.pending_xref)]
    assert [(r["reftarget"], r["refdoc"], r["refdomain"], r["reftype"]) for r in refs] == [
        (f"/auto_examples/{stem}", "pages/cluster", "std", "doc")
        for stem in ("plot_z", "plot_y", "plot_x")]
    assert all(r["refexplicit"] and r["refwarn"] for r in refs)


def test_the_biggest_group_comes_first_then_by_sizes(ext) -> None:
    from guide.world_sizes import Contract

    contracts = {"plot_1": Contract(4, (4,)), "plot_2": Contract(2, (2, 4)),
                 "plot_3": Contract(4, (2, 4)), "plot_4": Contract(1, (1,))}
    texts = [item.astext() for item in ext.world_sizes_list(contracts, "index").children]
    assert texts == ["2 and 4 ranks: plot_2, plot_3", "1 ranks: plot_4", "4 ranks: plot_1"]


def test_the_examples_are_read_in_file_name_order_and_an_empty_gallery_is_refused(
        ext, tmp_path) -> None:
    from types import SimpleNamespace

    src = _project(tmp_path, {"plot_b": EXAMPLES["plot_b"], "plot_a": EXAMPLES["plot_a"]})
    (tmp_path / "examples" / "helper.py").write_text("not an example\n")
    app = SimpleNamespace(srcdir=str(src), config=SimpleNamespace(
        world_sizes_examples_dir="../examples"))
    found = ext.contracts(app)
    assert list(found) == ["plot_a", "plot_b"]
    assert found["plot_b"].supports == (4, 8) and found["plot_b"].why == "needs a 2-D mesh"
    empty = tmp_path / "empty"
    empty.mkdir()
    app.config.world_sizes_examples_dir = str(empty)
    with pytest.raises(ValueError, match=rf"^no plot_\*\.py examples in {empty} "
                                         r"\(world_sizes_examples_dir\)$"):
        ext.contracts(app)


def test_the_header_line_goes_under_the_one_title_or_the_page_is_refused(ext) -> None:
    from types import SimpleNamespace

    app = SimpleNamespace(srcdir=str(ROOT / "docs"),
                          config=SimpleNamespace(world_sizes_examples_dir="../examples"))
    title = ".. _sphx_glr_auto_examples_plot_hsdp.py:\n\nHSDP\n====\n"
    page = [title + "\nText.\n"]
    ext._header_line(app, "auto_examples/plot_hsdp", page)
    assert page[0].count(".. rst-class:: world-sizes") == 1
    other = ["Not a gallery page\n==================\n"]
    ext._header_line(app, "pages/cluster", other)
    assert other == ["Not a gallery page\n==================\n"]
    twice = [title + "\n" + title]  # a label repeated further down: the first title only
    ext._header_line(app, "auto_examples/plot_hsdp", twice)
    assert twice[0].count(".. rst-class:: world-sizes") == 1
    assert twice[0].index("world-sizes") < twice[0].rindex("HSDP\n====")
    with pytest.raises(ValueError, match=r"^auto_examples/plot_hsdp: no title found to put "
                                         r"the world-size line under\.$"):
        ext._header_line(app, "auto_examples/plot_hsdp", ["no title here\n"])


def test_setup_registers_the_option_the_directive_and_the_hook_and_is_parallel_safe(ext) -> None:
    from types import SimpleNamespace

    calls = []
    app = SimpleNamespace(add_config_value=lambda *a: calls.append(("config", *a)),
                          add_directive=lambda *a: calls.append(("directive", *a)),
                          connect=lambda *a: calls.append(("connect", *a)))
    assert ext.setup(app) == {"parallel_read_safe": True, "parallel_write_safe": True}
    assert calls == [("config", "world_sizes_examples_dir", "../examples", "env"),
                     ("directive", "world-sizes", ext.WorldSizes),
                     ("connect", "source-read", ext._header_line)]
