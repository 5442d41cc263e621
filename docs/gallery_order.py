"""The gallery in the order of the story, in sections (sphinx-gallery ``within_subsection_order``).

A newcomer meets the page the site is named after first, then memory, communication, the FSDP2
knobs, operating a job, and migrating. :data:`SECTIONS` (the titles here, the examples as each declares itself) is the one list: the gallery's index is
rewritten into these sections (a heading, a one-line caption, the section's cards, and a captioned
toctree, so the sidebar's section navigation follows them; :func:`sectioned_index`), the landing
page shows the same groups (:func:`landing_rst`), and :data:`STORY` is their concatenation. The
example files stay where they are (one gallery, no subfolders): moving them would buy nothing the
rewrite does not give. An example places itself: its ``guide.Page(section=..., order=...)`` declaration
(:mod:`guide.declaration`) names its section and its place in it; a file without one, or with a section
that is not here, fails the build with a message naming it and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from guide import fault_points
from guide.declaration import declared_page


class Section(NamedTuple):
    """A group of the gallery: its title, a one-line caption, its examples in story order."""

    title: str
    caption: str
    files: tuple[str, ...] = ()


#: The sections in story order, each with its caption; which examples each holds, and in what
#: order, each example declares itself (``guide.Page(section=..., order=...)``).
TITLES = (
    Section("Start here",
            "DDP and FSDP2 train the same model to the same numbers; memory and traffic differ."),
    Section("Memory",
            "What each rank holds, where DDP runs out of memory and FSDP2 fits, depth, "
            "activations, CPU offload."),
    Section("Communication and time",
            "The collectives each strategy issues, counted; their time on GPUs, predicted."),
    Section("Configure FSDP2",
            "reshard_after_forward, prefetching and per-unit settings, mixed precision, gradient "
            "accumulation, loss normalisation, gradient clipping."),
    Section("Operate: checkpoints, clusters",
            "HSDP across nodes; saving, resharding and resuming with torch.distributed.checkpoint."),
    Section("Fine-tune",
            "Frozen weights and LoRA adapters, pretrained weights in by broadcast, one file out."),
    Section("Beyond data parallel",
            "Tensor parallel + FSDP2 on a 2-D mesh; torch.compile with fully_shard; MoE experts "
            "on their own mesh."),
    Section("Migrate and pitfalls",
            "From FSDP1 to fully_shard, the common mistakes with the message torch prints, and "
            "hangs."),
    Section("Contribute",
            "The template a new page starts from: a declaration, a worker, a check, a table."),
)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


def sections(examples_dir: Path = EXAMPLES_DIR,
             titles: tuple[Section, ...] = TITLES) -> tuple[Section, ...]:
    """:data:`TITLES` with each section's examples, as the examples declare them. An unknown
    section, two examples at one place, or an example without a declaration is an error naming the
    file and the fix."""
    placed: dict[str, list[tuple[int, str]]] = {t.title: [] for t in titles}
    for path in sorted(examples_dir.glob("plot_*.py")):
        page = declared_page(path)
        if page.section not in placed:
            raise ValueError(f"{path.name}: section {page.section!r} is not one of the gallery's "
                             f"sections ({', '.join(placed)}); use one, or add it to TITLES in "
                             f"{__file__}.")
        placed[page.section].append((page.order, path.name))
    for title, files in placed.items():
        orders = [order for order, _ in files]
        for order in sorted({o for o in orders if orders.count(o) > 1}):
            clash = sorted(name for o, name in files if o == order)
            raise ValueError(f"{' and '.join(clash)} both declare order={order} in section "
                             f"{title!r}: give each its own place.")
    return tuple(t._replace(files=tuple(name for _, name in sorted(placed[t.title])))
                 for t in titles)


SECTIONS = sections()
STORY = tuple(name for section in SECTIONS for name in section.files)


class StoryOrder:
    """Sort key: an example's position in :data:`STORY` (also sorts the landing page's cards)."""

    def __init__(self, src_dir: str = "") -> None:
        self.src_dir = src_dir

    def __call__(self, filename: str) -> int:
        name = Path(filename).name
        if name not in STORY:
            raise ValueError(f"{name} is not placed in the gallery's story: declare its section "
                             "and order with guide.Page(section=..., order=...).")
        return STORY.index(name)

    def __repr__(self) -> str:  # sphinx-gallery caches on the config's repr
        return f"StoryOrder({len(STORY)} examples)"


_CARD = re.compile(r"\.\. raw:: html\n\n    <div class=\"sphx-glr-thumbcontainer\".*?"
                   r":doc:`/(?P<doc>[^`]+)`.*?\n    </div>\n", re.S)
_GRID = re.compile(r"\.\. raw:: html\n\n    <div class=\"sphx-glr-thumbnails\">\n.*?"
                   r"\.\. thumbnail-parent-div-close\n\n\.\. raw:: html\n\n    </div>\n", re.S)
_TOCTREE = re.compile(r"\.\. toctree::\n   :hidden:\n\n(?:   \S+\n)+", re.S)


def sectioned_index(text: str) -> str:
    """sphinx-gallery's generated gallery index (one grid of cards, one hidden toctree), rewritten
    into :data:`SECTIONS`: per section a heading, its caption, its cards and a hidden toctree with
    the section as caption. Idempotent; a card no section names is an error naming the fix."""
    grid, toctree = _GRID.search(text), _TOCTREE.search(text)
    if grid is None or toctree is None:
        if "sphx-glr-section-caption" in text:
            return text  # already rewritten
        raise ValueError("the gallery index has no card grid or toctree where sphinx-gallery "
                         "writes them; update gallery_order.sectioned_index to its format.")
    cards = {Path(m["doc"]).name + ".py": m[0] for m in _CARD.finditer(grid[0])}
    unplaced = sorted(set(cards) - set(STORY))
    if unplaced:
        raise ValueError(f"{unplaced} not placed in the gallery's story: declare their section "
                         "and order with guide.Page(section=..., order=...) (SECTIONS is read "
                         "from the examples).")
    prefix = "/" + Path(_CARD.search(grid[0])["doc"]).parent.as_posix() + "/"
    parts = []
    for section in SECTIONS:
        present = [f for f in section.files if f in cards]
        if not present:
            continue
        parts += [section.title, "-" * len(section.title), "",
                  ".. rst-class:: sphx-glr-section-caption", "", section.caption, "",
                  ".. raw:: html", "", '    <div class="sphx-glr-thumbnails">', "",
                  *(cards[f] for f in present), ".. raw:: html", "", "    </div>", "",
                  ".. toctree::", "   :hidden:", f"   :caption: {section.title}", "",
                  *(f"   {prefix}{Path(f).stem}" for f in present), "", ""]
    body = "\n".join(parts)
    return text[:grid.start()] + body + text[grid.end():toctree.start()] + text[toctree.end():]


#: A ``code-block`` directive (sphinx-gallery's ``codestr2rst``) with its options and no content: a
#: cell whose every line is inside ``sphinx_gallery_start_ignore``/``end_ignore`` (a hidden check).
_EMPTY_CODE_BLOCK = re.compile(r"^\.\. code-block:: \w+\n(?:   :[\w-]+:.*\n)*\n*(?=\S|\Z)", re.M)


def without_empty_code_blocks(text: str) -> str:
    """An example's generated rst without the code blocks that have nothing left to show (sphinx-
    gallery renders them as empty grey boxes); the cell's output, if it printed any, stays."""
    return _EMPTY_CODE_BLOCK.sub("", text)


def without_fault_points(text: str) -> str:
    """An example's generated rst without the ``# fault-point: NAME`` comments its tests inject
    faults at (:mod:`guide.fault_points`): bookkeeping for the tests, not for the reader."""
    return fault_points.without_tags(text)


def landing_rst(gallery_dir: str = "../examples") -> str:
    """The landing page's cards: per section a rubric, its caption and a ``minigallery`` of its
    examples (cards in story order)."""
    lines = []
    for section in SECTIONS:
        lines += [f".. rubric:: {section.title}", "", section.caption, "",
                  ".. minigallery::", *(f"   {gallery_dir}/{f}" for f in section.files), ""]
    return "\n".join(lines)


#: The same key as an instance: sphinx-gallery's ``minigallery_sort_order`` takes a callable.
story_position = StoryOrder()
