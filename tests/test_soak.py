"""benchmarks/soak.py: it soaks every page the docs build executes, and a failing page fails it."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


soak = benchmark_script.load("soak")


def test_every_executed_page_is_soaked():
    every = {p.relative_to(ROOT).as_posix() for p in soak.pages([])}
    examples = {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("plot_*.py")}
    assert examples <= every
    # the MyST pages with code cells run in the build (two of them launch ranks); the glossary runs
    # nothing
    assert {"docs/pages/how_fsdp2_shards.md", "docs/pages/cluster.md", "docs/index.md",
            "docs/pages/memory_calculator.md"} <= every
    assert "docs/pages/glossary.md" not in every


def test_a_page_is_named_by_its_stem_and_an_unknown_one_is_refused_with_the_choices():
    assert soak.pages(["how_fsdp2_shards.md", "plot_checkpoint"]) == [
        ROOT / "docs/pages/how_fsdp2_shards.md", ROOT / "examples/plot_checkpoint.py"]
    with pytest.raises(SystemExit, match="no_such_page: no such page; choose from .*plot_hsdp"):
        soak.pages(["no_such_page"])


def test_a_myst_page_whose_cell_raises_fails_its_run_with_the_message(tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: "
                    "Python 3\n---\n\n# Broken\n\n```{code-cell} ipython3\nprint('cell one ran')\n"
                    "```\n\n```{code-cell} ipython3\nraise ValueError('the second cell broke')\n```\n")
    ok, seconds, out = soak.run_page(page, timeout_s=120)
    assert not ok and "the second cell broke" in out and seconds > 0
    page.write_text(page.read_text().replace("raise ValueError('the second cell broke')", "1 + 1"))
    ok, _, out = soak.run_page(page, timeout_s=120)
    assert ok, out
