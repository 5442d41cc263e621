"""A page declares itself once (:mod:`guide.page`): the gallery, the site tests and the world-size
contract read that call, and a wrong or missing declaration is an error naming the file and fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

import guide
from guide.declaration import Declaration, declared_page
from guide.page import Page
from guide.world_sizes import Contract, UnsupportedWorldSize, declared

sys.path.insert(0, str(ROOT / "docs"))
import gallery_order  # noqa: E402

GOOD = ('PAGE = guide.Page(section="Memory", order=2, key_api="fully_shard(", world_size=4,\n'
        '                  supports=(2, 4, 8), why="because")\n')


def _page(tmp_path: Path, text: str, name: str = "plot_x.py") -> Path:
    path = tmp_path / name
    path.write_text('"""\nTitle\n=====\n"""\nimport guide\n' + text)
    return path


def test_the_declaration_is_read_without_running_the_page(tmp_path: Path) -> None:
    path = _page(tmp_path, GOOD + "raise SystemExit('never run')\n")
    assert declared_page(path) == Declaration("Memory", 2, "fully_shard(",
                                              Contract(4, (2, 4, 8), "because"))
    assert declared(path) == Contract(4, (2, 4, 8), "because")  # the world-size contract too


@pytest.mark.parametrize("text, error", [
    ("x = 1\n", "no guide.Page"),
    (GOOD + GOOD, "once; found 2"),
    (GOOD.replace("order=2", "order=2, colour='red'"), "takes no colour"),
    (GOOD.replace('section="Memory"', "section=SECTION"), "literal values"),
    (GOOD.replace('key_api="fully_shard(", ', ""), "lacks key_api"),
    (GOOD.replace("world_size=4,", ""), "lacks world_size"),
    (GOOD.replace("order=2", "order=0"), "order must be a whole number from 1"),
    (GOOD.replace("order=2", "order=True"), "order must be a whole number from 1"),
    (GOOD.replace('key_api="fully_shard("', 'key_api=" "'), "key_api must be a non-empty"),
    (GOOD.replace("world_size=4", "world_size=1"), "default world size 1 is not among"),
    ("PAGE = guide.Page('Memory')\n", "keywords only"),
])
def test_a_declaration_the_site_cannot_read_names_the_fix(tmp_path: Path, text: str,
                                                          error: str) -> None:
    with pytest.raises(ValueError, match=error):
        declared_page(_page(tmp_path, text))


def test_at_run_time_the_page_holds_its_world_size_and_refuses_an_unsupported_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    page = guide.Page(section="Memory", order=1, key_api="x(", world_size=4, supports=(2, 4))
    assert page.world_size == 4 and page.declaration.contract == Contract(4, (2, 4))
    assert "world_size=4" in repr(page)
    for key, value in {"RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert Page(section="Memory", order=1, key_api="x(", world_size=4,
                supports=(2, 4)).world_size == 2
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(UnsupportedWorldSize, match="supports 2 and 4 ranks"):
        Page(section="Memory", order=1, key_api="x(", world_size=4, supports=(2, 4))
    with pytest.raises(ValueError, match="order must be"):
        Page(section="Memory", order=-1, key_api="x(", world_size=8, supports=(8,))


def test_every_example_declares_its_page_and_the_gallery_reads_it() -> None:
    story = []
    for section in gallery_order.SECTIONS:
        declared_here = sorted((declared_page(EXAMPLES / f).order, f) for f in section.files)
        assert [f for _, f in declared_here] == list(section.files)  # in declared order
        assert all(declared_page(EXAMPLES / f).section == section.title for f in section.files)
        story += section.files
    assert sorted(story) == sorted(p.name for p in EXAMPLES.glob("plot_*.py"))


def test_the_gallery_refuses_an_unknown_section_a_shared_place_and_a_missing_declaration(
        tmp_path: Path) -> None:
    titles = (gallery_order.Section("Memory", "c"), gallery_order.Section("Start here", "c"))
    _page(tmp_path, GOOD, "plot_a.py")
    _page(tmp_path, GOOD.replace("order=2", "order=1"), "plot_b.py")
    _page(tmp_path, GOOD.replace('"Memory"', '"Start here"'), "plot_c.py")
    assert gallery_order.sections(tmp_path, titles) == (
        gallery_order.Section("Memory", "c", ("plot_b.py", "plot_a.py")),
        gallery_order.Section("Start here", "c", ("plot_c.py",)))
    _page(tmp_path, GOOD, "plot_d.py")
    with pytest.raises(ValueError, match="plot_a.py and plot_d.py both declare order=2 in "
                                         "section 'Memory'"):
        gallery_order.sections(tmp_path, titles)
    (tmp_path / "plot_d.py").unlink()
    _page(tmp_path, GOOD.replace('"Memory"', '"Memroy"'), "plot_e.py")
    with pytest.raises(ValueError, match="plot_e.py: section 'Memroy' is not one of"):
        gallery_order.sections(tmp_path, titles)
    _page(tmp_path, "x = 1\n", "plot_e.py")
    with pytest.raises(ValueError, match="plot_e.py: no guide.Page"):
        gallery_order.sections(tmp_path, titles)
