"""The scan of rendered pages: every number a page shows is in its ledger, or exempt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from guide import rendered
from guide.claims import Claim

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _claim(value, page="plot_a", **assumptions) -> Claim:
    return Claim("x", value, "GiB", page, tuple(sorted((k, str(v)) for k, v in
                                                       assumptions.items())), "computed")


def _page(body: str) -> str:
    return f"<html><body><nav>rank 99.9</nav><article>{body}</article></body></html>"


def test_an_unrecorded_printed_number_is_named_with_its_page() -> None:
    html = _page('<div class="sphx-glr-script-out highlight-none"><pre>peak 854.2 GiB'
                 "</pre></div>")
    (found,) = rendered.scan_page("plot_a", html, [_claim(1314.2)])
    assert (found.page, found.number) == ("plot_a", "854.2")
    assert "peak 854.2 GiB" in found.context and str(found).startswith("plot_a: 854.2")


@pytest.mark.parametrize("shown, value", [
    ("0.83", 0.8306), ("1,314.2", 1314.2), ("7,560", 7559.6), ("24.7%", 0.247), ("24.7%", 24.7),
    ("2.1e-07", 2.1e-7), ("-0.16", -0.16), ("1.25×", 1.25), ("217,728", 217_728)])
def test_a_number_in_the_ledger_at_the_precision_shown_passes(shown: str, value) -> None:
    assert rendered.scan_page("plot_a", _page(f"<p>it is {shown} here</p>"), [_claim(value)]) == []


@pytest.mark.parametrize("shown, value", [("7,559.6", 7560), ("0.831", 0.83), ("25%", 0.2)])
def test_a_number_shown_more_precisely_than_recorded_fails(shown: str, value) -> None:
    assert len(rendered.scan_page("plot_a", _page(f"<p>it is {shown}</p>"), [_claim(value)])) == 1


def test_assumptions_of_the_page_cover_their_numbers() -> None:
    found = rendered.scan_page("plot_a", _page("<p>on 2 ranks</p>"), [_claim(1.0, world_size=2)])
    assert found == []


@pytest.mark.parametrize("text", [
    "fc2 bf16 H100 Llama-3-70B 2-D mesh, 1/N of it", "torch 2.9.0 and PyTorch 2.9, torch >= 2.4",
    "on 2026-12-01 in 2024", "issue #23, issue 23, PR 145", "step 19, rank 3, Eq. 1, pitfall 9",
    "(1) one\n2. two", "Linear(in_features=64, eps=1e-05) shape (128, 64) torch.Size([4, 16])",
    "took 0:02:28 at 127.0.0.1:29500"])
def test_the_exemption_grammar(text: str) -> None:
    assert rendered.unrecorded_numbers("plot_a", text, []) == []


def test_code_math_and_footers_are_not_read() -> None:
    html = _page('<div class="highlight-Python"><pre>x = 12345</pre></div>'
                 '<p>see <code class="docutils literal">9876</code> and '
                 '<span class="math">34sbh + 5as^2</span></p>'
                 '<p class="sphx-glr-timing">Total running time: 12.3 seconds</p>'
                 '<img alt="peak 4.5 GiB" src="a.png">')
    (found,) = rendered.scan_page("plot_a", html, [])
    assert found.number == "4.5"  # figure alt text is read


def test_pages_map_to_ledger_names() -> None:
    assert rendered.page_of("auto_examples/plot_x.html") == "plot_x"
    assert rendered.page_of("pages/memory_calculator.html") == "pages/memory_calculator"
    assert rendered.page_of("index.html") == "index"


_CONF = """
import sys
sys.path.insert(0, {docs!r})
extensions = ["myst_nb", "ledger_ext"]
nb_execution_mode = "force"
nb_execution_raise_on_error = True
ledger_dir = {ledger!r}
ledger_page = "ledger"
ledger_scan = {scan!r}
"""
_PAGE = """---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---
# A page

The peak is {{claim}}`peak <unit>`, as measured. {prose}

```{{code-cell}} ipython3
from guide import claims
ledger = claims.Ledger("a")
peak = ledger.claim("peak", 1314.23, "GiB", fmt=",.1f")
print(f"peak {{peak:,.1f}} GiB")
```
"""


def _build(tmp_path: Path, prose: str, scan: str) -> tuple[subprocess.CompletedProcess, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(_CONF.format(docs=str(DOCS), ledger=str(tmp_path / "ledger"),
                                              scan=scan))
    (src / "index.md").write_text("# Site\n\n```{toctree}\na\n```\n")
    (src / "a.md").write_text(_PAGE.format(prose=prose))
    out = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src),
                          str(tmp_path / "html")], capture_output=True, text=True, timeout=240)
    return out, tmp_path / "html"


def test_a_strict_build_fails_naming_page_and_unrecorded_number(tmp_path) -> None:
    out, _ = _build(tmp_path, "It fits in 79.6 GiB.", "strict")
    assert out.returncode != 0
    assert "a: 79.6" in out.stdout + out.stderr


def test_a_report_build_writes_the_numbers_and_the_claim_role_renders(tmp_path) -> None:
    out, html = _build(tmp_path, "It fits in 79.6 GiB; {claim}`peak <GiB>` again.", "report")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "unrecorded.json").read_text())
    assert [u["number"] for u in report["pages"]["a"]] == ["79.6"]
    page = (html / "a.html").read_text()
    assert page.count("1,314.2 GiB</abbr>") == 2 and "computed" in page  # value as shown, unit
    rows = json.loads((html / "ledger.json").read_text())
    assert rows[0]["shown"] == "1,314.2" and (html / "ledger.csv").read_text().startswith("page,")


def test_an_unknown_claim_name_fails_the_build_naming_page_and_name(tmp_path) -> None:
    out, _ = _build(tmp_path, "Also {claim}`no.such.claim`.", "off")
    assert out.returncode != 0
    assert "page 'a': claim 'no.such.claim'" in out.stdout + out.stderr


def test_a_number_cited_by_the_claim_role_is_the_ledgers() -> None:
    """The claim role writes the ledger's own text (class ``claim``): the scan does not ask the
    citing page to record it again; a number beside it still must be."""
    html = ('<article><p>a block keeps <abbr class="claim" title="x: computed">1.52</abbr>x '
            "the estimate, on 7 layers</p></article>")
    assert [u.number for u in rendered.scan_page("p", html, [])] == ["7"]


def test_a_claim_role_naming_another_unit_fails_the_build(tmp_path) -> None:
    out, _ = _build(tmp_path, "Also {claim}`peak <MiB>`.", "off")
    assert out.returncode != 0
    assert "claim 'peak' is in 'GiB', the claim role says <MiB>" in out.stdout + out.stderr
