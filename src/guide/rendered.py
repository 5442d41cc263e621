"""Every number a built page shows is in its ledger: a scan of the rendered HTML.

After the build, :func:`scan_site` reads the text of every page in ``docs/_build/html`` (prose,
printed output, tables, figure alt text and titles) and reports each number that is neither in
that page's ledger (:mod:`guide.claims`) at the precision shown nor exempt. The docs extension
runs it when the build finishes (``ledger_scan = "report"`` or ``"strict"`` in ``docs/conf.py``).

A number is **in the ledger** when a claim of the page (or an assumption of one of its claims:
``world_size=2`` covers the 2 of "2 ranks") equals it to the precision it is shown with: ``0.83``
matches 0.8306, ``24.7%`` matches 0.247 or 24.7, ``7,560`` matches 7,559.6 but ``7,559.6`` does not
match 7,560. Record a number in the unit the page prints it in. The ledger page
(``pages/ledger``) is checked against the whole ledger, the text of its guards (cited sources)
included.

**Exemptions** (the grammar, in order; nothing else is exempt):

1. *Not read*: anything outside the page's ``<article>`` (or ``role="main"``), code cells,
   inline code literals (``code``), math, the gallery's running time and download footers,
   header links, scripts and styles: code and formulas are not claims; the world sizes an example
   declares (``world-sizes``, written from its declaration by ``docs/world_sizes_ext.py``); a
   number cited with the ``claim`` role (class ``claim``): the ledger's text, by construction.
2. *Identifiers*: digits touching a letter or ``_`` (``fc2``, ``bf16``, ``H100``, ``70B``,
   ``sm_90``), joined to one by a hyphen (``2-D``, ``Llama-3.1-8B``, ``N−1``) or over a slash
   (``1/N``): names and formulas; a multiplier ``2x`` / ``2×`` is a number, not an identifier.
3. *Versions*: three or more dot-separated parts (``2.9.0``), or a number right after ``torch``,
   ``PyTorch``, ``Python``, ``CUDA``, ``NCCL``, ``version``, ``release`` or ``v`` (``torch 2.9``,
   ``torch >= 2.9``).
4. *Dates and times*: ``YYYY-MM-DD``, years 1990-2039, clock times and ports (``0:02:28``,
   ``127.0.0.1:29500``).
5. *Issue and PR numbers*: ``#123``, ``issue 23``, ``PR 145``.
6. *Indices*: an integer after ``step``, ``rank``, ``layer``, ``block``, ``replica``, ``node``,
   ``stage``, ``item``, ``pitfall``, ``figure``, ``table``, ``section``, ``Eq.``, ``equation``,
   ``row``, ``column``, ``line``, ``chunk``, ``shard``, ``position``, ``phase``, ``dim``, ``r``
   (rank 0, step 19, Eq. 1).
7. *List numbering*: an integer opening a line followed by ``.`` or ``)``; ``(1)``-style is a
   shape tuple (rule 8). A signed ``(−1)`` is a number.
8. *Code-like output*: a keyword literal (``in_features=64``, ``eps=1e-05``), an integer in a
   shape tuple (``(128, 64)``, ``(64,)``, ``torch.Size([4, 16])``) or an index range (``(0-3)``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from html.parser import HTMLParser
from pathlib import Path

from guide.claims import Claim

__all__ = ["Unrecorded", "page_of", "page_text", "scan_page", "scan_site", "unrecorded_numbers",
           "write_report"]

#: Rendered pages that are not pages of the guide: indices, search, API reference, source views.
SKIP = re.compile(r"^(genindex|search|py-modindex|api|_modules/.*|_sources/.*|_static/.*|"
                  r"auto_examples/backreferences/.*)$")
LEDGER_PAGE = "pages/ledger"

#: Code blocks are ``highlight-<language>``; printed output is ``highlight-none`` (sphinx-gallery)
#: or ``highlight-myst-ansi`` (MyST-NB) and is read.
_OUTPUT_HIGHLIGHT = {"highlight-none", "highlight-myst-ansi", "highlight-text"}
_SKIP_CLASSES = ("highlight-", "cell_input",
                 "sphx-glr-timing", "sphx-glr-footer", "sphx-glr-download", "sphx-glr-signature",
                 "headerlink", "sphx-glr-script-out-header", "world-sizes")
_SKIP_EXACT = {"math", "literal", "claim"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}
_BLOCK = {"p", "div", "pre", "li", "tr", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "br",
          "caption", "figcaption", "table", "dd", "dt", "blockquote"}

_NUMBER = re.compile(
    r"(?<![\w.#])(?<!\w[-−])(?P<sign>[-−+])?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"(?P<pct>%)?(?P<mult>[x×](?![\w]))?(?![\w]|\.\d|-[A-Za-z]|/[A-Za-z])")
_VERSION_WORDS = re.compile(r"(?:torch|pytorch|python|cuda|nccl|version|release|v)\s*[≥<>=~]*\s*$",
                            re.I)
_INDEX_WORDS = re.compile(
    r"(?:\bstep|\brank|\blayer|\bblock|\breplica|\bnode|\bstage|\bitem|\bpitfall|\bfigure|"
    r"\btable|\bsection|\beq\.|\bequation|\brow|\bcolumn|\bline|\bchunk|\bshard|\bposition|"
    r"\bphase|\bdim|\br|\bissue|\bpr|\bpull request)\s*$", re.I)


@dataclasses.dataclass(frozen=True)
class Unrecorded:
    """A number a page shows that its ledger lacks."""

    page: str
    number: str
    context: str

    def __str__(self) -> str:
        return f"{self.page}: {self.number} (in '{self.context}')"


class _Text(HTMLParser):
    """The readable text of a page's article: what a reader sees, less the exempt elements."""

    def __init__(self, container: str) -> None:
        super().__init__(convert_charrefs=True)
        self.container = container  # "article", or "main" for themes without one
        self.out: list[str] = []
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, skipped, opens the article)

    def _reading(self) -> bool:
        return (any(main for _, _, main in self.stack)
                and not any(skip for _, skip, _ in self.stack))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").lower().split()
        if tag in _BLOCK:
            self.out.append("\n")
        if tag == "img" and self._reading():
            self.out.append(f"\n{a.get('alt') or ''} {a.get('title') or ''}\n")
        if tag in _VOID:
            return
        main = (tag == "article" if self.container == "article" else a.get("role") == "main")
        main = main and not any(
            m for _, _, m in self.stack)
        skip = (tag in ("script", "style", "code") or
                any((c.startswith(_SKIP_CLASSES) and c not in _OUTPUT_HIGHLIGHT)
                    or c in _SKIP_EXACT for c in classes))
        self.stack.append((tag, skip, main))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        for i in range(len(self.stack) - 1, -1, -1):  # tolerate unclosed inner tags
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag in _BLOCK:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if self._reading():
            self.out.append(data)


def page_text(html: str) -> str:
    """The text a reader sees in a rendered page's article (see the module's exemption 1)."""
    parser = _Text("article" if "<article" in html else "main")
    parser.feed(html)
    return "".join(parser.out)


def page_of(path: str | Path) -> str:
    """The ledger page name of a rendered file: ``auto_examples/plot_x.html`` -> ``plot_x``."""
    rel = Path(path).with_suffix("").as_posix()
    if rel.startswith("auto_examples/plot_"):
        return rel.removeprefix("auto_examples/")
    return rel


def _exempt(text: str, m: re.Match) -> bool:
    """Exemptions 3-7 of the module docstring (2.9.0 never matches :data:`_NUMBER`)."""
    start, num = m.start(), m.group("num")
    before = text[max(0, start - 24):start]
    after = text[m.end():m.end() + 6]  # "-MM-DD" is 6 characters
    if _VERSION_WORDS.search(before) and "," not in num:
        return True
    if re.fullmatch(r"(199\d|20[0-3]\d)", num) or (
            re.fullmatch(r"\d{4}", num) and re.match(r"-\d\d-\d\d", after)):
        return True
    if before.endswith("#") or (("." not in num) and _INDEX_WORDS.search(before)):
        return True
    line_start = text.rfind("\n", 0, start) + 1
    if ("." not in num and not text[line_start:start].strip() and re.match(r"[.)]\s", after)):
        return True
    if re.search(r"\d:$", before) or re.match(r":\d", after):  # clock times, ports
        return True
    if before.endswith("=") or _in_shape(text, m):
        return True
    return False


_SHAPE = re.compile(r"[(\[]\d+(?:-\d+)?(?:,\s*\d+)*,?\s*[)\]]")


def _in_shape(text: str, m: re.Match) -> bool:
    """Whether ``m`` sits in an integer tuple such as ``(128, 64)``, ``[4, 16]`` or ``(0-3)``."""
    if m.group("sign") or "." in m.group("num"):
        return False
    lo = max(text.rfind("(", 0, m.start() + 1), text.rfind("[", 0, m.start() + 1))
    if lo < 0 or m.start() - lo > 40:
        return False
    hit = _SHAPE.match(text, lo)
    return bool(hit) and hit.end() >= m.end()


def _value(m: re.Match) -> tuple[float, float, bool]:
    """The number a token shows, half its last digit (the precision), and whether it is a %."""
    num = m.group("num").replace(",", "")
    mantissa, _, exp = num.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    scale = 10.0 ** int(exp) if exp else 1.0
    value = float(num) * (-1 if m.group("sign") in ("-", "−") else 1)
    return value, 0.5 * 10.0 ** -decimals * scale, bool(m.group("pct"))


def _candidates(records: Iterable[Claim], texts: bool = False) -> list[float]:
    """Numbers the records hold: values and assumptions, and with ``texts`` the numbers in their
    guards, units and assumptions' text (the ledger page shows those)."""
    out = []
    for r in records:
        words = [r.guard, r.unit, *(v for _, v in r.assumptions)] if texts else []
        words += [r.value] if isinstance(r.value, str) else []  # a stated text's numbers
        extra = [m.group(0) for w in words for m in _NUMBER.finditer(w)]
        for v in (r.value, *(v for _, v in r.assumptions), *extra):
            try:
                out.append(float(str(v).replace(",", "").replace("−", "-").rstrip("%x×")))
            except ValueError:
                continue
    return out


def _in_ledger(value: float, half: float, pct: bool, values: list[float]) -> bool:
    shown = [value, value / 100] if pct else [value]
    halves = [half, half / 100] if pct else [half]
    return any(abs(abs(v) - abs(s)) <= h * (1 + 1e-9) + 1e-12 * abs(s)
               for v in values for s, h in zip(shown, halves))


def unrecorded_numbers(page: str, text: str, records: Iterable[Claim]) -> list[Unrecorded]:
    """The numbers in ``text`` (a page's rendered text) that ``records`` (its ledger) lack."""
    values = _candidates(records, texts=page == LEDGER_PAGE)
    out = []
    for m in _NUMBER.finditer(text):
        if _exempt(text, m):
            continue
        value, half, pct = _value(m)
        if not _in_ledger(value, half, pct, values):
            context = " ".join(text[max(0, m.start() - 40):m.end() + 40].split())
            out.append(Unrecorded(page, m.group(0), context))
    return out


def scan_page(page: str, html: str, records: Iterable[Claim]) -> list[Unrecorded]:
    """:func:`unrecorded_numbers` of a rendered page's HTML."""
    return unrecorded_numbers(page, page_text(html), records)


def scan_site(html_dir: str | Path, records: Iterable[Claim]) -> dict[str, list[Unrecorded]]:
    """Every rendered page of ``html_dir`` (less :data:`SKIP`) against its ledger records."""
    records = list(records)
    by_page: dict[str, list[Claim]] = {}
    for r in records:
        by_page.setdefault(r.page, []).append(r)
    out = {}
    root = Path(html_dir)
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        if SKIP.match(rel.removesuffix(".html")):
            continue
        page = page_of(rel)
        ledger = records if page == LEDGER_PAGE else by_page.get(page, [])
        found = scan_page(page, path.read_text(errors="replace"), ledger)
        if found:
            out[page] = found
    return out


def write_report(found: Mapping[str, list[Unrecorded]], path: str | Path) -> str:
    """Write ``found`` as JSON to ``path``; return a one-line summary."""
    total = sum(len(v) for v in found.values())
    Path(path).write_text(json.dumps(
        {"total": total, "pages": {p: [dataclasses.asdict(u) for u in us]
                                   for p, us in found.items()}}, indent=1, ensure_ascii=False))
    worst = ", ".join(f"{p} {len(us)}" for p, us in
                      sorted(found.items(), key=lambda kv: -len(kv[1]))[:5])
    return (f"[ledger scan] {total} printed numbers on {len(found)} pages are not in the ledger"
            f"{' (most: ' + worst + ')' if worst else ''}; see {path}")
