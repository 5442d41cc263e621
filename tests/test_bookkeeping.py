"""benchmarks/bookkeeping.py counts the lines that only record, and not the check or computation a
recording call carries (the issue-33 share of every page is measured with it)."""

from __future__ import annotations

import benchmark_script

bookkeeping = benchmark_script.load("bookkeeping")

SOURCE = '''\
"""Docstring."""
import torch
x = torch.ones(3)
PAGE.assume(model="TinyLM")
gap = PAGE.check("page.gap", checks.expect_close(
    "loss", float(x.sum()), 3.0, tol=1e-6,
    against="three ones"), fmt=".1e")
total = PAGE.state("page.total",
                   x.sum().item(),
                   "elements")
with PAGE.scope(steps=3):
    PAGE.show("page.table", {"a": [1]}, ["n"],
              keys=["a"])
print(gap, total)
'''


def test_the_recorded_values_own_lines_are_not_bookkeeping() -> None:
    assert sorted(bookkeeping.bookkeeping_lines(SOURCE)) == [4, 5, 7, 8, 10, 11, 13]
    # line 6 is the check's own line, 9 the computation's; --whole-calls counts them too
    assert sorted(bookkeeping.bookkeeping_lines(SOURCE, whole_calls=True)) == [
        4, 5, 6, 7, 8, 9, 10, 11, 13]


def test_code_lines_skip_the_docstring_comments_and_blanks() -> None:
    numbered = dict(bookkeeping.code_lines(SOURCE + "\n# a comment\n"))
    assert 1 not in numbered and min(numbered) == 2 and max(numbered) == 14
