"""The built site, checked as a reader meets it: in a real browser, and through its downloads.

Three groups of tests:

* ``test_browser_*`` (``nox -s browser``): headless Chromium from the distribution (``/usr/bin/chromium``)
  driven by Playwright visits every page of ``docs/_build/html`` over a local HTTP server: no console
  error, every image loads with a non-zero size, no broken internal link or anchor, search finds
  ``fully_shard``, figures fit a phone-width screen; screenshots go to ``docs/_build/screenshots``.
* ``test_download_*`` (``nox -s downloads``): each example's ``.py`` and ``.ipynb`` download and the
  zips of all, taken from the built site into a fresh virtual environment that has only this package
  (plus a Jupyter kernel), run as a reader would; their assertions must pass.
* The rest run in ``nox -s tests``: the link/image guard itself on a site with injected faults, and the
  Slurm batch script of the "Run it on your cluster" page, run under stand-ins for ``srun``/``scontrol``.

The browser and download tests need a built site. They are deselected unless ``GUIDE_SITE_TESTS``
names them (the nox sessions set it; see ``no_skips.py``); when it does, a missing site or browser is
a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

from guide.declaration import declared_page

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("GUIDE_SITE_DIR", ROOT / "docs" / "_build" / "html"))
SCREENSHOTS = Path(os.environ.get("GUIDE_SCREENSHOT_DIR", ROOT / "docs" / "_build" / "screenshots"))
CHROMIUM = os.environ.get("GUIDE_CHROMIUM", "/usr/bin/chromium")
SLURM_SCRIPT = ROOT / "docs" / "_static" / "ddp_vs_fsdp2.sbatch"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("plot_*.py"))
MAIN_EXAMPLE = "plot_ddp_vs_fsdp2"
ENABLED = {s.strip() for s in os.environ.get("GUIDE_SITE_TESTS", "").split(",") if s.strip()}

#: Chromium flags: no sandbox (root in a container), no GPU, and nothing that talks to the network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def _require(group: str) -> None:
    """Fail unless ``group`` is enabled (``no_skips`` deselects it otherwise) and the site is built."""
    if group not in ENABLED:
        pytest.fail(f"needs the built site: run `nox -s docs` then `nox -s {group}` "
                    f"(or set GUIDE_SITE_TESTS={group})")
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `nox -s docs` first.")


# ------------------------------------------------------------------------------------------------
# The guard: what a page links to and shows, and what of it is broken.


@dataclasses.dataclass
class PageScan:
    """What one loaded page holds, as the browser's DOM has it (after scripts ran)."""

    url: str
    ids: set[str]
    links: list[str]  # absolute hrefs of <a>
    images: list[tuple[str, int]]  # (absolute src, naturalWidth)
    console_errors: list[str] = dataclasses.field(default_factory=list)
    external: list[str] = dataclasses.field(default_factory=list)  # resources from other hosts


#: Third-party resources a page may load: none. MathJax is served by the site itself
#: (sphinx-mathjax-offline), so math renders offline; anything from another host is a problem.
EXTERNAL_OK: tuple[str, ...] = ()


def site_problems(scans: dict[str, PageScan], base: str,
                  fetch: callable) -> list[str]:
    """Every broken thing the scans show: console errors, images that did not load or are empty,
    internal links to missing files, and anchors that name no element of their target page.

    ``base`` is the site's root URL (links outside it are external and not followed); ``fetch(url)``
    returns ``(status, body_bytes)`` for an internal URL that was not itself scanned.
    """
    problems: list[str] = []
    fetched: dict[str, tuple[int, bytes]] = {}

    def get(url: str) -> tuple[int, bytes]:
        if url not in fetched:
            fetched[url] = fetch(url)
        return fetched[url]

    def page_key(url: str) -> str:
        url = urldefrag(url)[0].split("?")[0]
        return url + "index.html" if url.endswith("/") else url

    for scan in scans.values():
        where = scan.url.removeprefix(base) or "index.html"
        problems += [f"{where}: console error: {err}" for err in scan.console_errors]
        problems += [f"{where}: loads a resource from another host: {url}"
                     for url in scan.external if not url.startswith(EXTERNAL_OK)]
        for src, width in scan.images:
            if not width:
                problems.append(f"{where}: image {src} did not load (naturalWidth 0)")
            if src.startswith(base):
                status, body = get(page_key(src))
                if status != 200 or not body:
                    problems.append(f"{where}: image {src} is missing or empty (HTTP {status}, "
                                    f"{len(body)} bytes)")
        for href in scan.links:
            if not href.startswith(base):
                continue  # external, mailto:, javascript: ...
            target, fragment = page_key(href), unquote(urldefrag(href)[1])
            if target in scans:
                ids = scans[target].ids
            else:
                status, body = get(target)
                if status != 200:
                    problems.append(f"{where}: broken link {href} (HTTP {status})")
                    continue
                ids = set(re.findall(rb'\bid="([^"]+)"', body)) if target.endswith(".html") else None
                ids = {i.decode() for i in ids} if ids is not None else None
            if fragment and ids is not None and fragment not in ids:
                problems.append(f"{where}: broken anchor {href}: no id {fragment!r} in "
                                f"{target.removeprefix(base)}")
    return problems


def test_guard_catches_broken_links_anchors_images_and_console_errors():
    """The guard fails a site with one of each fault, and passes the same site without them."""
    base = "http://site/"
    files = {base + "index.html": (200, b'<h1 id="top">x</h1>'), base + "img/ok.png": (200, b"PNG"),
             base + "img/empty.png": (200, b""), base + "other.html": (200, b'<p id="here">y</p>'),
             base + "dl/example.py": (200, b"print(1)")}
    fetch = lambda url: files.get(url, (404, b""))  # noqa: E731

    def site(**fault) -> dict[str, PageScan]:
        page = PageScan(base + "index.html", {"top"},
                        [base + "other.html#here", base + "#top", base + "dl/example.py",
                         "https://pytorch.org/docs", "mailto:x@example.org"],
                        [(base + "img/ok.png", 10)], [])
        for name, value in fault.items():
            getattr(page, name).append(value)
        return {page.url: page}

    assert site_problems(site(), base, fetch) == []
    faults = {
        "links": (base + "missing.html", "broken link"),
        "images": ((base + "img/empty.png", 5), "missing or empty"),
        "console_errors": ("Uncaught TypeError: x is undefined", "console error"),
        "external": ("https://code.jquery.com/jquery.js", "another host"),
        "external ": ("https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js", "another host"),
    }
    for field, (value, message) in faults.items():
        problems = site_problems(site(**{field.strip(): value}), base, fetch)
        assert len(problems) == 1 and message in problems[0], (field, problems)
    problems = site_problems(site(links=base + "other.html#nowhere"), base, fetch)
    assert len(problems) == 1 and "no id 'nowhere'" in problems[0], problems
    problems = site_problems(site(images=(base + "img/ok.png", 0)), base, fetch)
    assert len(problems) == 1 and "did not load" in problems[0], problems


# ------------------------------------------------------------------------------------------------
# Browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output for failures
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) in a thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _fetch(url: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


@contextlib.contextmanager
def browser(tmp_path: Path, base: str):
    """A headless Chromium (the distribution's) with a fresh profile, under Playwright. Requests to
    anything but ``base`` are blocked: the test is offline and the site must not need the network."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: install it with `apt-get install -y chromium` "
                    "(the browser test never downloads a browser of its own).")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport=DESKTOP)
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                      else route.abort("blockedbyclient"))
        try:
            yield context
        finally:
            context.close()


_SCAN_JS = """async () => {
  // Make lazy images load now, then wait for every image to finish (or fail).
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(done => {
    img.loading = "eager"; img.addEventListener("load", done); img.addEventListener("error", done);
    setTimeout(done, 5000);
  })));
  return {
    ids: Array.from(document.querySelectorAll("[id]"), e => e.id)
           .concat(Array.from(document.querySelectorAll("a[name]"), e => e.name)),
    links: Array.from(document.querySelectorAll("a[href]"), a => a.href),
    images: imgs.map(img => [img.currentSrc || img.src, img.naturalWidth]),
  };
}"""


def scan_page(page, url: str, base: str) -> PageScan:
    """Load ``url`` in ``page`` and read what it holds. Console errors, uncaught exceptions, failed
    requests and HTTP errors of this load are recorded as console errors; requests to other hosts
    (blocked by :func:`browser`) as external, along with the console errors they cause."""
    errors: list[str] = []
    external: list[str] = []

    def on_console(msg) -> None:
        source = (msg.location or {}).get("url", "")
        if msg.type == "error" and (source.startswith(base) or not source.startswith("http")):
            errors.append(f"{msg.text} ({source})" if source else msg.text)

    def on_request(request) -> None:
        if not request.url.startswith(base) and request.url.startswith("http"):
            external.append(request.url)

    def on_failed(request) -> None:
        if request.url.startswith(base):
            errors.append(f"request failed: {request.url} ({request.failure})")

    def on_response(response) -> None:
        if response.status >= 400:
            errors.append(f"HTTP {response.status}: {response.url}")

    on_error = lambda exc: errors.append(f"uncaught: {exc}")  # noqa: E731
    handlers = {"console": on_console, "pageerror": on_error, "request": on_request,
                "requestfailed": on_failed, "response": on_response}
    for event, handler in handlers.items():
        page.on(event, handler)
    try:
        response = page.goto(url, wait_until="load")
        if response is None or response.status != 200:
            errors.append(f"page answered HTTP {response.status if response else 'nothing'}")
        data = page.evaluate(_SCAN_JS)
    finally:
        for event, handler in handlers.items():
            page.remove_listener(event, handler)
    return PageScan(url, set(data["ids"]), data["links"],
                    [(src, width) for src, width in data["images"]], errors, external)


def crawl(page, base: str, limit: int = 500) -> dict[str, PageScan]:
    """Scan every page a reader can reach from the landing page (and the search page) by following
    the site's own links to its HTML pages (not downloads or sources). A page no toctree reaches
    cannot exist: the ``-W`` docs build fails on it. Files left over from older builds are not
    crawled, since nothing links to them."""
    scans: dict[str, PageScan] = {}
    # The search page is reached through the theme's search form, the indices through the search
    # page's links: start from them too.
    queue = [base + rel for rel in ("index.html", "search.html", "genindex.html", "py-modindex.html")
             if (SITE / rel).is_file()]
    while queue and len(scans) < limit:
        url = queue.pop(0)
        if url in scans:
            continue
        scans[url] = scan_page(page, url, base)
        for href in scans[url].links:
            target = urldefrag(href)[0].split("?")[0]
            rel = target.removeprefix(base)
            if (target.startswith(base) and rel.endswith(".html") and target not in scans
                    and not rel.startswith(("_sources/", "_downloads/", "_static/"))
                    and (SITE / unquote(rel)).is_file()):
                queue.append(target)
    return scans


def test_browser_every_page_loads_clean_with_images_and_links(tmp_path):
    """Every page: no console error, every image loads and is non-empty, no broken internal link."""
    _require("browser")
    with serve(SITE) as base, browser(tmp_path, base) as context:
        scans = crawl(context.new_page(), base)
        problems = site_problems(scans, base, _fetch)
    pages = sorted(url.removeprefix(base) for url in scans)
    for must in ("index.html", f"auto_examples/{MAIN_EXAMPLE}.html", "search.html", "api.html"):
        assert must in pages, f"{must} is not reachable from the landing page: {pages}"
    n_images = sum(len(s.images) for s in scans.values())
    n_links = sum(1 for s in scans.values() for h in s.links if h.startswith(base))
    assert not problems, f"{len(problems)} problems on {len(pages)} pages:\n" + "\n".join(problems)
    assert n_images > 0 and n_links > 0, (n_images, n_links)


def test_browser_search_finds_fully_shard(tmp_path):
    """The search page (Sphinx's client-side index, run by the browser) returns hits for fully_shard."""
    _require("browser")
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.goto(base + "search.html?q=fully_shard", wait_until="load")
        page.wait_for_function(  # results arrive page by page: wait for the search to finish
            "document.querySelectorAll('#search-results ul.search li').length > 0 && "
            "/found/i.test((document.querySelector('#search-results .search-summary') || "
            "{textContent: ''}).textContent)", timeout=60_000)
        hits = page.eval_on_selector_all("#search-results ul.search li a",
                                         "els => els.map(a => a.getAttribute('href'))")
    assert any(MAIN_EXAMPLE in h for h in hits), f"the main example is not among the hits: {hits}"


def test_browser_landing_and_example_fit_a_phone_and_screenshots(tmp_path):
    """The landing page and the main example: nothing wider than a phone screen, the theme's dark
    mode switch works, code has copy buttons; screenshots (desktop and phone) are saved."""
    _require("browser")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    targets = {"landing": "index.html", "example": f"auto_examples/{MAIN_EXAMPLE}.html"}
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        for name, rel in targets.items():
            page.set_viewport_size(DESKTOP)
            page.goto(base + rel, wait_until="load")
            page.screenshot(path=str(SCREENSHOTS / f"{name}-desktop.png"), full_page=True)
            assert page.locator("button.copybtn").count() > 0, f"{rel}: no copy buttons on code"

            page.set_viewport_size(PHONE)
            page.goto(base + rel, wait_until="load")
            too_wide = page.evaluate("""() => Array.from(document.querySelectorAll(
                  '.bd-article img')).filter(img => img.getBoundingClientRect().width >
                  document.documentElement.clientWidth + 1).map(img => img.src)""")
            assert not too_wide, f"{rel}: images wider than a {PHONE['width']} px screen: {too_wide}"
            overflow = page.evaluate("document.documentElement.scrollWidth - "
                                     "document.documentElement.clientWidth")
            assert overflow <= 1, f"{rel}: the page scrolls sideways by {overflow} px on a phone"
            page.screenshot(path=str(SCREENSHOTS / f"{name}-phone.png"), full_page=True)

        page.set_viewport_size(DESKTOP)
        page.goto(base + "index.html", wait_until="load")
        for mode in ("light", "dark"):  # the theme's own switch, as a reader uses it
            page.locator("button.theme-switch-button").first.click()
            page.locator(f"button.theme-change-button[data-mode={mode}]").first.click()
            theme = page.evaluate("document.documentElement.dataset.theme")
            assert theme == mode, f"choosing {mode} mode gave data-theme={theme!r}"
        page.screenshot(path=str(SCREENSHOTS / "landing-dark.png"))
    saved = sorted(p.name for p in SCREENSHOTS.glob("*.png"))
    assert {"landing-desktop.png", "example-desktop.png", "landing-phone.png",
            "example-phone.png"} <= set(saved), saved


WIDE = {"width": 1440, "height": 900}
#: The ``<pre>`` blocks matching ``select`` (less those inside ``skip``) that scroll sideways:
#: ``[pixels too wide, longest line]`` each.
_OVERFLOW_JS = """([select, skip]) => Array.from(document.querySelectorAll(select))
  .filter(pre => !skip || !pre.closest(skip))
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
  .map(pre => [pre.scrollWidth - pre.clientWidth,
               pre.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b)])"""
_PRINTED = ".sphx-glr-script-out, .cell_output"


def code_overflows(page) -> list:
    """Code blocks (not printed output) of the loaded page that scroll sideways: [pixels, longest line]."""
    return page.evaluate(_OVERFLOW_JS, [
        '.bd-article div[class*="highlight-"]:not(.sphx-glr-script-out) pre', _PRINTED])


def test_browser_example_code_fits_a_wide_screen(tmp_path):
    """On every example page at 1440 x 900, no code block scrolls sideways (phones may scroll)."""
    _require("browser")
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.set_viewport_size(WIDE)
        scrolling = {}
        for example in EXAMPLES:
            page.goto(base + f"auto_examples/{example.removesuffix('.py')}.html", wait_until="load")
            if bad := code_overflows(page):
                scrolling[example] = bad
    assert not scrolling, "code scrolls sideways at 1440 px:\n" + "\n".join(
        f"{name}: {len(bad)} blocks, e.g. {bad[0][0]} px too wide: {bad[0][1]!r}"
        for name, bad in scrolling.items())


def output_overflows(page) -> list:
    """Printed output blocks of the loaded page that scroll sideways: [pixels, longest line]."""
    return page.evaluate(_OVERFLOW_JS, [
        ".bd-article .sphx-glr-script-out pre, .bd-article .cell_output pre", None])


def test_browser_printed_output_fits_a_wide_screen(tmp_path):
    """On every page at 1440 x 900, no printed output scrolls sideways: tables are HTML tables
    (report.table), conclusions wrap, and what is left wraps at the column (guide.css)."""
    _require("browser")
    pages = [f"auto_examples/{e.removesuffix('.py')}.html" for e in EXAMPLES] + [
        str(p.relative_to(SITE)) for p in (SITE / "pages").glob("*.html")] + ["index.html"]
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.set_viewport_size(WIDE)
        scrolling = {}
        for name in pages:
            page.goto(base + name, wait_until="load")
            if bad := output_overflows(page):
                scrolling[name] = bad
    assert not scrolling, "printed output scrolls sideways at 1440 px:\n" + "\n".join(
        f"{name}: {len(bad)} blocks, e.g. {bad[0][0]} px too wide: {bad[0][1][:120]!r}"
        for name, bad in scrolling.items())


def test_browser_output_width_guard_catches_a_long_unbreakable_line(tmp_path):
    """Fault injection: printed output wider than its column (an unbreakable run, as a page
    without the site's CSS shows any long line) is reported; a short one is not."""
    _require("browser")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "wide.html").write_text(
        '<html><body><article class="bd-article" style="width:600px">'
        '<div class="sphx-glr-script-out"><div class="highlight-none"><pre>' + "o" * 400 +
        '</pre></div></div><div class="sphx-glr-script-out"><div class="highlight-none"><pre>'
        'short</pre></div></div></article></body></html>')
    with serve(tmp_path / "site") as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.goto(base + "wide.html", wait_until="load")
        bad = output_overflows(page)
    assert len(bad) == 1 and bad[0][1] == "o" * 400, bad


def test_browser_code_width_guard_catches_a_long_line(tmp_path):
    """Fault injection: a page whose code block has a long line is reported; a short one is not."""
    _require("browser")
    (tmp_path / "site").mkdir()
    line = "x = " + " + ".join(["value"] * 60)
    (tmp_path / "site" / "wide.html").write_text(
        '<html><body><article class="bd-article" style="width:600px">'
        f'<div class="highlight-Python"><pre>{line}\nshort = 1</pre></div>'
        '<div class="highlight-Python"><pre>short = 1</pre></div>'
        '<div class="sphx-glr-script-out"><div class="highlight-none"><pre>' + "o" * 400 +
        '</pre></div></div></article></body></html>')
    with serve(tmp_path / "site") as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.goto(base + "wide.html", wait_until="load")
        bad = code_overflows(page)
    assert len(bad) == 1 and bad[0][1] == line, bad


def test_browser_guard_catches_a_broken_page(tmp_path):
    """Fault injection, in the real browser: a page with a script error, a missing image, a broken
    link and a script from another host is reported on all four counts."""
    _require("browser")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(
        '<html><body><h1 id="top">broken</h1><img src="missing.png">'
        '<a href="nowhere.html">x</a><a href="#top">ok</a>'
        '<script src="https://code.jquery.com/jquery-3.7.0.js"></script>'
        "<script>undefinedFunction()</script></body></html>")
    with serve(site) as base, browser(tmp_path, base) as context:
        scans = {base + "index.html": scan_page(context.new_page(), base + "index.html", base)}
        problems = site_problems(scans, base, _fetch)
    text = "\n".join(problems)
    assert "undefinedFunction" in text, text
    assert "missing.png did not load" in text, text
    assert "broken link" in text and "nowhere.html" in text, text
    assert "another host: https://code.jquery.com/jquery-3.7.0.js" in text, text
    assert "#top" not in text, text  # the anchor that exists is fine


# ------------------------------------------------------------------------------------------------
# Lesson first (issue 24): the landing table's pick column on a phone, every drawn figure on its
# page, no empty sidebar, each topic's page first in search, the first code block plain torch.
# Each guard is a function of what the page holds, tested below on injected faults; the
# test_browser_* tests run it on the built site.


def drawn_figures(source: str) -> int:
    """How many figures a page's source draws (``plt.subplots(`` and ``plt.figure(`` calls): what
    sphinx-gallery and MyST-NB turn into images. A figure drawn in a loop would count once."""
    return source.count("plt.subplots(") + source.count("plt.figure(")


def _page_sources() -> dict[str, str]:
    """Built page (relative URL) -> the source it is built from: examples and notebook pages."""
    sources = {f"auto_examples/{name.removesuffix('.py')}.html": (ROOT / "examples" / name)
               for name in EXAMPLES}
    sources |= {f"pages/{p.stem}.html": p for p in (ROOT / "docs" / "pages").glob("*.md")}
    sources["index.html"] = ROOT / "docs" / "index.md"
    return {rel: path.read_text() for rel, path in sources.items()}


def figure_count_problems(expected: dict[str, int], loaded: dict[str, int]) -> list[str]:
    """Pages whose article shows another number of loaded figures than their source draws."""
    return [f"{rel}: draws {n} figure(s), the page shows {loaded.get(rel, 0)} that loaded"
            for rel, n in sorted(expected.items()) if loaded.get(rel, 0) != n]


def test_figure_count_guard_catches_a_missing_figure() -> None:
    assert drawn_figures("fig, ax = plt.subplots()\nplt.figure()\n") == 2
    assert figure_count_problems({"a.html": 1, "b.html": 0}, {"a.html": 1}) == []
    problems = figure_count_problems({"a.html": 2, "b.html": 1}, {"a.html": 1})
    assert problems == ["a.html: draws 2 figure(s), the page shows 1 that loaded",
                        "b.html: draws 1 figure(s), the page shows 0 that loaded"]


#: Loaded images of a page's article, not counting the gallery cards' thumbnails.
_FIGURES_JS = """async () => {
  const imgs = Array.from(document.querySelectorAll('.bd-article img'))
    .filter(img => !img.closest('.sphx-glr-thumbcontainer'));
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(done => {
    img.loading = "eager"; img.addEventListener("load", done); img.addEventListener("error", done);
    setTimeout(done, 5000);
  })));
  return imgs.filter(img => img.naturalWidth > 0).length;
}"""


def test_browser_every_page_shows_the_figures_it_draws(tmp_path):
    """Every example and notebook page: as many loaded figures as its source draws."""
    _require("browser")
    expected = {rel: drawn_figures(src) for rel, src in _page_sources().items()}
    loaded = {}
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        for rel in expected:
            page.goto(base + rel, wait_until="load")
            loaded[rel] = page.evaluate(_FIGURES_JS)
    problems = figure_count_problems(expected, loaded)
    assert not problems, "\n".join(problems)


def empty_sidebar(html: str) -> bool:
    """True if the page has pydata-sphinx-theme's "Section Navigation" sidebar with no link in it
    (a page that is its own top-level section, with no children)."""
    nav = re.search(r'<nav class="bd-docs-nav[^"]*"[^>]*>(.*?)</nav>', html, re.S)
    return nav is not None and "<a " not in nav.group(1)


def test_empty_sidebar_guard_catches_a_sidebar_without_links() -> None:
    empty = ('<nav class="bd-docs-nav bd-links" aria-label="Section Navigation">'
             '<p class="bd-links__title">Section Navigation</p><div class="bd-toc-item">'
             '</div></nav>')
    full = empty.replace('<div class="bd-toc-item">', '<div class="bd-toc-item"><ul><li>'
                         '<a class="reference internal" href="x.html">X</a></li></ul>')
    assert empty_sidebar(empty) and not empty_sidebar(full)
    assert not empty_sidebar("<main>no sidebar at all</main>")


def test_browser_no_page_has_an_empty_sidebar():
    """No built page shows an empty "Section Navigation" sidebar (the files, as served)."""
    _require("browser")
    pages = [p for p in SITE.rglob("*.html") if not p.relative_to(SITE).parts[0].startswith("_")]
    empty = sorted(str(p.relative_to(SITE)) for p in pages if empty_sidebar(p.read_text()))
    assert pages and not empty, f"empty Section Navigation sidebar on: {empty}"


#: The landing table's columns as a phone shows them: [header text, left, right] in CSS pixels.
_TABLE_COLUMNS_JS = """() => {
  const table = Array.from(document.querySelectorAll('.bd-article table'))
    .find(t => /pick/i.test((t.querySelector('th') || {textContent: ''}).textContent));
  if (!table) return null;
  return Array.from(table.querySelectorAll('tr:first-child th')).map(th => {
    const r = th.getBoundingClientRect();
    return [th.textContent.trim(), r.left, r.right];
  });
}"""


def pick_column_problems(columns: list | None, viewport_width: int) -> list[str]:
    """What keeps the landing table's pick column from being read on a phone without scrolling
    sideways: no such table, the pick not the first column, or that column outside the screen."""
    if not columns:
        return ["no table whose first header says 'pick' on the landing page"]
    name, left, right = columns[0]
    if "pick" not in name.lower():
        return [f"the first column is {name!r}, not the pick"]
    if left < 0 or right > viewport_width:
        return [f"the pick column spans {left:.0f}-{right:.0f} px, outside a "
                f"{viewport_width} px screen"]
    return []


def test_pick_column_guard_catches_a_pick_off_screen() -> None:
    assert pick_column_problems([["pick", 16, 120], ["model", 120, 300]], 390) == []
    assert "not the pick" in pick_column_problems([["model", 16, 120], ["pick", 700, 800]], 390)[0]
    assert "outside a 390 px" in pick_column_problems([["pick", 300, 460]], 390)[0]
    assert "no table" in pick_column_problems(None, 390)[0]


def test_browser_landing_pick_column_is_on_a_phone_screen(tmp_path):
    """At 390 px the landing table's pick column is in view without scrolling sideways."""
    _require("browser")
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.set_viewport_size(PHONE)
        page.goto(base + "index.html", wait_until="load")
        columns = page.evaluate(_TABLE_COLUMNS_JS)
    problems = pick_column_problems(columns, PHONE["width"])
    assert not problems, problems


#: A topic's name -> its own page, which must be the first search result.
SEARCH_FIRST = {"reshard_after_forward": "auto_examples/plot_reshard_after_forward.html",
                "out of memory": "auto_examples/plot_oom_ddp_vs_fsdp2.html",
                "OOM": "auto_examples/plot_oom_ddp_vs_fsdp2.html",
                "prefetch": "auto_examples/plot_prefetch_and_units.html",
                "loss normalisation": "auto_examples/plot_loss_normalisation.html",
                "cast_forward_inputs": "auto_examples/plot_mixed_precision_pitfalls.html",
                "output_dtype": "auto_examples/plot_mixed_precision_pitfalls.html",
                "tied weights": "auto_examples/plot_choosing_units.html",
                "reduce-scatter size": "auto_examples/plot_choosing_units.html",
                "CPUOffloadPolicy": "auto_examples/plot_cpu_offload.html",
                "set_requires_gradient_sync": "auto_examples/plot_gradient_accumulation.html",
                "shard_placement_fn": "auto_examples/plot_experts_mesh.html",
                "experts": "auto_examples/plot_experts_mesh.html",
                "DDP to FSDP2": "auto_examples/plot_ddp_to_fsdp2.html",
                "switch from DDP": "auto_examples/plot_ddp_to_fsdp2.html",
                # issues 35 and 36: each API name and error a user searches for, its page first
                "set_modules_to_forward_prefetch": "auto_examples/plot_prefetch_and_units.html",
                "set_modules_to_backward_prefetch": "auto_examples/plot_prefetch_and_units.html",
                "set_reduce_scatter_unused_params": "auto_examples/plot_when_fsdp2_breaks.html",
                "register_fsdp_forward_method": "auto_examples/plot_when_fsdp2_breaks.html",
                "hang": "auto_examples/plot_when_fsdp2_breaks.html",
                "set_reshard_after_backward": "auto_examples/plot_gradient_accumulation.html",
                "set_is_last_backward": "auto_examples/plot_gradient_accumulation.html",
                "sync_module_states": "auto_examples/plot_fsdp1_migration.html",
                "summon_full_params": "auto_examples/plot_fsdp1_migration.html",
                "expandable_segments": "auto_examples/plot_oom_ddp_vs_fsdp2.html",
                "timeout": "auto_examples/plot_when_fsdp2_breaks.html",
                "generate": "auto_examples/plot_when_fsdp2_breaks.html",
                "mixed torch.Tensor and DTensor": "auto_examples/plot_when_fsdp2_breaks.html",
                "set_reshard_after_forward": "auto_examples/plot_prefetch_and_units.html",
                "set_gradient_divide_factor": "auto_examples/plot_loss_normalisation.html",
                "set_requires_all_reduce": "auto_examples/plot_gradient_accumulation.html"}
#: Pages that must not crowd the top of a result list.
SEARCH_LOW = ("pages/ledger.html", "api.html")


def search_rank_problems(query: str, hits: list[str], first: str) -> list[str]:
    """What is wrong with a result list (hrefs, best first) for ``query``: its topic page ``first``
    not first, or the ledger or the API page among the top three."""
    pages = [urldefrag(h)[0] for h in hits]
    problems = []
    if not pages or pages[0] != first:
        problems.append(f"{query!r}: first hit is {pages[:1]}, not {first} "
                        f"(at {pages.index(first) + 1 if first in pages else 'no'} rank)")
    problems += [f"{query!r}: {low} is among the first three hits" for low in SEARCH_LOW
                 if low in pages[:3]]
    return problems


def test_search_rank_guard_catches_a_topic_page_ranked_low() -> None:
    good = ["auto_examples/plot_oom_ddp_vs_fsdp2.html", "pages/glossary.html#x",
            "auto_examples/plot_hsdp.html", "pages/ledger.html"]
    first = "auto_examples/plot_oom_ddp_vs_fsdp2.html"
    assert search_rank_problems("out of memory", good, first) == []
    bad = ["pages/glossary.html#x", "api.html", first]
    problems = search_rank_problems("out of memory", bad, first)
    assert len(problems) == 2 and "at 3 rank" in problems[0] and "api.html" in problems[1]


def test_browser_search_ranks_each_topic_page_first(tmp_path):
    """Searching a topic's name lists its own page first, the ledger and API page below the top."""
    _require("browser")
    problems = []
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        for query, first in SEARCH_FIRST.items():
            page.goto(base + "search.html?q=" + query.replace(" ", "+"), wait_until="load")
            page.wait_for_function(
                "/found/i.test((document.querySelector('#search-results .search-summary') || "
                "{textContent: ''}).textContent)", timeout=60_000)
            hits = page.eval_on_selector_all("#search-results ul.search li a",
                                             "els => els.map(a => a.getAttribute('href'))")
            problems += search_rank_problems(query, hits, first)
    assert not problems, "\n".join(problems)


MATH_PAGE = "auto_examples/plot_mixed_precision.html"  # a page with math (u = 2^-8 ...)


def test_browser_math_renders_offline(tmp_path):
    """Math is typeset by the site's own MathJax with the network blocked (no raw TeX left)."""
    _require("browser")
    with serve(SITE) as base, browser(tmp_path, base) as context:
        page = context.new_page()
        page.goto(base + MATH_PAGE, wait_until="load")
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0",
                               timeout=30_000)
        raw = page.evaluate("Array.from(document.querySelectorAll('.math')).filter(e => "
                            "!e.querySelector('mjx-container')).length")
    assert raw == 0, f"{raw} math elements on {MATH_PAGE} were not typeset"


#: Per example, the call its lesson is about: the page's first code block must contain it.
#: Each example's key API, as its guide.Page(key_api=...) declaration names it: the call its first
#: code block must contain.
KEY_API = {p.name: declared_page(p).key_api for p in sorted((ROOT / "examples").glob("plot_*.py"))}
#: The example pages whose first code block is checked live: every page opens lesson-first.
LESSON_FIRST: tuple[str, ...] = tuple(KEY_API)
#: Packages besides torch that a page's first block may import, each because the lesson is about it:
#: the fine-tuning page exports and loads one safetensors file, the format the ecosystem loads.
EXTRA_IMPORTS = {"plot_finetune_lora.py": ("safetensors",)}

_CODE_BLOCK = re.compile(
    r'<div class="highlight-(?:Python|python|ipython3)[^"]*">.*?<pre>(.*?)</pre>', re.S)
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)


def first_code_block_problems(page: str, key_api: str, extra: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with an example page's first code block (after its title and verdict, which
    are prose): it must import from ``torch`` only (or a package in ``extra`` that the lesson is
    about: what a reader copies without this package) and contain the page's key API call
    ``key_api``. ``page`` is the built page's HTML."""
    import html as html_lib

    article = page.split('class="bd-article"', 1)[-1]
    block = _CODE_BLOCK.search(article)
    if block is None:
        return ["no code block on the page"]
    code = html_lib.unescape(re.sub(r"<[^>]+>", "", block.group(1)))
    problems = [f"imports {mod} (the first code block imports torch only)"
                for m in _IMPORT.finditer(code) for mod in [m.group(1) or m.group(2)]
                if mod.split(".")[0] not in ("torch", *extra)]
    if key_api not in code:
        problems.append(f"does not call {key_api} (the page's key API)")
    return problems


def test_first_code_block_guard_catches_guide_imports_and_a_missing_call() -> None:
    def page(code: str) -> str:
        code = code.replace("<", "&lt;").replace(">", "&gt;")
        return ('<h1>Title</h1><article class="bd-article"><div class="admonition tip"><p>Use '
                'FSDP2 when...</p></div><div class="highlight-Python notranslate"><div '
                f'class="highlight"><pre><span class="kn">{code}</span></pre></div></div>'
                '<div class="highlight-Python notranslate"><div class="highlight"><pre>'
                'from guide import checks</pre></div></div></article>')

    lesson = ("import torch\nfrom torch.distributed.fsdp import fully_shard\n"
              "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)\n")
    assert first_code_block_problems(page(lesson), "fully_shard(") == []
    wrapped = "import guide\nfrom guide import sharding\nsharding.apply_fsdp2(model, mesh)\n"
    assert first_code_block_problems(page(wrapped), "fully_shard(") == [
        "imports guide (the first code block imports torch only)",
        "imports guide (the first code block imports torch only)",
        "does not call fully_shard( (the page's key API)"]
    assert first_code_block_problems("<p>prose only</p>", "fully_shard(") == [
        "no code block on the page"]
    exported = "import safetensors.torch\n" + lesson  # a package the lesson is about
    assert first_code_block_problems(page(exported), "fully_shard(", ("safetensors",)) == []
    assert first_code_block_problems(page(exported), "fully_shard(") == [
        "imports safetensors.torch (the first code block imports torch only)"]


def test_every_example_names_its_key_api() -> None:
    assert sorted(KEY_API) == EXAMPLES
    assert set(LESSON_FIRST) <= set(KEY_API) and set(EXTRA_IMPORTS) <= set(KEY_API)


def test_browser_first_code_block_is_the_plain_torch_lesson():
    """On every page in LESSON_FIRST: the first code block is plain torch with the key call."""
    _require("browser")
    problems = {name: first_code_block_problems(
        (SITE / "auto_examples" / name.replace(".py", ".html")).read_text(), KEY_API[name],
        EXTRA_IMPORTS.get(name, ())) for name in LESSON_FIRST}
    problems = {name: p for name, p in problems.items() if p}
    assert not problems, problems


# ------------------------------------------------------------------------------------------------
# Downloads


def _downloads() -> dict[str, Path]:
    """The built site's download files by name (sphinx-gallery puts each in a hashed folder)."""
    return {p.name: p for p in (SITE / "_downloads").glob("*/*") if p.is_file()}


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new virtual environment with only this package (non-editable, from ``constraints.txt``) and
    a Jupyter kernel: what a reader who downloads an example has."""
    _require("downloads")
    venv = tmp_path_factory.mktemp("reader") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Built from a copy of the sources: a build in the checkout writes build/ and src/*.egg-info,
    # which a nox session installing at the same time (CI's compat lane) writes too.
    source = venv.parent / "source"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c",
                    str(ROOT / "constraints.txt"), str(source), "ipykernel", "nbclient", "nbformat"],
                   check=True, cwd=venv.parent, timeout=900)
    check = subprocess.run([str(python), "-c", "import guide, sys; print(guide.__file__)"],
                           capture_output=True, text=True, check=True, cwd=venv.parent)
    assert str(venv) in check.stdout, f"guide imported from outside the venv: {check.stdout}"
    return python


def _reader_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    return env


def _selected_examples() -> list[str]:
    """Examples whose downloads are run: all of them, or with ``GUIDE_DOWNLOADS=main`` only the main
    example (CI: every example already runs in the docs build; this checks what a reader gets)."""
    if os.environ.get("GUIDE_DOWNLOADS") == "main":
        return [f"{MAIN_EXAMPLE}.py"]
    return EXAMPLES


def test_download_zips_hold_every_example_unchanged():
    """The two zips hold one script and one notebook per example, byte-equal to the single downloads."""
    _require("downloads")
    files = _downloads()
    stems = [Path(e).stem for e in EXAMPLES]
    for zip_name, ext in (("auto_examples_python.zip", ".py"), ("auto_examples_jupyter.zip", ".ipynb")):
        assert zip_name in files, f"{zip_name} is not among the site's downloads: {sorted(files)}"
        with zipfile.ZipFile(files[zip_name]) as zf:
            members = {Path(n).name: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
        missing = sorted({s + ext for s in stems} - set(members))
        extra = sorted(set(members) - {s + ext for s in stems})
        assert not missing and not extra, (
            f"{zip_name} does not match examples/: missing {missing}, unexpected {extra} "
            "(is the site built from this checkout?)")
        for name, data in members.items():
            assert name in files, f"{name} is in {zip_name} but not downloadable on its own"
            assert files[name].read_bytes() == data, f"{zip_name}: {name} differs from its download"


@pytest.mark.timeout(1500)  # the module's fresh venv (pip: <= 900 s) + the script (<= 600 s)
@pytest.mark.parametrize("example", _selected_examples())
def test_download_script_runs_in_a_fresh_venv(example, fresh_venv, tmp_path):
    """The downloaded ``.py`` runs with ``python`` in the reader's venv and its asserts pass."""
    src = _downloads().get(example)
    assert src is not None, f"{example} is not among the site's downloads"
    script = tmp_path / example
    shutil.copy(src, script)
    proc = subprocess.run([str(fresh_venv), script.name], cwd=tmp_path, env=_reader_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{example} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"


_RUN_NOTEBOOK = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
print("cells executed:", sum(c.cell_type == "code" for c in nb.cells))
"""


@pytest.mark.timeout(1800)  # the module's fresh venv (pip: <= 900 s) + the notebook (<= 900 s)
@pytest.mark.parametrize("example", _selected_examples())
def test_download_notebook_executes_in_a_fresh_venv(example, fresh_venv, tmp_path):
    """The downloaded ``.ipynb`` executes top to bottom (nbclient, the venv's kernel) without a
    ``CellExecutionError``."""
    name = Path(example).stem + ".ipynb"
    src = _downloads().get(name)
    assert src is not None, f"{name} is not among the site's downloads"
    shutil.copy(src, tmp_path / name)
    proc = subprocess.run([str(fresh_venv), "-c", _RUN_NOTEBOOK, name], cwd=tmp_path,
                          env=_reader_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "cells executed" in proc.stdout, \
        f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


# ------------------------------------------------------------------------------------------------
# The Slurm script of "Run it on your cluster"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_sbatch(script_arg: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the batch script as Slurm would on one node (``srun``/``scontrol`` are stand-ins)."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[[ "$*" == "show hostnames "* ]] && '
                                      'echo localhost\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2",
           "SLURM_CPUS_PER_TASK": "2", "SLURM_JOB_ID": "4242", "MASTER_PORT": str(_free_port()),
           "MPLBACKEND": "Agg"}
    return subprocess.run(["bash", str(SLURM_SCRIPT), script_arg.name], cwd=script_arg.parent,
                          env=env, capture_output=True, text=True, timeout=300)


def test_slurm_script_runs_the_main_example_under_torchrun(tmp_path):
    """The cluster page's batch script starts torchrun with one rank per GPU slot, and the main example
    passes its checks under it (2 CPU ranks, gloo: the torchrun path of guide.launch)."""
    example = tmp_path / f"{MAIN_EXAMPLE}.py"
    shutil.copy(ROOT / "examples" / example.name, example)
    proc = _run_sbatch(example, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the batch script failed ({proc.returncode}):\n{out[-6000:]}"
    assert "nodes=1 ranks/node=2" in out, out[-3000:]
    assert "All checks passed" in proc.stdout, proc.stdout[-3000:]


def test_slurm_script_fails_when_a_rank_fails(tmp_path):
    """A rank that fails makes the batch job fail (Slurm would mark it FAILED), not pass silently."""
    script = tmp_path / "fails.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    proc = _run_sbatch(script, tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
