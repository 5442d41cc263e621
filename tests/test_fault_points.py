"""The fault-point tag (:mod:`guide.fault_points`): what the tests find is what the reader never
sees, on the rendered page and in a script shown side by side."""

from __future__ import annotations

import faults
import pytest

from guide import script_diff
from guide.fault_points import TAG, without_tags

PAGE = '''\
def train(model):
    model = shard(model)  # fault-point: shard
    loss = model(x)  #fault-point:forward\t
    return loss  # a comment that stays
'''


def test_the_tests_and_the_reader_see_the_same_tags() -> None:
    assert faults.fault_points(PAGE) == {"shard": [2], "forward": [3]}
    assert [m[1] for m in TAG.finditer(PAGE)] == ["shard", "forward"]
    assert without_tags(PAGE) == ("def train(model):\n    model = shard(model)\n"
                                  "    loss = model(x)\n    return loss  # a comment that stays\n")


@pytest.mark.parametrize("line", ["x = 1  # fault-pointer: y", "x = 1  # fault-point:",
                                  "x = '# fault-point: y' + z", "x = 1  # a fault-point: y"])
def test_what_is_not_a_tag_ending_a_line_stays(line: str) -> None:
    assert without_tags(line) == line
    assert faults.fault_points(line) == {}


def _tagged(model):
    model = model * 2  # fault-point: double
    return model  # kept


def test_a_script_shown_side_by_side_has_no_tags() -> None:
    text = script_diff.source(_tagged, _tagged)
    assert "fault-point" not in text and text.count("# kept") == 2
    assert text.count("model = model * 2\n") == 2


def test_a_missing_or_doubled_tag_is_reported_before_any_fault_runs(tmp_path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text("a = 1  # fault-point: one\n"
                    "b = 2  # fault-point: two\n"
                    "c = 3  # fault-point: two\n")
    faults_of_page = [[("one", "a = 0")], [("two", "b = 0"), ("three", "c = 0")]]
    assert faults.mistagged(page, faults_of_page) == {"three": 0, "two": 2}
    assert faults.mistagged(page, [[("one", "a = 0")]]) == {}
