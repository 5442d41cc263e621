"""The ledger of claims: records, contradictions, and a real Sphinx build that must fail on one."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from guide import checks, claims, report

DOCS = Path(__file__).resolve().parents[1] / "docs"
EXAMPLES = sorted(p.stem for p in (DOCS.parent / "examples").glob("plot_*.py"))


def test_a_claim_is_returned_and_recorded(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    ledger = claims.Ledger("plot_a")
    assert ledger.claim("model.params", 217_728, "parameters", guard="cited: x") == 217_728
    ledger.claim("model.params", 217_728, "parameters", guard="cited: x")  # same: fine
    (record,) = claims.load(tmp_path)
    assert (record.page, record.value, record.guard) == ("plot_a", 217_728, "cited: x")


def test_a_page_rerun_replaces_its_records(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    claims.Ledger("plot_a").claim("x", 1.0, "GiB")
    claims.Ledger("plot_a").claim("x", 2.0, "GiB")
    assert [r.value for r in claims.load(tmp_path)] == [2.0]


def test_one_page_contradicting_itself_raises_at_once() -> None:
    ledger = claims.Ledger("plot_a")
    ledger.claim("x", 1.0, "GiB", ddp_buckets=True)
    with pytest.raises(AssertionError, match="claim 'x': values differ"):
        ledger.claim("x", 1.5, "GiB", ddp_buckets=True)
    with pytest.raises(AssertionError, match="assumptions or units differ"):
        ledger.claim("x", 1.0, "GiB", ddp_buckets=False)


@pytest.mark.parametrize("other", [
    dict(value=1314.2, unit="GiB", assumptions=(("ddp_buckets", "True"),)),   # another value
    dict(value=1051.3, unit="GiB", assumptions=(("ddp_buckets", "False"),)),  # other assumptions
    dict(value=1051.3, unit="GB", assumptions=(("ddp_buckets", "True"),)),    # another unit
])
def test_contradictions_name_both_pages(other) -> None:
    a = claims.Claim("70b.ddp", 1051.3, "GiB", "plot_memory", (("ddp_buckets", "True"),), "computed")
    b = claims.Claim("70b.ddp", page="pages/memory_calculator", guard="computed", **other)
    (found,) = claims.contradictions([a, b])
    assert "plot_memory" in str(found) and "pages/memory_calculator" in str(found)


def test_values_equal_to_rounding_noise_agree() -> None:
    a = claims.Claim("r", 0.1 + 0.2, "x", "p", (), "computed")
    b = claims.Claim("r", 0.3, "x", "q", (), "computed")
    assert claims.contradictions([a, b]) == []


@pytest.mark.parametrize("bad", [
    dict(name="Bad Name", value=1, unit="x"),
    dict(name="ok", value=float("nan"), unit="x"),
    dict(name="ok", value=True, unit="x"),
    dict(name="ok", value=1, unit="x", guard="checked"),
])
def test_bad_claims_are_refused(bad) -> None:
    with pytest.raises((ValueError, TypeError)):
        claims.Ledger("plot_a").claim(**bad)


def test_missing_pages_are_the_pages_without_a_record() -> None:
    a = claims.Claim("x", 1.0, "GiB", "plot_a", (), "computed")
    c = claims.Claim("y", 2, "ranks", "plot_c", (), "computed")
    pages = ["plot_a", "plot_b", "plot_c", "plot_d"]
    assert claims.missing_pages([a, c, a], pages) == ["plot_b", "plot_d"]
    assert claims.missing_pages([a, c], ["plot_c", "plot_a"]) == []
    assert claims.missing_pages([], pages) == pages


def _ledger_page_code() -> str:
    """The code cells of docs/pages/ledger.md, without their MyST options."""
    text = (DOCS / "pages" / "ledger.md").read_text()
    cells = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, re.S)
    return "\n".join(line for cell in cells for line in cell.splitlines()
                     if not line.startswith(":"))


def test_the_ledger_page_fails_naming_an_example_that_recorded_nothing(tmp_path,
                                                                       monkeypatch) -> None:
    monkeypatch.setenv(claims.LEDGER_ENV, str(tmp_path))
    monkeypatch.chdir(DOCS / "pages")  # where MyST-NB runs the page
    for page in EXAMPLES[1:]:  # the first example's records are missing
        claims.Ledger(page).claim(f"{page}.x", 1, "parameters")
    with pytest.raises(RuntimeError, match="ledger is incomplete") as err:
        exec(_ledger_page_code(), {})
    assert f"examples/{EXAMPLES[0]}.py" in str(err.value)
    assert f"examples/{EXAMPLES[1]}.py" not in str(err.value)
    assert "rm -rf docs/auto_examples" in str(err.value)
    claims.Ledger(EXAMPLES[0]).claim(f"{EXAMPLES[0]}.x", 1, "parameters")
    exec(_ledger_page_code(), {})  # complete: the page runs


def test_ledger_page_names_are_checked() -> None:
    with pytest.raises(ValueError, match="file name without extension"):
        claims.Ledger("plot_a.py")


_CONF = """
import sys
sys.path.insert(0, {docs!r})
extensions = ["myst_nb", "ledger_ext"]
nb_execution_mode = "force"
nb_execution_raise_on_error = True
ledger_dir = {ledger!r}
ledger_page = "ledger"
"""
_PAGE = """---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---
# {title}

```{{code-cell}} ipython3
from guide import claims
claims.Ledger("{title}").claim("llama3-70b.ddp.per_gpu", {value}, "GiB", ddp_buckets=True)
```
"""


def _build(tmp_path: Path, values: dict[str, float]) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(_CONF.format(docs=str(DOCS), ledger=str(tmp_path / "ledger")))
    pages = "\n".join(values)
    (src / "index.md").write_text(f"# Site\n\n```{{toctree}}\n{pages}\n```\n")
    for title, value in values.items():
        (src / f"{title}.md").write_text(_PAGE.format(title=title, value=value))
    return subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src),
                           str(tmp_path / "html")], capture_output=True, text=True, timeout=240)


def test_a_build_where_two_pages_disagree_fails_naming_both(tmp_path) -> None:
    out = _build(tmp_path, {"memory": 1051.3, "calculator": 1314.2})
    assert out.returncode != 0, out.stdout + out.stderr
    message = out.stdout + out.stderr
    assert "llama3-70b.ddp.per_gpu" in message
    assert "'memory'" in message and "'calculator'" in message


def test_a_build_where_pages_agree_passes(tmp_path) -> None:
    out = _build(tmp_path, {"memory": 1314.2, "calculator": 1314.2})
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("call", [
    lambda ledger: ledger.claim("x", 1.0, "GiB", fnt=".1f"),
    lambda ledger: ledger.record("x", checks.expect_close("c", "r", 1.0, 1.1, 0.5), fmat=".1f"),
    lambda ledger: ledger.scope(wolrd_size=2).__enter__(),
    lambda ledger: report.table([[1]], ["a"], fromats={"a": ".1f"}, record=ledger, name="t"),
    lambda ledger: report.table([[1]], ["a"], fromats={"a": ".1f"}),
])
def test_a_mistyped_keyword_is_an_error_not_an_assumption(call) -> None:
    ledger = claims.Ledger("plot_x")
    with pytest.raises(TypeError, match="unknown keyword"):
        call(ledger)
    assert ledger.records == [] and ledger.tables == []


def test_a_typo_names_the_option_it_resembles() -> None:
    with pytest.raises(TypeError, match=r"'fnt' \(did you mean 'fmt'"):
        claims.Ledger("plot_x").claim("x", 1.0, "GiB", fnt=".1f")
    with pytest.raises(TypeError, match="unknown keyword 'colour'"):
        claims.Ledger("plot_x", colour="red")
