"""The one-page site: ``nox -s page -- plot_x`` (``GUIDE_ONLY=plot_x``) builds a Sphinx site of that
example alone, with the site's checks, in its own folder (``docs/_build/page-plot_x``).

``docs/conf.py`` reads :data:`ENV` and, when it names examples, applies this module:

* **What is built.** sphinx-gallery finds and runs only the named examples
  (:func:`gallery_conf`: ``ignore_pattern`` drops every other file, ``filename_pattern`` runs the
  named ones); Sphinx reads only their generated pages (:func:`include_patterns`): no MyST page, no
  other example's page left by an earlier build, no gallery index, no ledger page. The first named
  example is the site's root document; a second one (a page whose claims the first cites) is an
  orphan page beside it. A name that is not an example fails at once, naming the choices
  (:func:`pages`).
* **Always re-run.** The named examples lose their sphinx-gallery ``.md5`` on every build
  (:func:`always_rerun`), whatever changed, and their pages are read and written again (their
  claim roles resolve from this run's ledger); the full build's fingerprint of ``guide`` is left
  alone (the full build re-runs every page after a change to ``guide``).
* **The page's own checks, all of them**: the ledger extension (claim roles resolved, two records
  of one claim that disagree fail), the strict scan of every rendered number against the page's
  ledger, every recorded table on its page. The ledger is the one-page site's own, emptied on each
  build (:func:`ledger_dir`), so no record of another build or page answers for this one.
* **Cross-page checks become one-page ones.** A link (``:doc:``, ``:ref:``) to a page of the full
  site that is not built here renders as its text, marked ``not-built``
  (:func:`resolve_unbuilt`); a link to a page or label that the full site does not have either
  still fails. A claim that no built page records fails as in the full build, and the message says
  how to build the page that records it with this one.

``nox -s docs`` (no :data:`ENV`) is untouched by all of this: it stays the test of the whole site.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from collections.abc import Iterable
from pathlib import Path


#: The environment variable naming the example(s) of a one-page site: ``plot_x`` or
#: ``plot_x,plot_y`` (the first is the root page).
ENV = "GUIDE_ONLY"
DOCS = Path(__file__).resolve().parent
EXAMPLES = DOCS.parent / "examples"
GALLERY = "auto_examples"
#: The class of a link to a page this one-page site does not build (rendered as its text).
NOT_BUILT = "not-built"


def choices(examples_dir: Path = EXAMPLES) -> list[str]:
    """The examples a one-page site can be made of: ``plot_*.py`` stems, sorted."""
    return sorted(p.stem for p in Path(examples_dir).glob("plot_*.py"))


def pages(value: str, examples_dir: Path = EXAMPLES, asked: str = "") -> tuple[str, ...]:
    """The example stems ``value`` names (``plot_x``, ``plot_x.py``, ``examples/plot_x.py``,
    several separated by commas or spaces), each checked: an unknown or empty name is a
    ``ValueError`` naming every choice (``asked``: how the user said it, by default
    ``GUIDE_ONLY=...``)."""
    known = choices(examples_dir)
    asked = asked or f"{ENV}={value!r}"
    names = [Path(n).name.removesuffix(".py") for n in re.split(r"[,\s]+", value.strip()) if n]
    if not names:
        raise ValueError(f"{asked} names no example; give one of: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{asked}: no example {', '.join(repr(n) for n in unknown)} in "
                         f"{examples_dir}; give one of: {', '.join(known)}")
    return tuple(dict.fromkeys(names))  # in order, once each


def gallery_conf(conf: dict, only: Iterable[str]) -> dict:
    """``sphinx_gallery_conf`` for a site of ``only``: every other file of the examples folder
    ignored (sphinx-gallery matches ``ignore_pattern`` against the bare file name), the named ones
    executed (``filename_pattern``, against the path), no zips of all examples."""
    alternatives = "|".join(re.escape(f"{stem}.py") for stem in only)
    others = rf"^(?!(?:{alternatives})$)"  # any file name but the named ones
    ignored = conf.get("ignore_pattern") or ""
    return {**conf,
            "ignore_pattern": f"{ignored}|{others}" if ignored else others,
            "filename_pattern": rf"(?:^|[/\\])(?:{alternatives})$",
            "download_all_examples": False}


def selected(conf: dict, examples_dir: Path = EXAMPLES) -> list[str]:
    """The examples sphinx-gallery would render and run under ``conf``, as it decides (its
    ``ignore_pattern`` on the file name, then ``filename_pattern`` on the path)."""
    found = sorted(p for p in Path(examples_dir).iterdir() if p.suffix == ".py")
    return [p.stem for p in found if re.search(conf["ignore_pattern"], p.name) is None
            and re.search(conf["filename_pattern"], str(p))]


def include_patterns(only: Iterable[str]) -> list[str]:
    """The documents Sphinx reads: the named examples' generated pages, nothing else."""
    return [f"{GALLERY}/{stem}.rst" for stem in only]


def root_doc(only: Iterable[str]) -> str:
    """The first named example is the site's root document."""
    return f"{GALLERY}/{next(iter(only))}"


def always_rerun(only: Iterable[str], srcdir: Path = DOCS) -> None:
    """Drop the named examples' sphinx-gallery checksums: they run on every one-page build."""
    for stem in only:
        (Path(srcdir) / GALLERY / f"{stem}.py.md5").unlink(missing_ok=True)


def ledger_dir(doctreedir: str | Path) -> Path:
    """The one-page site's own ledger, beside its doctrees, emptied: this build's pages re-run and
    record again, and nothing another build recorded can answer a claim or the scan."""
    directory = Path(doctreedir) / "ledger"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def _doc_exists(docname: str, srcdir: Path, examples_dir: Path) -> bool:
    """Whether the full site has the document ``docname`` (a MyST or rST page, an example's page,
    the gallery index)."""
    if docname.startswith(f"{GALLERY}/"):
        stem = docname.removeprefix(f"{GALLERY}/")
        return stem == "index" or (Path(examples_dir) / f"{stem}.py").is_file()
    return any((Path(srcdir) / f"{docname}{ext}").is_file() for ext in (".md", ".rst"))


def _label_page(label: str, srcdir: Path, examples_dir: Path) -> str | None:
    """The document of the full site that defines ``label`` (sphinx-gallery's
    ``sphx_glr_auto_examples_<stem>.py``, an rST ``.. _label:`` or a MyST ``(label)=``), or None."""
    m = re.fullmatch(rf"sphx_glr_{GALLERY}_(?P<stem>\w+)\.py", label)
    if m and (Path(examples_dir) / f"{m['stem']}.py").is_file():
        return f"{GALLERY}/{m['stem']}"
    rst = re.compile(rf"^\s*(?:#\s*)?\.\. _{re.escape(label)}:\s*$", re.M | re.I)
    myst = re.compile(rf"^\({re.escape(label)}\)=\s*$", re.M | re.I)
    for path in sorted(Path(examples_dir).glob("plot_*.py")):
        if rst.search(path.read_text()):
            return f"{GALLERY}/{path.stem}"
    for path in sorted(Path(srcdir).rglob("*.md")) + sorted(Path(srcdir).rglob("*.rst")):
        rel = path.relative_to(srcdir)
        if rel.parts[0] in ("_build", GALLERY):
            continue
        if (rst if path.suffix == ".rst" else myst).search(path.read_text()):
            return rel.with_suffix("").as_posix()
    return None


def unbuilt_target(node, srcdir: Path = DOCS, examples_dir: Path = EXAMPLES) -> str | None:
    """The page of the full site a ``:doc:`` or ``:ref:`` reference that did not resolve points
    to, or None when the full site has no such page or label either (a broken link)."""
    if node.get("refdomain") != "std" or node.get("reftype") not in ("doc", "ref"):
        return None
    target = node["reftarget"]
    if node["reftype"] == "ref":
        return _label_page(target, srcdir, examples_dir)
    base = posixpath.dirname(node.get("refdoc", ""))
    doc = target[1:] if target.startswith("/") else posixpath.normpath(
        posixpath.join(base, target))
    return doc if _doc_exists(doc, srcdir, examples_dir) else None


def resolve_unbuilt(node, contnode, srcdir: Path = DOCS, examples_dir: Path = EXAMPLES):
    """For ``missing-reference``: a link to a page of the full site that this one-page site does
    not build renders as its text (class :data:`NOT_BUILT`, the page named in its tooltip) instead
    of failing the build; anything else is left to Sphinx (None), which warns (``-W``: fails)."""
    page = unbuilt_target(node, srcdir, examples_dir)
    if page is None:
        return None
    from docutils import nodes  # here: nox imports this module to check names, without docutils

    text = contnode.astext()
    return nodes.abbreviation(text, text, classes=[NOT_BUILT],
                              explanation=f"{page}: not in this one-page site (nox -s docs "
                                          "builds every page)")


def _orphans(only: tuple[str, ...]):
    """``source-read``: the named examples after the first are orphans (in no toctree)."""
    def mark(app, docname: str, source: list[str]) -> None:
        if docname in {f"{GALLERY}/{stem}" for stem in only[1:]}:
            source[0] = ":orphan:\n\n" + source[0]
    return mark


def _reread(only: tuple[str, ...]):
    """``env-get-outdated``: the named pages are read and written again on every build, even when
    the re-run left their rst as it was: their claim roles resolve from this run's ledger."""
    def outdated(app, env, added, changed, removed) -> list[str]:
        return [d for d in (f"{GALLERY}/{stem}" for stem in only) if d in env.found_docs]
    return outdated


def claim_hint(only: Iterable[str]) -> str:
    """Added to the ledger extension's error for a claim no built page recorded."""
    only = list(only)
    return (f" This is a one-page site of {', '.join(only)}: if another page records the claim, "
            f"build that page with it (nox -s page -- {' '.join(only)} plot_other; the full "
            "site's docs/_build/html/ledger.csv names the page of each claim).")


def setup(app, only: tuple[str, ...], examples_dir: Path = EXAMPLES) -> None:
    """Connect the one-page handlers to ``app`` (called from ``docs/conf.py``'s ``setup``)."""
    def own_ledger(app, config) -> None:
        config.ledger_dir = str(ledger_dir(app.doctreedir))

    def missing_reference(app, env, node, contnode):
        return resolve_unbuilt(node, contnode, Path(app.srcdir), examples_dir)

    # Before the ledger extension's config-inited (default priority 500) reads ledger_dir.
    app.connect("config-inited", own_ledger, priority=400)
    app.connect("missing-reference", missing_reference)
    app.connect("source-read", _orphans(only))
    app.connect("env-get-outdated", _reread(only))


def from_environment(examples_dir: Path = EXAMPLES) -> tuple[str, ...]:
    """The examples :data:`ENV` names, checked (empty when it is unset or blank)."""
    value = os.environ.get(ENV, "")
    return pages(value, examples_dir) if value.strip() else ()
