"""The scan exempts nothing it should read: a number planted in each place it reads, and beside
each exemption rule, is reported (issue 38).

A strict build can never notice a scan that exempts too much (a page passes either way); only a
test that plants an unrecorded number where the scan must see it can. Each test here plants one
(``9.87`` unless said) and asserts the scan names it, next to the exempt form it must not be
confused with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guide import rendered
from guide.claims import Claim

PLANT = "9.87"


def _claim(value, page="plot_a", guard="computed", unit="GiB", **assumptions) -> Claim:
    return Claim("x", value, unit, page, tuple(sorted((k, str(v)) for k, v in
                                                      assumptions.items())), guard)


def _article(body: str) -> str:
    return f"<html><body><nav>9.11</nav><article>{body}</article><footer>9.12</footer></body></html>"


def _numbers(text: str, records=()) -> list[str]:
    return [u.number for u in rendered.unrecorded_numbers("plot_a", text, list(records))]


def _scanned(html: str, records=(), page="plot_a") -> list[str]:
    return [u.number for u in rendered.scan_page(page, html, list(records))]


# -- the places the scan reads -------------------------------------------------------------------

_MYST_OUTPUT = ('<div class="cell docutils container"><div class="cell_input docutils container">'
                '<div class="highlight-ipython3 notranslate"><div class="highlight"><pre>'
                '<span class="mf">1314.23</span></pre></div></div></div>'
                '<div class="cell_output docutils container">'
                '<div class="output stream highlight-myst-ansi notranslate"><div class="highlight">'
                '<pre><span></span>peak {} GiB\n</pre></div></div></div></div>')


@pytest.mark.parametrize("body", [
    f"<table><thead><tr><th>peak</th></tr></thead><tbody><tr><td>{PLANT}</td></tr></tbody></table>",
    f"<table><tr><th>{PLANT} GiB</th></tr></table>",
    f"<table><caption>Table: peak {PLANT}</caption><tr><td>a</td></tr></table>",
    _MYST_OUTPUT.format(PLANT),  # MyST-NB's printed output
    f'<div class="sphx-glr-script-out highlight-none notranslate"><pre>peak {PLANT}</pre></div>',
    f'<div class="highlight-text notranslate"><pre>peak {PLANT}</pre></div>',
    f'<img alt="peak {PLANT} GiB" src="a.png">',
    f'<img alt="" title="peak {PLANT} GiB" src="a.png">',
    f"<h2>Peak {PLANT}</h2>", f"<ul><li>peak {PLANT}</li></ul>", f"<dl><dd>{PLANT}</dd></dl>",
    f"<figure><figcaption>peak {PLANT}</figcaption></figure>",
    f"<p>peak <em>{PLANT}</em> GiB</p>", f'<p><abbr class="other">{PLANT}</abbr></p>',
])
def test_a_number_planted_in_each_place_the_scan_reads_is_named(body: str) -> None:
    assert _scanned(_article(body)) == [PLANT]


def test_myst_nb_output_is_read_and_its_input_cell_is_not() -> None:
    assert _scanned(_article(_MYST_OUTPUT.format(PLANT)), [_claim(1.0)]) == [PLANT]
    assert _scanned(_article(_MYST_OUTPUT.format("1,314.2")), [_claim(1314.2)]) == []


@pytest.mark.parametrize("body", [
    '<div class="highlight-python notranslate"><pre>x = 9.87</pre></div>',
    '<div class="highlight-ipython3 notranslate"><pre>9.87</pre></div>',
    '<div class="cell_input docutils container"><p>9.87</p></div>',
    '<p><code class="docutils literal">9.87</code> and <span class="pre">x</span></p>',
    '<p><span class="literal">9.87</span></p>', '<p><span class="math">9.87</span></p>',
    '<div class="math notranslate">9.87</div>', '<p><abbr class="claim">9.87</abbr></p>',
    '<p class="sphx-glr-timing">Total running time: 9.87 seconds</p>',
    '<div class="sphx-glr-footer"><p>9.87</p></div>',
    '<div class="sphx-glr-download sphx-glr-download-python"><p>9.87</p></div>',
    '<p class="sphx-glr-signature">9.87</p>', '<a class="headerlink">9.87</a>',
    '<p class="world-sizes">9.87</p>', '<script>var x = 9.87;</script>',
    '<style>p {width: 9.87px}</style>', '<style>p { z-index: 9.87 }</style>',
])
def test_what_is_not_read_is_not_read_and_the_text_after_it_is(body: str) -> None:
    assert _scanned(_article(f"{body}<p>then 4.56 GiB</p>")) == ["4.56"]


def test_only_the_article_is_read_and_the_main_role_without_one() -> None:
    html = f"<nav>1.23</nav><article><p>{PLANT}</p></article><p>4.56</p>"
    assert _scanned(html) == [PLANT]
    main = f'<div role="navigation">1.23</div><div class="body" role="main"><p>{PLANT}</p></div>4.56'
    assert _scanned(main) == [PLANT]
    assert _scanned(f'<div role="main"><article><p>{PLANT}</p></article></div>') == [PLANT]


def test_an_article_nested_in_the_article_ends_with_its_own_close_tag() -> None:
    """The outer article stays open after an inner one closes; text after the outer one is not
    read."""
    html = f"<article><article><p>1.23</p></article><p>{PLANT}</p></article><p>4.56</p>"
    assert _scanned(html) == ["1.23", PLANT]


def test_character_references_are_read_as_the_characters_they_stand_for() -> None:
    assert _scanned("<article><p>9&#46;87 and &minus;1&#44;234</p></article>") == [PLANT, "−1,234"]


def test_the_end_of_a_block_ends_its_words() -> None:
    """``<p>x</p>9.87``: the number is not glued to the paragraph's last word (which would make it
    an identifier, exempt)."""
    assert _scanned(f"<article><p>x</p>{PLANT}<div>y</div>{PLANT}</article>") == [PLANT, PLANT]


def test_inline_elements_do_not_split_words_and_blocks_do() -> None:
    """``fc<em>2</em>`` reads "fc2" (an identifier); ``x<div>9.87</div>`` reads "x", then 9.87."""
    assert _scanned("<article><p>fc<em>2</em> and <span>H</span>100</p></article>") == []
    assert _scanned(f"<article><p>x<div>{PLANT}</div></p></article>") == [PLANT]
    assert _scanned(f'<nav><img alt="{PLANT}"></nav><article><p>a</p></article>') == []


def test_a_stray_close_tag_is_ignored() -> None:
    assert _scanned(f"</div></p><article></span><p>{PLANT}</p></article>") == [PLANT]


def test_unclosed_inner_tags_do_not_hide_what_follows() -> None:
    html = f'<article><div><code>1.23</div><p>{PLANT}</p></article>'
    assert _scanned(html) == [PLANT]
    void = f'<article><p>a<br>b<img src="x.png"><hr>{PLANT}</p></article>'
    assert _scanned(void) == [PLANT]


def test_block_elements_separate_their_text() -> None:
    """Cells and paragraphs are words apart: ``1`` then ``23`` is not ``123``, and a number at
    the start of a cell is at the start of a line (so a list number there is exempt)."""
    assert _scanned("<article><table><tr><td>1</td><td>23</td></tr></table></article>") == \
        ["1", "23"]
    assert rendered.page_text("<article><p>a</p><p>b</p></article>").split() == ["a", "b"]
    assert "\n2. two" in rendered.page_text("<article><div>2. two</div></article>")
    assert rendered.page_text('<article><img alt="A" title="T"></article>').split() == ["A", "T"]


# -- the ledger of each page ---------------------------------------------------------------------

def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for rel, body in pages.items():
        path = tmp_path / f"{rel}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_article(body))
    return tmp_path


def test_each_page_is_checked_against_its_own_ledger_not_the_sites(tmp_path: Path) -> None:
    html = _site(tmp_path, {"auto_examples/plot_a": "<p>peak 1.23</p>",
                            "auto_examples/plot_b": "<p>peak 4.56</p>",
                            "pages/install": "<p>4.56 and 1.23</p>"})
    records = [_claim(1.23, page="plot_a"), _claim(4.56, page="plot_b")]
    found = rendered.scan_site(html, records)
    assert {p: [u.number for u in us] for p, us in found.items()} == {
        "pages/install": ["4.56", "1.23"]}
    swapped = [_claim(4.56, page="plot_a"), _claim(1.23, page="plot_b")]
    found = rendered.scan_site(html, swapped)
    assert {p: [u.number for u in us] for p, us in found.items()} == {
        "plot_a": ["1.23"], "plot_b": ["4.56"], "pages/install": ["4.56", "1.23"]}
    assert [str(u) for u in found["plot_a"]] == ["plot_a: 1.23 (in 'peak 1.23')"]


def test_the_ledger_page_is_checked_against_every_pages_records(tmp_path: Path) -> None:
    html = _site(tmp_path, {"pages/ledger": "<p>1.23 4.56 7.89</p>"})
    records = [_claim(1.23, page="plot_a"), _claim(4.56, page="pages/b")]
    found = rendered.scan_site(html, records)
    assert [u.number for u in found["pages/ledger"]] == ["7.89"]


def test_guard_numbers_count_on_the_ledger_page_only() -> None:
    """The ledger page prints each record's guard (``asserted: ... 1e-05``), unit and
    assumptions' text; any other page that prints a number found only there must record it."""
    record = _claim(1.0, guard="cited: NVIDIA datasheet, 9.87 TB/s", unit="per 6.5 s",
                    model="TinyLM(d=77.5)")
    text = "the datasheet says 9.87, per 6.5 s, 77.5"
    assert _numbers(text, [record]) == ["9.87", "6.5", "77.5"]
    assert [u.number for u in rendered.unrecorded_numbers(rendered.LEDGER_PAGE, text, [record])] \
        == []
    html = _article(f"<p>{text}</p>")
    assert _scanned(html, [record]) == ["9.87", "6.5", "77.5"]
    assert _scanned(html, [record], page=rendered.LEDGER_PAGE) == []


def test_a_stated_text_counts_its_numbers_on_every_page() -> None:
    """A claim whose value is a text (``"2 x 4 mesh"``) states its numbers on its own page."""
    assert _numbers("a 2 x 4.5 mesh", [_claim("2 x 4.5 mesh")]) == []
    assert _numbers("a 2 x 4.5 mesh", [_claim("2 x 4 mesh")]) == ["4.5"]


def test_assumption_values_count_and_their_names_do_not() -> None:
    assert _numbers("on 8 ranks, 1,024 tokens", [_claim(1.0, world_size=8, seq_len="1,024")]) == []
    assert _numbers("on 8 ranks", [_claim(1.0, seq_len=4)]) == ["8"]
    assert _numbers("-3.5% and 7x", [_claim("−3.5%"), _claim(1.0, k="7x")]) == []


def test_an_unparsable_record_value_is_skipped_not_fatal() -> None:
    assert _numbers("4.5", [_claim("bf16"), _claim(4.5)]) == []
    assert _numbers("on 8 ranks", [_claim("bf16", world_size=8)]) == []  # the next value counts
    assert _numbers("on 8 ranks", [_claim(1.0, model="tiny", world_size=8)]) == []
    assert _numbers("4.5", [_claim("n/a")]) == ["4.5"]


# -- precision and sign ----------------------------------------------------------------------------

@pytest.mark.parametrize("shown, value, ok", [
    ("0.83", 0.8349, True), ("0.83", 0.8351, False), ("0.83", 0.8250, True), ("0.83", 0.8249, False),
    ("1.2e-05", 1.24e-5, True), ("1.2e-05", 1.26e-5, False), ("1.2e+03", 1249.0, True),
    ("1.2e+03", 1251.0, False), ("1e3", 1000, True), ("2.5E-3", 0.0025, True),
    ("24.7%", 0.2474, True), ("24.7%", 0.2476, False), ("24.7%", 24.74, True), ("24.7%", 24.76, False),
    ("-0.16", 0.16, True), ("−0.16", -0.16, True), ("+3", 3, True), ("3x", 3.4, True),
    ("3x", 3.6, False), ("3×", 3, True), ("1,000,000", 1e6, True), ("1,000,000", 1000001, False),
    ("12", 12.4, True), ("12", 12.6, False), ("0", 0.4, True), ("0", 0.6, False),
    ("1e-300", 1e-300, True), ("7", 70, False), ("70", 7, False),
    ("12", 0.12, False), ("0.83", 0.835, True), ("0.83", 0.825, True), ("217,728", 217_728.5000001, True),
    ("217,728", 217_728.5001, False), ("24.7%", 0.2465, True), ("24.7%", 24.65, True),
])
def test_a_number_matches_its_record_to_half_its_last_digit(shown: str, value, ok: bool) -> None:
    assert (_numbers(f"it is {shown} here", [_claim(value)]) == []) is ok


def test_a_large_number_matches_to_its_precision_only() -> None:
    """The relative slack (1e-12) is for float noise in big numbers; it is not a tolerance."""
    assert _numbers("217,728", [_claim(217_728.0000001)]) == []
    assert _numbers("217,728", [_claim(217_729)]) == ["217,728"]
    assert _numbers("217,728.0", [_claim(217_728.06)]) == ["217,728.0"]


def test_the_context_is_the_forty_characters_around_the_number_folded() -> None:
    text = "x" * 50 + "\n peak  9.87 GiB\n" + "y" * 50
    (u,) = rendered.unrecorded_numbers("plot_a", text, [])
    assert u.context == "x" * 32 + " peak 9.87 GiB " + "y" * 35
    assert (u.page, u.number) == ("plot_a", "9.87")


# -- beside each exemption rule, a number that is not exempt -------------------------------------

@pytest.mark.parametrize("text, found", [
    # 2. identifiers; a multiplier is a number
    ("fc2 bf16 H100 sm_90 2-D N−1 1/N", []), ("2 fc", ["2"]), ("9.87x faster", ["9.87x"]),
    ("3× the memory", ["3×"]), ("a-3 b", []), ("3/4", ["3", "4"]),
    # 3. versions: three dotted parts, or a number right after a version word
    ("torch 2.9.0, 1.2.3.4", []), ("torch 2.9, PyTorch>=2.4, Python 3.11, CUDA 12.4, NCCL 2.21, "
                                   "version 3, release 5, v2", []),
    ("torch is 9.87 times", ["9.87"]), ("torch 1,024 tokens", ["1,024"]),
    # 4. dates, years and clock times
    ("on 2026-12-01, in 1990 and 2039", []), ("in 1989", ["1989"]), ("in 2040", ["2040"]),
    ("on 1985-12-01 and 2045-01-31", []), ("1985-12", ["1985"]), ("1985-1-01", ["1985"]),
    ("1999.5", ["1999.5"]), ("12-01-99", ["12"]), ("took 0:02:28 at 10.0.0.1:29500", []),
    ("at 9:30", []), ("9.87 :x", ["9.87"]),
    # 5. issues and PRs
    ("#23, issue 23, PR 145, pull request 7", []), ("# 23", ["23"]),
    # 6. indices: an integer right after an index word, never a decimal
    ("step 19, rank 3, layer 2, block 1, replica 1, node 0, stage 2, item 4, pitfall 9, figure 1, "
     "table 2, section 3, Eq. 1, equation 2, row 5, column 6, line 7, chunk 8, shard 9, "
     "position 3, phase 2, dim 0, r 1", []),
    ("step 1.5", ["1.5"]), ("rank 9.87", ["9.87"]), ("rank: 3", ["3"]), ("frank 3", ["3"]),
    ("rank is 3", ["3"]), ("Step 3", []), ("ranks 3", ["3"]),
    # 7. list numbering: an integer opening a line, then . or ) and a space
    ("(1) one\n2. two\n  3) three", []), ("about 2. Then", ["2"]), ("\n2.5 two", ["2.5"]),
    ("\n2.two", ["2"]), ("\n2) ", []), ("(2) a", []), ("(1.5) a", ["1.5"]), ("x\n22.\n", []),
    ("x\n(2. two", ["2"]), ("a drop (−1) and (-2)", ["−1", "-2"]), ("(12) a", []),
    # 8. code-like output: a keyword literal, an integer in a shape tuple or an index range
    ("Linear(in_features=64, eps=1e-05)", []), ("(128, 64) (64,) [4, 16] (0-3)", []), ("( 7 )", ["7"]),
    ("x = 9.87", ["9.87"]), ("a=b then 9.87 GiB", ["9.87"]), ("=-3", []),
    ("(1.5, 2)", ["1.5", "2"]), ("(-3, 4)", ["-3", "4"]), ("(3, x)", ["3"]), ("[4, 16] then 9", ["9"]),
    ("(" + "x" * 45 + ", 7)", ["7"]), ("(" + "1, " * 12 + "7)", []),
    ("(" + "1, " * 13 + "7)", []), ("(" + "1, " * 12 + "11, 7)", ["7"]), ("7(4, 5)", ["7"]),
    ("(4, 5) 7", ["7"]), ("7 [4, 5]", ["7"]), ("7[4, 5]", ["7"]), ("[1, 2] [3, 4]", []),
])
def test_the_exemption_grammar_exempts_exactly_its_forms(text: str, found: list[str]) -> None:
    assert _numbers(text) == found


@pytest.mark.parametrize("word", ["torch", "PyTorch", "python", "CUDA", "NCCL", "version",
                                  "release", "v"])
def test_a_version_word_exempts_only_the_number_right_after_it(word: str) -> None:
    assert _numbers(f"{word} 2.9") == []
    assert _numbers(f"{word} >= 2.9") == []
    assert _numbers(f"{word} then 2.9") == ["2.9"]


def test_a_version_word_reaches_back_twenty_four_characters() -> None:
    assert _numbers("torch" + " " * 19 + "2.9") == []
    assert _numbers("torch" + " " * 20 + "2.9") == ["2.9"]


def test_a_keyword_literal_is_only_a_number_right_after_its_equals_sign() -> None:
    """The audit's bug: any number within the 24 characters after an ``=`` was exempt."""
    assert _numbers("eps=1e-05") == []
    assert _numbers("eps= 9.87") == ["9.87"]
    assert _numbers("x=y, peak 9.87 GiB") == ["9.87"]
    assert _numbers("a == b; 9.87") == ["9.87"]


# -- the report ----------------------------------------------------------------------------------

def test_the_report_names_the_total_and_the_pages_with_most(tmp_path: Path) -> None:
    found = {f"p{i}": [rendered.Unrecorded(f"p{i}", "1", "c")] * i for i in range(1, 8)}
    summary = rendered.write_report(found, tmp_path / "u.json")
    assert summary == ("[ledger scan] 28 printed numbers on 7 pages are not in the ledger "
                       f"(most: p7 7, p6 6, p5 5, p4 4, p3 3); see {tmp_path / 'u.json'}")
    data = json.loads((tmp_path / "u.json").read_text())
    assert data["total"] == 28 and data["pages"]["p1"] == [
        {"page": "p1", "number": "1", "context": "c"}]
    assert rendered.write_report({}, tmp_path / "e.json") == (
        f"[ledger scan] 0 printed numbers on 0 pages are not in the ledger; see "
        f"{tmp_path / 'e.json'}")
    assert json.loads((tmp_path / "e.json").read_text()) == {"total": 0, "pages": {}}


def test_the_report_keeps_non_ascii_text(tmp_path: Path) -> None:
    rendered.write_report({"p": [rendered.Unrecorded("p", "3×", "−3 × é")]}, tmp_path / "u.json")
    assert "−3 × é" in (tmp_path / "u.json").read_text()


def test_the_site_scan_skips_what_is_not_a_page_of_the_guide(tmp_path: Path) -> None:
    pages = {name: f"<p>{PLANT}</p>" for name in (
        "genindex", "search", "py-modindex", "api", "_modules/guide/x", "_sources/a",
        "_static/b", "auto_examples/backreferences/c")}
    pages.update({"index": f"<p>{PLANT}</p>", "api_extra": f"<p>{PLANT}</p>",
                  "auto_examples/index": f"<p>{PLANT}</p>", "pages/api": f"<p>{PLANT}</p>"})
    found = rendered.scan_site(_site(tmp_path, pages), [])
    assert sorted(found) == ["api_extra", "auto_examples/index", "index", "pages/api"]


def test_a_page_without_unrecorded_numbers_is_not_in_the_report(tmp_path: Path) -> None:
    html = _site(tmp_path, {"auto_examples/plot_a": "<p>1.23</p>"})
    assert rendered.scan_site(html, iter([_claim(1.23)])) == {}


def test_an_undecodable_byte_does_not_stop_the_scan(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_bytes(b"<article><p>\xff 9.87</p></article>")
    assert [u.number for u in rendered.scan_site(tmp_path, [])["index"]] == [PLANT]


def test_page_of_maps_gallery_pages_and_only_them() -> None:
    assert rendered.page_of(Path("auto_examples/plot_x.html")) == "plot_x"
    assert rendered.page_of("auto_examples/index.html") == "auto_examples/index"
    assert rendered.page_of("pages/plot_x.html") == "pages/plot_x"


@pytest.mark.parametrize("text, found", [
    # rule 7 exempts an integer only: a decimal opening a line before ") " or ". " is a number
    ("\n2.5) two", ["2.5"]), ("x\n9.87. two", ["9.87"]),
    # and only at the start of its own line, whatever lines follow
    ("about 3) more\nnext line", ["3"]), ("a\nabout 3) more\nnext\n", ["3"]),
])
def test_list_numbering_is_an_integer_at_the_start_of_its_own_line(text: str,
                                                                  found: list[str]) -> None:
    assert _numbers(text) == found


def test_the_context_of_a_number_near_the_start_begins_at_the_first_character() -> None:
    (u,) = rendered.unrecorded_numbers("plot_a", "A 9.87 GiB peak", [])
    assert u == rendered.Unrecorded("plot_a", "9.87", "A 9.87 GiB peak")


def test_a_recorded_identifier_ending_in_a_capital_x_does_not_record_its_digits() -> None:
    """Only ``x``, ``×`` and ``%`` make a recorded text a number (``7x``, ``24.7%``); ``8X``,
    like ``70B``, is an identifier (rule 2), whether a claim's value or an assumption."""
    assert _numbers("8 and 16", [_claim("8X"), _claim(1.0, variant="16X")]) == ["8", "16"]
    assert _numbers("8 and 16", [_claim("8x"), _claim(1.0, variant="16x")]) == []
