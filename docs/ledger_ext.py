"""Sphinx extension: the ledger of claims (:mod:`guide.claims`) as a build check.

* At config time it points ``GUIDE_LEDGER_DIR`` at ``ledger_dir``: gallery scripts (run in this
  process) and notebook kernels (child processes) record there. Records of pages that no longer
  exist are dropped.
* ``ledger_page`` is read after every other page (it lists what they recorded) and on every build.
* When the build finishes, two records of one claim that disagree fail it, naming both pages.
* The ``claim`` role lets prose state a recorded number by its name: ``:claim:`name``` (rST, e.g.
  a gallery text cell) or ``{claim}`name``` (MyST) renders the value exactly as the page showed it;
  ``:claim:`name <unit>``` appends the claim's unit. It is resolved after every page ran (at
  ``doctree-resolved``, so notebook pages executed at read time have recorded), from the claims
  of the same page first, then of any page; an unknown name fails the build naming page and name
  (and ``ledger_claim_hint``, if set: the one-page site says how to build the recording page too).
  The rendered number carries the claim's guard as its tooltip.
* When the build finishes it writes the whole ledger as ``ledger.csv`` and ``ledger.json`` into
  the HTML output (the ledger page links them), and scans every rendered page for numbers its
  ledger lacks (:mod:`guide.rendered`): ``ledger_scan = "report"`` writes
  ``<outdir>/../unrecorded.json`` and logs a one-line summary; ``"strict"`` fails the build naming
  each page and number; ``"off"`` skips the scan.
* Before the scan, every table a page recorded must be on its rendered page
  (:mod:`guide.rendered_tables`): a recorded table that vanished fails the build naming page and
  table, whatever ``ledger_scan`` says.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util import logging

from guide import claims, rendered, rendered_tables

logger = logging.getLogger(__name__)
_ROLE = re.compile(r"^\s*(?P<name>[^\s<]+)\s*(?:<(?P<unit>[^<>]+)>)?\s*$")


def _configure(app, config) -> None:
    directory = Path(config.ledger_dir or Path(app.outdir).parent / "ledger")
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[claims.LEDGER_ENV] = str(directory)
    srcdir = Path(app.srcdir)
    for path in [*directory.glob("*.jsonl"), *directory.glob(f"*{claims.TABLES_SUFFIX}")]:
        page = path.name.removesuffix(claims.TABLES_SUFFIX).removesuffix(".jsonl")
        page = page.replace("__", "/")
        sources = [srcdir / f"{page}.md", srcdir / f"{page}.rst",
                   *(Path(d if os.path.isabs(d) else srcdir / d) / f"{page}.py"
                     for d in _gallery_dirs(config))]
        if not any(p.exists() for p in sources):
            path.unlink()


def _gallery_dirs(config) -> list[str]:
    conf = getattr(config, "sphinx_gallery_conf", None) or {}
    dirs = conf.get("examples_dirs", [])
    return [dirs] if isinstance(dirs, str) else list(dirs)


def _ledger_last(app, env, docnames) -> None:
    page = app.config.ledger_page
    if page in docnames:
        docnames.remove(page)
        docnames.append(page)


def _ledger_always_outdated(app, env, added, changed, removed):
    page = app.config.ledger_page
    return [page] if page in env.found_docs else []


class claim_ref(nodes.Inline, nodes.TextElement):
    """A ``claim`` role not yet resolved: the claim's name and whether to add its unit."""


def _claim_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    m = _ROLE.match(text)
    if not m:
        msg = inliner.reporter.error(f"claim role {text!r}: write :claim:`name` or "
                                     ":claim:`name <unit>`.", line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    node = claim_ref(rawtext, m["name"])
    # <unit> appends the claim's unit; <MiB> appends it too, after checking it is the claim's.
    node["claim"], node["with_unit"] = m["name"], bool(m["unit"])
    node["unit_as_written"] = None if m["unit"] in (None, "unit") else m["unit"]
    return [node], []


def _resolve_claims(app, doctree, docname) -> None:
    refs = list(doctree.findall(claim_ref))
    if not refs:
        return
    page = rendered.page_of(docname + ".html")
    records = claims.load(os.environ[claims.LEDGER_ENV])
    for ref in refs:
        name = ref["claim"]
        found = sorted((r for r in records if r.name == name), key=lambda r: r.page != page)
        if not found:
            raise ExtensionError(
                f"page {docname!r}: claim {name!r} (claim role) is not in the ledger: no page "
                "recorded it in this build. Record it (ledger.claim / ledger.record) on a page "
                "that runs, or fix the name." + app.config.ledger_claim_hint)
        r = found[0]
        written = ref.get("unit_as_written")
        if written is not None and written != r.unit:
            raise ExtensionError(
                f"page {docname!r}: claim {name!r} is in {r.unit!r}, the claim role says "
                f"<{written}>: write :claim:`{name} <{r.unit}>` (or <unit>).")
        text = r.text + (f" {r.unit}" if ref["with_unit"] and r.unit else "")
        ref.replace_self(nodes.abbreviation(text, text, explanation=f"{name}: {r.guard}",
                                            classes=["claim"]))


def _ledger_files(outdir: Path, records: list[claims.Claim]) -> None:
    """The whole ledger as ledger.csv and ledger.json in the HTML output."""
    rows = [{"page": r.page, "name": r.name, "value": r.value, "shown": r.text, "unit": r.unit,
             "kind": r.kind, "check": r.check, "guard": r.guard,
             "assumptions": dict(r.assumptions)} for r in records]
    (outdir / "ledger.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["name"])
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "assumptions": json.dumps(row["assumptions"])})
    (outdir / "ledger.csv").write_text(buf.getvalue())


def _check(app, exception) -> None:
    if exception is not None:
        return
    records = claims.load(os.environ[claims.LEDGER_ENV])
    try:
        claims.raise_on_contradictions(records)
    except AssertionError as err:
        raise ExtensionError(str(err)) from None
    if app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    _ledger_files(outdir, records)
    vanished = rendered_tables.missing_tables(outdir, claims.load_tables(
        os.environ[claims.LEDGER_ENV]))
    if vanished:
        raise ExtensionError("[ledger] recorded tables missing from their rendered pages:\n" +
                             "\n".join(f"- {m}" for m in vanished))
    mode = app.config.ledger_scan
    if mode == "off":
        return
    if mode not in ("report", "strict"):
        raise ExtensionError(f"ledger_scan = {mode!r}: use 'report', 'strict' or 'off'.")
    found = rendered.scan_site(outdir, records)
    summary = rendered.write_report(found, outdir.parent / "unrecorded.json")
    if mode == "strict" and found:
        lines = [str(u) for us in found.values() for u in us]
        raise ExtensionError("[ledger scan] printed numbers missing from the ledger (record "
                             "them, or see the exemptions in guide.rendered):\n" +
                             "\n".join(f"- {line}" for line in lines[:200]))
    logger.info(summary)


def setup(app):
    app.add_config_value("ledger_dir", "", "env")
    app.add_config_value("ledger_page", "pages/ledger", "env")
    app.add_config_value("ledger_scan", "report", "")
    # Appended to the error for a claim no page recorded (the one-page site says how to add one).
    app.add_config_value("ledger_claim_hint", "", "")
    app.add_node(claim_ref)
    app.add_role("claim", _claim_role)
    app.connect("doctree-resolved", _resolve_claims)
    app.connect("config-inited", _configure)
    app.connect("env-before-read-docs", _ledger_last)
    app.connect("env-get-outdated", _ledger_always_outdated)
    app.connect("build-finished", _check)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
