"""The gallery in the order of the story (sphinx-gallery ``within_subsection_order``).

A newcomer meets the page the site is named after first, then memory, communication, the FSDP2
knobs, and what users ask next. A new example must be placed here: an unlisted file fails the build
with a message naming it, instead of landing wherever its file name sorts.
"""

from __future__ import annotations

from pathlib import Path

STORY = (
    "plot_ddp_vs_fsdp2.py",
    "plot_memory_model_state.py",
    "plot_oom_ddp_vs_fsdp2.py",
    "plot_memory_vs_depth.py",
    "plot_activation_memory.py",
    "plot_communication.py",
    "plot_step_time_estimates.py",
    "plot_reshard_after_forward.py",
    "plot_mixed_precision.py",
    "plot_gradient_accumulation.py",
    "plot_gradient_clipping.py",
    "plot_hsdp.py",
    "plot_tp_fsdp2.py",
    "plot_compile_fsdp2.py",
    "plot_checkpoint.py",
    "plot_finetune_lora.py",
    "plot_fsdp1_migration.py",
    "plot_pitfalls.py",
)


class StoryOrder:
    """Sort key: an example's position in :data:`STORY`."""

    def __init__(self, src_dir: str) -> None:
        self.src_dir = src_dir

    def __call__(self, filename: str) -> int:
        name = Path(filename).name
        if name not in STORY:
            raise ValueError(f"{name} is not placed in the gallery's story: add it to STORY in "
                             f"{__file__}.")
        return STORY.index(name)

    def __repr__(self) -> str:  # sphinx-gallery caches on the config's repr
        return f"StoryOrder({len(STORY)} examples)"
