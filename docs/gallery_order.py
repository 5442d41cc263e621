"""The gallery in the order of the story, in sections (sphinx-gallery ``within_subsection_order``).

A newcomer meets the page the site is named after first, then memory, communication, the FSDP2
knobs, operating a job, and migrating. :data:`SECTIONS` is the one list: the gallery's index is
rewritten into these sections (a heading, a one-line caption, the section's cards, and a captioned
toctree, so the sidebar's section navigation follows them; :func:`sectioned_index`), the landing
page shows the same groups (:func:`landing_rst`), and :data:`STORY` is their concatenation. The
example files stay where they are (one gallery, no subfolders): moving them would buy nothing the
rewrite does not give. A new example must be placed here: an unlisted file fails the build with a
message naming it, instead of landing wherever its file name sorts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple


class Section(NamedTuple):
    """A group of the gallery: its title, a one-line caption, its examples in story order."""

    title: str
    caption: str
    files: tuple[str, ...]


SECTIONS = (
    Section("Start here",
            "DDP and FSDP2 train the same model to the same numbers; memory and traffic differ.",
            ("plot_ddp_vs_fsdp2.py",)),
    Section("Memory",
            "What each rank holds, where DDP runs out of memory and FSDP2 fits, depth, "
            "activations.",
            ("plot_memory_model_state.py", "plot_oom_ddp_vs_fsdp2.py", "plot_memory_vs_depth.py",
             "plot_activation_memory.py")),
    Section("Communication and time",
            "The collectives each strategy issues, counted; their time on GPUs, predicted.",
            ("plot_communication.py", "plot_step_time_estimates.py")),
    Section("Configure FSDP2",
            "reshard_after_forward, mixed precision, gradient accumulation, gradient clipping.",
            ("plot_reshard_after_forward.py", "plot_mixed_precision.py",
             "plot_gradient_accumulation.py", "plot_gradient_clipping.py")),
    Section("Operate: checkpoints, clusters",
            "HSDP across nodes; saving, resharding and resuming with torch.distributed.checkpoint.",
            ("plot_hsdp.py", "plot_checkpoint.py")),
    Section("Fine-tune",
            "Frozen weights and LoRA adapters, pretrained weights in by broadcast, one file out.",
            ("plot_finetune_lora.py",)),
    Section("Beyond data parallel",
            "Tensor parallel + FSDP2 on a 2-D mesh; torch.compile with fully_shard.",
            ("plot_tp_fsdp2.py", "plot_compile_fsdp2.py")),
    Section("Migrate and pitfalls",
            "From FSDP1 to fully_shard, the common mistakes with the message torch prints, and "
            "hangs.",
            ("plot_fsdp1_migration.py", "plot_pitfalls.py", "plot_when_fsdp2_breaks.py")),
)

STORY = tuple(name for section in SECTIONS for name in section.files)


class StoryOrder:
    """Sort key: an example's position in :data:`STORY` (also sorts the landing page's cards)."""

    def __init__(self, src_dir: str = "") -> None:
        self.src_dir = src_dir

    def __call__(self, filename: str) -> int:
        name = Path(filename).name
        if name not in STORY:
            raise ValueError(f"{name} is not placed in the gallery's story: add it to SECTIONS in "
                             f"{__file__}.")
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
        raise ValueError(f"{unplaced} not placed in the gallery's story: add them to SECTIONS in "
                         f"{__file__}.")
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
