"""The gallery as a reader scans it: every example placed in the story, and a thumbnail it chose.

sphinx-gallery takes an example's first figure as its thumbnail unless the script says
``# sphinx_gallery_thumbnail_number = K``; a number past the last figure silently falls back to
the first, so both are checked here, without building the site.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from gallery_order import STORY  # noqa: E402

EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))
_THUMB = re.compile(r"^# sphinx_gallery_thumbnail_number = (\d+)\s*$", re.M)


def thumbnail_problems(source: str) -> list[str]:
    """What is wrong with an example's thumbnail choice (empty: nothing)."""
    figures = source.count("plt.subplots(") + source.count("plt.figure(")
    chosen = [int(k) for k in _THUMB.findall(source)]
    if figures == 0:
        return ["draws no figure: the gallery shows a blank thumbnail"]
    if len(chosen) != 1:
        return [f"chooses its thumbnail {len(chosen)} times: say "
                "'# sphinx_gallery_thumbnail_number = K' once, K the figure that carries the story"]
    if not 1 <= chosen[0] <= figures:
        return [f"thumbnail number {chosen[0]} is not one of its {figures} figure(s): "
                "sphinx-gallery would silently take the first"]
    return []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_chooses_a_thumbnail_it_draws(path: Path) -> None:
    assert thumbnail_problems(path.read_text()) == []


def test_thumbnail_guard_catches_a_missing_and_an_out_of_range_choice() -> None:
    one_figure = "fig, ax = plt.subplots()\nplt.show()\n"
    assert thumbnail_problems(one_figure + "# sphinx_gallery_thumbnail_number = 1\n") == []
    assert "chooses its thumbnail 0 times" in thumbnail_problems(one_figure)[0]
    assert "is not one of its 1 figure" in thumbnail_problems(
        one_figure + "# sphinx_gallery_thumbnail_number = 2\n")[0]
    assert "no figure" in thumbnail_problems("print('hi')\n")[0]


def test_every_example_is_placed_in_the_story_once() -> None:
    assert sorted(STORY) == sorted(p.name for p in EXAMPLES)


def _generated_index(names: list[str]) -> str:
    """An index in the shape sphinx-gallery 0.22 writes: header, one card grid, one toctree."""
    card = ('.. raw:: html\n\n    <div class="sphx-glr-thumbcontainer" tooltip="t">\n\n'
            '.. only:: html\n\n  .. image:: /auto_examples/images/thumb/{0}_thumb.png\n'
            '    :alt:\n\n'
            '  :doc:`/auto_examples/{0}`\n\n.. raw:: html\n\n'
            '      <div class="sphx-glr-thumbnail-title">{0}</div>\n    </div>\n\n\n')
    return ("Examples\n========\n\nHeader.\n\n.. raw:: html\n\n"
            "    <div class=\"sphx-glr-thumbnails\">\n\n.. thumbnail-parent-div-open\n\n"
            + "".join(card.format(n) for n in names)
            + ".. thumbnail-parent-div-close\n\n.. raw:: html\n\n    </div>\n\n\n"
            ".. toctree::\n   :hidden:\n\n" + "".join(f"   /auto_examples/{n}\n" for n in names)
            + "\n\n.. only:: html\n\n  footer\n")


def test_gallery_index_is_rewritten_into_captioned_sections() -> None:
    from gallery_order import SECTIONS, sectioned_index

    names = [Path(f).stem for f in STORY]
    out = sectioned_index(_generated_index(names))
    assert sectioned_index(out) == out  # a second build leaves it as it is
    for section in SECTIONS:
        assert f"\n{section.title}\n{'-' * len(section.title)}\n" in out
        assert section.caption in out and f":caption: {section.title}\n" in out
    assert out.count("sphx-glr-thumbcontainer") == len(STORY) and "footer" in out
    headings = [out.index(f"\n{s.title}\n") for s in SECTIONS]
    assert headings == sorted(headings)  # sections in story order
    with pytest.raises(ValueError, match="plot_new.py.*not placed.*SECTIONS"):
        sectioned_index(_generated_index([*names, "plot_new"]))
    with pytest.raises(ValueError, match="no card grid or toctree"):
        sectioned_index("Examples\n========\n")


def test_landing_page_cards_follow_the_sections() -> None:
    from gallery_order import SECTIONS, landing_rst

    rst = landing_rst()
    assert [line.removeprefix(".. rubric:: ") for line in rst.splitlines()
            if line.startswith(".. rubric::")] == [s.title for s in SECTIONS]
    assert [line.strip().removeprefix("../examples/") for line in rst.splitlines()
            if line.strip().startswith("../examples/")] == list(STORY)


#: The longest line of code a 1440-px page shows without scrolling sideways: the browser test
#: (tests/test_site.py, WIDE) measured a 115-character line 2 px too wide; 110 leaves a margin.
CODE_WIDTH = 110


def wide_code_lines(path: Path, width: int = CODE_WIDTH) -> list[tuple[int, str]]:
    """The code lines (not the text blocks, which become prose) longer than ``width``: (line, text)."""
    from sphinx_gallery.py_source_parser import split_code_and_text_blocks

    blocks = split_code_and_text_blocks(str(path))[1]
    return [(first + k, line) for kind, text, first in blocks if kind == "code"
            for k, line in enumerate(text.splitlines()) if len(line) > width]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_code_fits_a_wide_screen_without_a_browser(path: Path) -> None:
    """The browser session's wide-screen check, decided from the source in the fast suite."""
    assert not wide_code_lines(path), (
        f"{path.name}: code lines over {CODE_WIDTH} characters scroll sideways at 1440 px; wrap them: "
        + "; ".join(f"line {n} ({len(text)} chars)" for n, text in wide_code_lines(path)))


def test_wide_code_guard_sees_a_long_code_line_and_not_a_long_text_line(tmp_path: Path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text('"""\nTitle\n=====\n"""\n# %%\n# ' + "t" * 130 + "\n\nx = 1  # " + "c" * 120 + "\n")
    assert [len(text) for _, text in wide_code_lines(page)] == [129]


def test_a_code_block_with_nothing_left_to_show_is_dropped_and_its_output_kept() -> None:
    """A cell of hidden checks renders no empty grey box; a cell with code keeps its block."""
    from gallery_order import without_empty_code_blocks
    from sphinx_gallery.gen_rst import codestr2rst

    empty = codestr2rst("\n\n", lang="Python", lineno=194)
    kept = codestr2rst("x = 1\n", lang="Python", lineno=3)
    out = ".. rst-class:: sphx-glr-script-out\n\n .. code-block:: none\n\n    printed\n\n"
    text = "Intro.\n\n" + empty + out + kept + "\nMore text.\n"
    cleaned = without_empty_code_blocks(text)
    assert cleaned == "Intro.\n\n" + out + kept + "\nMore text.\n"
    assert without_empty_code_blocks(cleaned) == cleaned
    assert without_empty_code_blocks(empty) == ""  # the page's last cell


def test_fault_point_tags_are_not_on_the_rendered_page() -> None:
    """A test's ``# fault-point: NAME`` tag is dropped from the code the reader sees; the
    statement and any other comment stay."""
    from gallery_order import without_fault_points
    from sphinx_gallery.gen_rst import codestr2rst

    code = ("model = wrap_ddp(build_model(CFG))  # fault-point: ddp-wrap\n"
            "shard_fsdp2(model, mesh)  #fault-point:fsdp2-shard   \n"
            "x = 1  # on GPU: DDP(model.cuda(rank))\n")
    block = codestr2rst(code, lang="Python", lineno=3)
    cleaned = without_fault_points(block)
    assert "fault-point" not in cleaned
    assert "    model = wrap_ddp(build_model(CFG))\n" in cleaned
    assert "    shard_fsdp2(model, mesh)\n" in cleaned
    assert "    x = 1  # on GPU: DDP(model.cuda(rank))\n" in cleaned
    assert without_fault_points(cleaned) == cleaned
