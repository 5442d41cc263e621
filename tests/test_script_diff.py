"""guide.script_diff: the before/after diff a migration page counts and shows.

Each test names the guard it holds; removing that guard from the module makes the test fail
(comment stripping, the rename, end-of-line comments ignored, the pairing of a replaced block, the
totals, the HTML escaping and the refusal of an empty diff).
"""

from __future__ import annotations

import pytest

from guide.report import Table
from guide.script_diff import DiffLine, code_lines, counts, diff_lines, side_by_side, source

BEFORE = '''def ddp_step(model, x):
    # a comment line: not code

    y = model(x)  # forward
    with model.no_sync():
        y.backward()
    return y
'''
AFTER = '''def fsdp2_step(model, x):
    y = model(x)  # forward, gathered by FSDP2
    model.set_requires_gradient_sync(False)
    y.backward()
    return y
'''


def test_code_lines_drop_blank_and_comment_lines_only() -> None:
    assert code_lines(BEFORE) == ["def ddp_step(model, x):", "    y = model(x)  # forward",
                                  "    with model.no_sync():", "        y.backward()",
                                  "    return y"]


def test_rename_and_end_of_line_comments_do_not_count_as_changes() -> None:
    lines = diff_lines(BEFORE, AFTER, rename={"ddp_": "fsdp2_"})
    same = [(d.before, d.after) for d in lines if d.kind == "same"]
    assert ("def ddp_step(model, x):", "def fsdp2_step(model, x):") in same  # the rename
    assert ("    y = model(x)  # forward", "    y = model(x)  # forward, gathered by FSDP2") in same
    assert ("    return y", "    return y") in same
    without = diff_lines(BEFORE, AFTER)
    assert [d.kind for d in without][0] == "changed"  # no rename: the def line differs


def test_a_replaced_block_pairs_in_order_and_the_rest_is_removed_or_added() -> None:
    lines = diff_lines("a = 1\nb = 2\nc = 3\nz = 0\n", "a = 1\nB = 2\nz = 0\n")
    assert lines == [DiffLine("same", "a = 1", "a = 1"), DiffLine("changed", "b = 2", "B = 2"),
                     DiffLine("removed", "c = 3", ""), DiffLine("same", "z = 0", "z = 0")]
    added = diff_lines("a = 1\n", "a = 1\nb = 2\n")
    assert added[-1] == DiffLine("added", "", "b = 2")


def test_counts_add_up_to_each_script() -> None:
    lines = diff_lines(BEFORE, AFTER, rename={"ddp_": "fsdp2_"})
    c = counts(lines)
    assert c["before"] == len(code_lines(BEFORE)) and c["after"] == len(code_lines(AFTER))
    assert c == {"same": 3, "changed": 2, "removed": 0, "added": 0, "before": 5, "after": 5}
    with pytest.raises(ValueError, match="unknown kinds"):
        counts([DiffLine("moved", "a", "b")])


def test_an_empty_script_is_refused() -> None:
    with pytest.raises(ValueError, match="two scripts with code"):
        diff_lines("# only a comment\n", AFTER)


def test_side_by_side_shows_only_differences_as_escaped_code() -> None:
    lines = diff_lines("if a < b:\n    x = 1\n", "if a < b:\n    x = '<i>'\n")
    t = side_by_side(lines, ("before", "after"), title="diff")
    assert isinstance(t, Table) and t.cells == (("\u00a0" * 4 + "x = 1", "\u00a0" * 4 + "x = '<i>'"),)
    html = t._repr_html_()
    assert "&lt;i&gt;" in html and "<i>" not in html  # escaped
    assert html.count('<code class="docutils literal notranslate">') == 2  # code: not scanned
    assert "x = 1" in str(t) and " | " in str(t)
    with pytest.raises(ValueError, match="nothing to show"):
        side_by_side(diff_lines("a = 1\n", "a = 1  # same code\n"))


def test_counts_of_a_script_that_lost_and_gained_lines() -> None:
    c = counts(diff_lines("a = 1\nb = 2\nc = 3\nz = 0\n", "a = 1\nB = 2\nz = 0\ny = 9\n"))
    assert c == {"same": 2, "changed": 1, "removed": 1, "added": 1, "before": 4, "after": 4}


def test_a_side_with_no_line_renders_as_an_empty_cell() -> None:
    html = side_by_side(diff_lines("a = 1\n", "a = 1\nb = 2\n"))._repr_html_()
    assert "<td></td>" in html and html.count("<code") == 1


def test_an_empty_script_is_refused_naming_both_line_counts() -> None:
    with pytest.raises(ValueError) as refused:
        diff_lines("# only a comment\n", AFTER)
    assert str(refused.value) == ("diff_lines needs two scripts with code in them; got 0 and 5 "
                                  "running lines.")


def test_a_diff_with_nothing_to_show_says_so() -> None:
    with pytest.raises(ValueError) as refused:
        side_by_side(diff_lines("a = 1\n", "a = 1  # same code\n"))
    assert str(refused.value) == ("side_by_side: the two scripts run the same lines; nothing to "
                                  "show.")


def test_the_comment_ignored_starts_at_the_first_two_space_hash() -> None:
    assert [d.kind for d in diff_lines("y = 1  # a  # b\n", "y = 1  # c\n")] == ["same"]


def test_a_line_repeated_hundreds_of_times_still_matches_line_for_line() -> None:
    """difflib's autojunk would treat a line that fills over 1 % of a 200-line script as junk:
    no match could start at it, and one changed first line would make every line changed."""
    loop = "loss = step(model, loss)\n" * 200
    assert counts(diff_lines("model = DDP(model)\n" + loop, "fully_shard(model)\n" + loop)) == {
        "same": 200, "changed": 1, "removed": 0, "added": 0, "before": 201, "after": 201}


LINES = diff_lines("if a < b:\n    x = 1\nz = 0\n", "if a < b:\n    X = '<i>'\nz = 1\n\ty = 2\n")


def test_side_by_side_text_pads_the_before_column_to_its_widest_line() -> None:
    table = side_by_side(LINES, ("before", "after, migrated"), title="A <diff>")
    assert str(table) == ("A <diff>\n"
                          "before    | after, migrated\n"
                          "    x = 1 |     X = '<i>'\n"
                          "z = 0     | z = 1\n"
                          "          | \ty = 2")
    assert str(side_by_side(LINES)).splitlines()[0] == "before    | after"  # no title line
    assert table.title == "A <diff>"


def test_side_by_side_turns_leading_spaces_only_into_non_breaking_ones() -> None:
    assert side_by_side(LINES).cells == (("\u00a0" * 4 + "x = 1", "\u00a0" * 4 + "X = '<i>'"),
                                         ("z = 0", "z = 1"),
                                         ("", "\ty = 2"))  # a tab is kept as typed


def test_the_code_table_renders_escaped_code_cells_exactly() -> None:
    code = '<td><code class="docutils literal notranslate">'
    table = ('<table class="guide-table guide-code-table docutils">{caption}'
             "<thead><tr><th>before</th><th>after, migrated</th></tr></thead><tbody>"
             f"<tr>{code}\u00a0\u00a0\u00a0\u00a0x = 1</code></td>"
             f"{code}\u00a0\u00a0\u00a0\u00a0X = &#x27;&lt;i&gt;&#x27;</code></td></tr>"
             f"<tr>{code}z = 0</code></td>{code}z = 1</code></td></tr>"
             f"<tr><td></td>{code}\ty = 2</code></td></tr>"
             "</tbody></table>")
    columns = ("before", "after, migrated")
    assert side_by_side(LINES, columns, title="A <diff>")._repr_html_() == table.format(
        caption="<caption>A &lt;diff&gt;</caption>")
    assert side_by_side(LINES, columns)._repr_html_() == table.format(caption="")  # no title


def _ddp_step(x):
    return x + 1


def _fsdp2_step(x):
    return x * 2


def test_source_joins_the_functions_as_the_page_defines_them() -> None:
    assert source(_ddp_step, _fsdp2_step) == ("def _ddp_step(x):\n    return x + 1\n\n"
                                              "def _fsdp2_step(x):\n    return x * 2\n")
