"""The page kit (:class:`guide.page.Page`): a page records as a side effect of what it says.

A table shown through the page is displayed wherever it stands and recorded in the same call; a
table without a name may hold no numbers; the verdict refuses a number the page did not record; a
typo in a keyword is an error; the ledger is named after the running example. Each test plants the
fault its guard exists for.
"""

from __future__ import annotations

import datetime
import json
import runpy
import sys
import types
from pathlib import Path

import pytest

import guide
from guide import checks, report
from guide.claims import LEDGER_ENV
from guide.declaration import Declaration
from guide.page import Page, _example_globals, page_name
from guide.world_sizes import Contract

ROWS = [["rank 0", 10, 0.5], ["rank 1", 10, 0.5]]
COLS = ["rank", "elements", "share"]


def _page() -> Page:
    return Page(section="Memory", order=1, key_api="fully_shard(", world_size=2, supports=(2,))


def test_show_prints_and_records_the_table_in_one_call(capsys) -> None:
    page = _page()
    assert page.show("kit.shares", ROWS, COLS, formats={"share": ".0%"}) is None  # not shown twice
    out = capsys.readouterr().out
    assert "rank 0" in out and "50%" in out  # displayed under python, mid-cell
    assert [t.name for t in page.ledger.tables] == ["kit.shares"]
    names = {r.name: r for r in page.ledger.records}
    assert names["kit.shares.rank_0.elements"].value == 10
    assert names["kit.shares.rank_1.share"].shown == "50%"


def test_show_in_the_gallery_queues_the_table_for_the_block_it_stands_in(monkeypatch) -> None:
    monkeypatch.setattr(report, "_in_gallery", lambda: True)
    page = _page()
    page.show("kit.shares", ROWS, COLS)
    page.show(None, [["a", "b"]], ["x", "y"])  # not the last expression of the cell either
    html = report.gallery_scraper(None, None, None)
    assert html.count("<table") == 2 and "rank 1" in html
    assert report.gallery_scraper(None, None, None) == ""  # each table once


def test_rows_keyed_by_a_mapping_name_their_records(capsys) -> None:
    page = _page()
    page.show("kit.shares", {"r0": ROWS[0], "r1": ROWS[1]}, COLS)
    names = {r.name for r in page.ledger.records}
    assert {"kit.shares.r0.elements", "kit.shares.r1.share"} <= names
    assert not any("rank_0" in n for n in names)  # not the first column's text
    assert "rank 1" in capsys.readouterr().out  # the rows, not their keys, are shown
    with pytest.raises(ValueError, match="take no keys="):
        page.show("kit.other", {"r0": ROWS[0]}, COLS, keys=["x"])


def test_assume_adds_to_every_later_record_once(capsys) -> None:
    page = _page()
    page.state("kit.before", 1, "things")
    page.assume(model="TinyLM", world_size=2)
    page.state("kit.after", 2, "things")
    with page.scope(steps=3):
        page.show("kit.shares", ROWS, COLS)
    by_name = {r.name: dict(r.assumptions) for r in page.ledger.records}
    assert by_name["kit.before"] == {}
    assert by_name["kit.after"] == {"model": "TinyLM", "world_size": "2"}
    assert by_name["kit.shares.rank_0.share"] == {"model": "TinyLM", "world_size": "2",
                                                  "steps": "3"}
    page.assume(model="TinyLM")  # the same again: nothing changes
    with pytest.raises(ValueError, match=r"\['model'\] already assumed"):
        page.assume(model="Llama")
    with pytest.raises(TypeError, match="did you mean .model."):
        page.assume(modle="TinyLM")  # a typo names itself


def test_a_table_without_a_name_may_hold_no_numbers(capsys) -> None:
    page = _page()
    with pytest.raises(ValueError, match="name it, so its numbers are recorded"):
        page.show(None, ROWS, COLS)
    with pytest.raises(ValueError, match="need a name"):
        page.show(None, [["a"]], ["x"], keys=["k"])
    page.show(None, [["blocks.0.qkv.weight", (128, 64), True]], ["parameter", "shape", "sharded"])
    assert "(128, 64)" in capsys.readouterr().out
    assert page.ledger.records == [] and page.ledger.tables == []


def test_the_conclusion_refuses_a_number_the_page_did_not_record(capsys) -> None:
    page = _page()
    gap = page.check("kit.gap", checks.expect_close("a match", "r", 0.0123, 0.0121, 0.001,
                                                    against="one process"), "nats", fmt=".3f",
                     world_size=page.world_size)
    page.conclude(f"The largest gap is {gap:.3f} nats on {page.world_size} ranks.")
    assert "0.012 nats" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"states '0\.5', which the page did not record"):
        page.conclude(f"The largest gap is {gap:.3f} nats, half a step: 0.5.")
    with pytest.raises(ValueError, match="'7'"):
        page.conclude("FSDP2 on 7 ranks.")  # an identifier's digits are exempt, a count is not


@pytest.mark.parametrize("call", [
    lambda p: p.show("kit.t", ROWS, COLS, fromats={"share": ".0%"}),
    lambda p: p.state("kit.n", 3, "ranks", fnt=".0f"),
    lambda p: p.check("kit.c", checks.expect_close("c", "r", 1.0, 1.01, 0.1, against="x"),
                      shwon="1"),
], ids=["show", "state", "check"])
def test_a_typo_in_a_keyword_is_an_error_naming_the_option(call) -> None:
    with pytest.raises(TypeError, match="did you mean"):
        call(_page())


def test_check_takes_only_what_a_check_returned() -> None:
    with pytest.raises(TypeError, match="not the value a guide.checks check returned"):
        _page().check("kit.c", 1.0)


def test_cite_records_the_constant_with_its_source() -> None:
    page = _page()
    value = page.cite("h100.memory_total")
    record = page.ledger.records[0]
    assert record.name == "constant.h100.memory_total" and record.value == value
    assert record.guard.startswith("cited: ")


def test_the_ledger_is_named_after_the_running_example(tmp_path: Path, monkeypatch) -> None:
    assert page_name({"__file__": "/x/examples/plot_abc.py"}) == "plot_abc"  # python, runpy
    monkeypatch.setattr(sys, "argv", ["/x/examples/plot_gallery.py"])  # sphinx-gallery
    assert page_name({}) == "plot_gallery"
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher"])  # a notebook
    assert page_name({}) == "notebook"
    example = tmp_path / "plot_kit_demo.py"
    example.write_text("import guide\n"
                       "PAGE = guide.Page(section='Memory', order=1, key_api='x', world_size=2, "
                       "supports=(2,))\n"
                       "PAGE.state('kit.demo', 3, 'ranks')\n")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger"))
    runpy.run_path(str(example), run_name="__main__")
    lines = (tmp_path / "ledger" / "plot_kit_demo.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["kit.demo"]
    assert json.loads(lines[0])["page"] == "plot_kit_demo"


def test_guide_exports_the_page() -> None:
    assert guide.Page is Page


def test_the_page_is_named_after_its_caller_through_a_wrapper_in_guide(monkeypatch) -> None:
    """Where ``__main__`` is no example (``python -m pytest``'s ``__main__.py``, a notebook), the
    page is the first caller outside the package: a function of the package between the page and
    ``Page`` does not name the ledger after itself."""
    inside = {"__name__": "guide.page_maker"}  # a module of the package, and its function
    exec("import guide\n"
         "def make():\n"
         "    return guide.Page(section='Memory', order=1, key_api='x', world_size=2, "
         "supports=(2,))\n", inside)
    caller = {"__name__": "kit", "__file__": "/x/examples/plot_kit_wrapped.py",
              "make": inside["make"]}
    for main_file in (None, "/x/site-packages/pytest/__main__.py"):
        main = type(sys)("__main__")
        if main_file:
            main.__file__ = main_file
        monkeypatch.setitem(sys.modules, "__main__", main)
        exec("PAGE = make()\n", caller)
        assert caller["PAGE"].ledger.page == "plot_kit_wrapped"
    main.__file__ = "/x/examples/plot_kit_main.py"  # a script run as __main__ names the page
    exec("PAGE = make()\n", caller)
    assert caller["PAGE"].ledger.page == "plot_kit_main"


def test_the_page_declares_its_call_and_reads_as_it() -> None:
    page = _page()
    assert page.declaration == Declaration("Memory", 1, "fully_shard(", Contract(2, (2,), ""))
    assert repr(page) == "Page(section='Memory', order=1, key_api='fully_shard(', world_size=2)"
    why = Page(section="Memory", order=1, key_api="x", world_size=2, supports=(2, 4),
               why="pairs of ranks")
    assert why.declaration.contract == Contract(2, (2, 4), "pairs of ranks")


def test_an_unsupported_torchrun_size_stops_the_page_with_its_reason(monkeypatch) -> None:
    main = types.ModuleType("__main__")
    main.__file__ = "/x/examples/plot_kit_main.py"
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as stopped:
        Page(section="Memory", order=1, key_api="x", world_size=2, supports=(2, 4),
             why="pairs of ranks")
    assert str(stopped.value) == (
        "plot_kit_main supports 2 and 4 ranks (pairs of ranks); you started 3. Run `torchrun "
        "--standalone --nproc-per-node=2 plot_kit_main.py`, or `python plot_kit_main.py` "
        "(2 ranks).")


def test_a_script_run_as_main_names_the_page_whoever_calls_page(monkeypatch) -> None:
    main = types.ModuleType("__main__")
    main.__file__ = "/x/examples/plot_kit_main.py"
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert _page().ledger.page == "plot_kit_main"  # called from this test, not the script
    monkeypatch.delitem(sys.modules, "__main__")  # embedded interpreters may have none
    assert _page().ledger.page != "plot_kit_main"


def _frames(*module_globals: dict) -> types.SimpleNamespace:
    """A stack of frames, innermost first, each with its module's globals."""
    frame = None
    for g in reversed(module_globals):
        frame = types.SimpleNamespace(f_globals=g, f_back=frame)
    return frame


def _module(file: str | None) -> types.ModuleType:
    main = types.ModuleType("__main__")
    if file is not None:
        main.__file__ = file
    return main


GUIDE = {"__name__": "guide.page"}
WRAPPER = {"__name__": "guide.page_maker"}
EXAMPLE = {"__name__": "kit", "__file__": "/x/examples/plot_kit.py"}
OUTER = {"__name__": "runner"}


def test_the_example_is_main_where_main_is_a_script() -> None:
    main = _module("/x/examples/plot_kit_main.py")
    assert _example_globals(main, _frames(GUIDE, EXAMPLE)) is vars(main)


@pytest.mark.parametrize("file", [
    None,  # a notebook's __main__, or python -c
    "/x/site-packages/pytest/__main__.py",  # python -m pytest
    "/usr/bin/ipython",  # a console script: not a .py file
], ids=["no-file", "python-m", "console-script"])
def test_a_main_that_is_no_example_leaves_the_page_to_its_caller(file) -> None:
    assert _example_globals(_module(file), _frames(GUIDE, EXAMPLE, OUTER)) is EXAMPLE
    assert _example_globals(None, _frames(EXAMPLE, OUTER)) is EXAMPLE  # no __main__ at all


def test_the_callers_frames_inside_guide_are_skipped_up_to_the_first_outside() -> None:
    assert _example_globals(None, _frames(GUIDE, WRAPPER, EXAMPLE, OUTER)) is EXAMPLE
    exec_globals: dict = {}  # code exec'd in bare globals has no __name__: not guide's
    assert _example_globals(None, _frames(GUIDE, exec_globals, OUTER)) is exec_globals
    assert _example_globals(None, _frames(GUIDE, WRAPPER)) is WRAPPER  # the outermost frame


def test_without_argv_a_page_outside_a_file_is_a_notebook(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [])  # an embedded interpreter
    assert page_name({}) == "notebook"


def test_check_and_state_record_the_unit_format_and_text_they_are_given() -> None:
    page = _page()
    checked = checks.expect_close("a match", "r", 0.0123, 0.0121, 0.001, against="one process")
    assert page.check("kit.gap", checked, "nats", fmt=".3f") == 0.012
    assert page.check("kit.gap_e", checked, "nats", shown="1.2e-02") == 0.012
    assert page.state("kit.mib", 1234.5678, "MiB", fmt=",.1f") == 1234.6
    assert page.state("kit.gib", 1234.5678, "GiB", shown="1,235") == 1235
    got = [(r.name, r.value, r.unit, r.shown) for r in page.ledger.records]
    assert got == [("kit.gap", 0.012, "nats", "0.012"), ("kit.gap_e", 0.012, "nats", "1.2e-02"),
                   ("kit.mib", 1234.6, "MiB", "1,234.6"), ("kit.gib", 1235, "GiB", "1,235")]


def test_the_conclusion_names_every_unrecorded_number_and_the_fix() -> None:
    page = _page()
    with pytest.raises(ValueError) as refused:
        page.conclude("FSDP2 on 7 ranks saves 0.5 of the memory.")
    assert str(refused.value) == (
        f"{page.ledger.page}: the conclusion states '7', '0.5', which the page did not record: "
        "record it (PAGE.check / PAGE.state, or a PAGE.show table) and format the value the "
        "record returns.")


def test_a_table_without_a_name_is_refused_with_its_first_numbers() -> None:
    page = _page()
    with pytest.raises(ValueError) as refused:
        page.show(None, [{"parameter": "w", "rows": 1, "cols": 2, "dim": 3, "heads": 4}])
    assert str(refused.value) == (
        "PAGE.show(None, ...): the table has number cells ([1, 2, 3]...) or assumptions; name it, "
        "so its numbers are recorded.")
    with pytest.raises(ValueError) as refused:
        page.show(None, [["a"]], ["x"], model="TinyLM")
    assert str(refused.value) == "PAGE.show(None, ...): keys and assumptions need a name."


def test_show_passes_formats_and_title_to_the_table_it_prints(capsys) -> None:
    page = _page()
    page.show(None, [["fully_shard", datetime.date(2024, 4, 24)]], ["api", "since"],
              formats={"since": "%B %Y"}, title="APIs")
    page.show("kit.shares", ROWS[:1], COLS, formats={"share": ".0%"}, title="Shares")
    assert capsys.readouterr().out == (
        "APIs\napi               since\n-----------  ----------\nfully_shard  April 2024\n"
        "Shares\nrank    elements  share\n------  --------  -----\nrank 0        10    50%\n")
