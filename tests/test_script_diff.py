"""guide.script_diff: the before/after diff a migration page counts and shows.

Each test names the guard it holds; removing that guard from the module makes the test fail
(comment stripping, the rename, end-of-line comments ignored, the pairing of a replaced block, the
totals, the HTML escaping and the refusal of an empty diff).
"""

from __future__ import annotations

import pytest

from guide.report import Table
from guide.script_diff import DiffLine, code_lines, counts, diff_lines, side_by_side

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
