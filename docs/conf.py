"""Sphinx configuration: sphinx-gallery runs every example, MyST-NB executes every notebook page.

A failing assertion in any example makes ``sphinx-build`` exit non-zero (sphinx-gallery's default);
``-W`` turns every warning into an error too. Nothing on the site is typed by hand: it is computed here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import sys

import guide

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # gallery_order (the story order of the examples), one_page

# The one-page site (nox -s page -- plot_x, GUIDE_ONLY=plot_x; docs/one_page.py): only that example,
# run on every build, with its own checks; a bad name fails here, naming the choices. Without
# GUIDE_ONLY this is the whole site, as strict as ever.
import one_page  # noqa: E402  (sys.path above)

try:
    ONLY = one_page.from_environment(HERE.parent / "examples")
except ValueError as err:
    raise RuntimeError(str(err)) from None

project = "DDP vs FSDP2, measured"
author = "The guide authors"
copyright = "2026, the guide authors"
release = version = "0.1"

# MathJax from the site itself (sphinx-mathjax-offline, in the docs extra): without it Sphinx would
# load MathJax from a CDN and math would show as raw TeX offline.
if importlib.util.find_spec("sphinx-mathjax-offline") is None:
    raise RuntimeError("sphinx-mathjax-offline is not installed: `pip install -c constraints.txt "
                       "-e '.[docs]'` (or `pip install sphinx-mathjax-offline==0.0.2`).")

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "sphinx_copybutton",
    "ledger_ext",
    # MathJax served from this site (_static/mathjax), not a CDN: math renders offline.
    "sphinx-mathjax-offline",
    "world_sizes_ext",
]

# sphinx-gallery writes a .ipynb next to each generated page; without this exclusion Sphinx finds two
# sources for one document and MyST-NB would execute the notebook a second time.
exclude_patterns = ["_build", "auto_examples/**.ipynb", "jupyter_execute", "**.ipynb_checkpoints",
                    "_landing_sections.rst"]

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    # The order of the story, not of file names: the page the site is named after comes first.
    "within_subsection_order": "gallery_order.StoryOrder",
    # The landing page's cards (minigallery) in the same order.
    "minigallery_sort_order": "gallery_order.story_position",
    "ignore_pattern": r"__init__\.py|/_",
    # Figures, then the tables report.show displayed in the block (an HTML table wherever it
    # stands in a cell; sphinx-gallery alone shows only a cell's last value).
    "image_scrapers": ("matplotlib", "guide.report.gallery_scraper"),
    "reset_modules": ("matplotlib",),
    "min_reported_time": 1,
    "download_all_examples": True,
    "remove_config_comments": True,
    # Re-run an example when guide changes, not only when the example does (see _stale_examples).
    "run_stale_examples": False,
    # Code links: sphinx-gallery (0.22+; its old ``reference_url`` is ignored) links names in example
    # code to this site's API pages (``guide``, works offline) and, through ``intersphinx_mapping``
    # below, torch and Python names to their docs when those inventories are reachable.
    # Where the landing page's minigallery looks examples up (kept inside the ignored gallery dir).
    "backreferences_dir": "auto_examples/backreferences",
    "doc_module": ("guide",),
    # The execution-times pages load jQuery and DataTables from CDNs (broken offline, and the only
    # third-party scripts on the site); each example page still shows its own running time.
    "write_computation_times": False,
}

# MyST-NB: execute notebook pages on every build from a cache keyed by their content; a failing cell
# fails the build.
nb_execution_mode = "cache"
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_show_tb = True
myst_enable_extensions = ["dollarmath", "colon_fence"]
# Markdown a cell displays (display(Markdown(...))) is parsed as MyST: tables, roles and links work.
nb_render_markdown_format = "myst"



def _reachable(url: str, timeout: float = 3.0) -> bool:
    """True if ``url`` answers; the build must pass offline, so links need a reachable inventory."""
    import urllib.request

    if os.environ.get("GUIDE_OFFLINE"):
        return False
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except OSError:
        return False


_INVENTORIES = {
    "python": "https://docs.python.org/3",
    "torch": "https://docs.pytorch.org/docs/stable",
}
# Link torch and Python names to their docs when the inventories can be fetched; offline, build
# without those links rather than fail on an unreachable inventory. The one-page site fetches none
# (the loop stays fast and offline; links are not among its checks).
intersphinx_mapping = {name: (url, None) for name, url in _INVENTORIES.items()
                       if not ONLY and _reachable(f"{url}/objects.inv")}
# A local copy of an inventory (e.g. GUIDE_INVENTORY_TORCH=/path/objects.inv) links offline too.
for _name, _url in _INVENTORIES.items():
    if os.environ.get(f"GUIDE_INVENTORY_{_name.upper()}"):
        intersphinx_mapping[_name] = (_url, os.environ[f"GUIDE_INVENTORY_{_name.upper()}"])
intersphinx_timeout = 5

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "pydata_sphinx_theme"
html_title = "DDP vs FSDP2, measured"
html_static_path = ["_static"]
html_css_files = ["guide.css"]  # figures fit a phone-width screen
# Search ranks each topic's own page first for its name, the ledger and the API page last.
html_search_scorer = str(HERE / "_static" / "search_scorer.js")
# Pages with no section of their own (the guide pages, the API page) get no empty "Section
# Navigation" sidebar; the top navigation and the page's own table of contents remain.
html_sidebars = {"index": [], "pages/*": [], "api": [], "search": [], "genindex": [],
                 "py-modindex": []}
html_theme_options = {
    # The examples, the memory calculator and the two first-read pages in the header; the rest
    # under "More".
    "header_links_before_dropdown": 4,
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc", "sourcelink"],
    # Search and the light/dark switch are pydata-sphinx-theme's own; keep both in the header.
    "navbar_persistent": ["search-button"],
    "navbar_end": ["theme-switcher", "navbar-icon-links"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
# Follow the reader's system light/dark preference until they pick one; without it, a first visit
# logs "Got invalid theme mode" in the browser console.
html_context = {"default_mode": "auto"}
# Copy buttons (sphinx-copybutton) copy commands without their prompts or outputs.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


def _invalidate_on_guide_change() -> None:
    """Make a change to ``guide`` re-run every example and notebook page.

    sphinx-gallery skips an example whose own file is unchanged (its ``.md5``) and MyST-NB reuses a
    notebook whose cells are unchanged; neither notices that the code they import changed. The pages
    all import ``guide``, so a new fingerprint of its sources drops both caches: no stale page passes.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(guide.__file__).parent.rglob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    stamp = HERE / "auto_examples" / ".guide-fingerprint"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    for md5 in (HERE / "auto_examples").rglob("*.md5"):
        md5.unlink()
    shutil.rmtree(nb_execution_cache_path, ignore_errors=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest.hexdigest())


if ONLY:
    sphinx_gallery_conf = one_page.gallery_conf(sphinx_gallery_conf, ONLY)
    include_patterns = one_page.include_patterns(ONLY)
    root_doc = one_page.root_doc(ONLY)
    ledger_claim_hint = one_page.claim_hint(ONLY)
    one_page.always_rerun(ONLY, HERE)
else:
    _invalidate_on_guide_change()

# Execution-times pages left by builds from before ``write_computation_times`` was turned off.
for _stale in (HERE / "sg_execution_times.rst", HERE / "auto_examples" / "sg_execution_times.rst"):
    _stale.unlink(missing_ok=True)


# The ledger of claims (guide.claims, checked by the ledger_ext extension in this directory): every
# page records the numbers it states; pages/ledger is read last and lists them; the build fails if
# two records of one claim disagree.
ledger_dir = str(HERE / "_build" / "ledger")
ledger_page = "pages/ledger"
# After the build, every rendered page is scanned for numbers its ledger lacks (guide.rendered):
# "strict" (the site's setting: every page records what it prints) fails the build naming page and
# number; "report" only writes _build/unrecorded.json and a one-line summary; "off" skips it.
ledger_scan = "strict"



# The gallery in sections (gallery_order.SECTIONS, the one list): the landing page includes their
# cards, and sphinx-gallery's generated index is rewritten into them after it is written, so its
# captioned toctrees give the sidebar's section navigation the same groups.
import gallery_order  # noqa: E402  (sys.path above)

(HERE / "_landing_sections.rst").write_text(gallery_order.landing_rst())


def _section_the_gallery(app) -> None:
    index = Path(app.srcdir) / "auto_examples" / "index.rst"
    text = index.read_text()
    sectioned = gallery_order.sectioned_index(text)
    if sectioned != text:
        index.write_text(sectioned)


def _tidy_gallery_rst(app, docname: str, source: list[str]) -> None:
    if docname.startswith("auto_examples/"):
        source[0] = gallery_order.without_empty_code_blocks(
            gallery_order.without_fault_points(source[0]))


def setup(app):
    if ONLY:
        one_page.setup(app, ONLY, HERE.parent / "examples")
    app.connect("source-read", _tidy_gallery_rst)
    # After sphinx-gallery's generate_gallery_rst (builder-inited, priority 500) wrote the index.
    app.connect("builder-inited", _section_the_gallery, priority=600)
