"""Sphinx extension: each example's world sizes, as the example declares them, on the site.

The one list is the ``guide.Page(..., world_size=default, supports=(...), why=...)`` declaration of each
example (:mod:`guide.world_sizes` reads it without running the page). From it:

* the ``world-sizes`` directive (cluster page, gallery index) renders every example with the sizes
  it supports under torchrun and why a list is restricted, grouped by sizes;
* every generated gallery page gets one line under its title saying its sizes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

from guide.world_sizes import declared, english, header

GALLERY = "auto_examples"


def _examples_dir(app) -> Path:
    """The gallery's source folder (``world_sizes_examples_dir``, relative to the docs)."""
    d = app.config.world_sizes_examples_dir
    return Path(d if os.path.isabs(d) else Path(app.srcdir) / d).resolve()


def contracts(app) -> dict[str, object]:
    """Example stem -> its declared contract, in file-name order."""
    found = {p.stem: declared(p) for p in sorted(_examples_dir(app).glob("plot_*.py"))}
    if not found:
        raise ValueError(f"no plot_*.py examples in {_examples_dir(app)} "
                         "(world_sizes_examples_dir)")
    return found


def world_sizes_list(found: dict[str, object], docname: str) -> nodes.bullet_list:
    """The directive's list, from ``{stem: Contract}``: one item per set of supported sizes (the
    biggest group first, then by sizes), naming each example that declares exactly that set, with
    a link to its page and its reason if it has one."""
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for stem, c in found.items():
        groups.setdefault(c.supports, []).append((stem, c.why))
    items = nodes.bullet_list(classes=["world-sizes"])  # declarations, not measurements
    for sizes, members in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        para = nodes.paragraph()
        para += nodes.strong(text=f"{english(sizes)} ranks: ")
        for i, (stem, why) in enumerate(members):
            if i:
                para += nodes.Text(", ")
            ref = addnodes.pending_xref("", refdomain="std", reftype="doc",
                                        reftarget=f"/{GALLERY}/{stem}", refexplicit=True,
                                        refdoc=docname, refwarn=True)
            ref += nodes.literal(text=stem)
            para += ref
            if why:
                para += nodes.Text(f" ({why})")
        items += nodes.list_item("", para)
    return items


class WorldSizes(SphinxDirective):
    """A list: for each set of supported sizes, the examples that declare it (and why, if
    restricted)."""

    def run(self) -> list[nodes.Node]:
        found = contracts(self.env.app)
        for stem in found:
            self.env.note_dependency(str(_examples_dir(self.env.app) / f"{stem}.py"))
        return [world_sizes_list(found, self.env.docname)]


_TITLE = re.compile(r"^(\.\. _sphx_glr_.*?:\n(?:[ \t]*\n)+.+\n=+\n)", re.MULTILINE)


def _header_line(app, docname: str, source: list[str]) -> None:
    """Under the title of each generated example page: the sizes it runs at."""
    if not docname.startswith(f"{GALLERY}/plot_"):
        return
    line = header(declared(_examples_dir(app) / f"{docname.split('/')[-1]}.py"))
    source[0], n = _TITLE.subn(lambda m: f"{m[1]}\n.. rst-class:: world-sizes\n\n*{line}*\n",
                               source[0], count=1)
    if n != 1:
        raise ValueError(f"{docname}: no title found to put the world-size line under.")


def setup(app):
    app.add_config_value("world_sizes_examples_dir", "../examples", "env")
    app.add_directive("world-sizes", WorldSizes)
    app.connect("source-read", _header_line)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
