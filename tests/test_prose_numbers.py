"""No typed numbers in prose: every quantity a page states comes from the run or the constants table.

The prose of each example (its docstring and the comment blocks of its ``# %%`` cells) and of each
Markdown page (outside code cells) is scanned for *quantities*: a number with a decimal point, a
number with a unit (``%``, ``×``, ``GB``, ``GiB``, ``MiB``, ``s``, ``GB/s``, ...), or a number of
three digits or more. Allowed: code in backticks (it runs or is shown as code), links, issue and PR
numbers (``#1234``), arXiv ids, identifiers that contain digits (``fp32``, ``H100``,
``Llama-3-70B``), versions of named software (``torch 2.13``), equations in ``$...$``. Small counts
and ordinals ("2 ranks", "step 1", "1/N") are structure, not quantities, and are not flagged.

A quantity the prose needs is printed by the page (so it comes from the run), or is a cited
constant in :data:`guide.constants.CONSTANTS` (shown, with sources, on the "Every number" page).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))
PAGES = sorted([*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "pages").glob("*.md")])

_ALLOWED = re.compile(r"""
    ``[^`]*``|`[^`]*`                                  # code
  | \$[^$]*\$                                          # math
  | https?://\S+ | \]\([^)]*\)                         # links
  | \#\d+                                              # issues and PRs
  | arXiv[: ]\s*\d{4}\.\d{4,5}                         # papers
  | \b(?:torch|PyTorch|Python|nox|sphinx-gallery|Sphinx|MyST-NB|NCCL|CUDA)\s+\d+(?:\.\d+)+\S*  # versions
  | \b[A-Za-z]+[\-_]?\d+[A-Za-z0-9.\-]*                # identifiers with digits: fp32, H100, gpt2-xl
  | \b\d+[\-–]D\b                                      # 2-D
  | \b\d{4}\b(?=[,)]|\s*$|\s+\()                       # years in citations: (2020), 2023,
""", re.X)
_UNIT = r"(?:\s?(?:%|×|x\b|GB|GiB|MiB|KiB|MB|kB|TB|Gb/s|GB/s|TFLOPS|PFLOPS|s\b|ms\b|bytes\b|B\b|tokens\b|params\b|parameters\b))"
_QUANTITY = re.compile(rf"(?<![\w./])(?:\d+\.\d+{_UNIT}?|\d[\d,]*{_UNIT}|\d{{3,}}|\d{{1,3}}(?:,\d{{3}})+)(?![\w])")


def _example_prose(path: Path) -> list[tuple[int, str]]:
    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source)) or ""
    out = [(0, line) for line in docstring.splitlines()]
    in_text = False
    for number, line in enumerate(source.splitlines(), 1):
        if line.startswith("# %%"):
            in_text = True
        elif in_text and line.startswith("#"):
            out.append((number, line[1:]))
        else:
            in_text = False
    return out


def _page_prose(path: Path) -> list[tuple[int, str]]:
    out, code, front = [], False, False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number == 1 and line == "---":
            front = True
            continue
        if front:
            front = line != "---"
            continue
        if line.startswith(("```", ":::")):
            code = not code
            continue
        if not code:
            out.append((number, line))
    return out


def typed_quantities(lines: list[tuple[int, str]]) -> list[str]:
    """``"line N: <quantity> in <text>"`` for every quantity typed in ``lines``."""
    found = []
    for number, line in lines:
        for match in _QUANTITY.finditer(_ALLOWED.sub(" ", line)):
            found.append(f"line {number}: {match.group(0)!r} in {line.strip()[:90]!r}")
    return found


@pytest.mark.parametrize("path", EXAMPLES + PAGES, ids=lambda p: p.name)
def test_no_typed_quantities_in_prose(path: Path) -> None:
    lines = _example_prose(path) if path.suffix == ".py" else _page_prose(path)
    found = typed_quantities(lines)
    assert not found, (f"{path.relative_to(ROOT)} types quantities in its prose; print them from "
                       "the run or cite them from guide.constants:\n" + "\n".join(found))


@pytest.mark.parametrize("text, flagged", [
    ("DDP per GPU needs 1,314.2 GiB", True),
    ("FSDP2 sends 1.43x DDP's", True),
    ("a 25.1 % saving", True),
    ("8,192 tokens per GPU", True),
    ("the NIC gives 50 GB/s", True),
    ("on 2 ranks, step 1, 1/N of the model", False),
    ("``d_model=512`` and `4 * P`", False),
    ("fp32, bf16, H100, Llama-3-70B, gpt2-xl", False),
    ("fixed in pytorch #162338, torch 2.13.0", False),
    ("Korthikanti et al. (arXiv 2205.05198)", False),
])
def test_the_scanner_flags_quantities_not_structure(text: str, flagged: bool) -> None:
    assert bool(typed_quantities([(1, text)])) is flagged
