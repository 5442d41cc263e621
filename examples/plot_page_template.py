"""
A new page, from this template: what fully_shard leaves on each rank
====================================================================

.. admonition:: Verdict
   :class: tip

   After ``fully_shard(model)`` each rank holds about 1/N of every parameter: together the ranks'
   shards are the whole model, to the element (:claim:`template.elements_gap` elements apart).
   Count a rank's share with ``p.to_local().numel()``, not ``p.numel()``, which is the full size.
   Measured on CPU gloo processes; the contributing page says how this page is built.

This is the template every new page starts from (the contributing page walks through it): a
verdict with a measured number, the plain PyTorch to copy, one worker run on N ranks, one check
against an independent value, a recorded table, and one figure.
"""

# %%
# The code to copy
# ----------------
# ``fully_shard`` turns every parameter into a ``DTensor`` sharded along dim 0; ``to_local()`` is
# the part this rank keeps.
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """One FSDP2 unit per block, then the root (embeddings, final norm, head)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def local_elements(model: torch.nn.Module) -> int:
    """The parameter elements this rank holds after ``fully_shard``."""
    return sum(p.to_local().numel() for p in model.parameters())


# %%
# The page runs it on N ranks
# ---------------------------
# The declaration says where the page stands, the call its first block teaches and the world sizes
# it supports; the worker runs on each rank.
import matplotlib.pyplot as plt

import guide
from guide import checks, plotting
from guide.model import ModelConfig, build_model

PAGE = guide.Page(section="Contribute", order=1, key_api="fully_shard(", world_size=2,
                  supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig(vocab=128, d_model=64, n_layers=2, n_heads=4, d_mlp=256)


def worker(rank: guide.Rank) -> int:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return local_elements(shard(build_model(CFG, device=rank.device), mesh))


shares = guide.launch(worker, WORLD_SIZE)

# %%
# The check, against one process
# ------------------------------
# The independent value is the unsharded model's element count, from a model built in this process
# (counts are whole numbers: a gap within half an element is none).
full = sum(p.numel() for p in build_model(CFG).parameters())
gap = PAGE.check("template.elements_gap", checks.expect_close(
    "shards partition the model", f"FSDP2 x{WORLD_SIZE}", sum(shares), full, 0.5,
    what="elements over all ranks", unit="elements", against="the unsharded model's count"),
    fmt=".0f", model="tinylm-2-block", world_size=WORLD_SIZE)
PAGE.show("template.shares", [(f"rank {r}", n, n / full) for r, n in enumerate(shares)],
          ["rank", "elements held", "share of the model"],
          formats={"elements held": ",.0f", "share of the model": ".1%"},
          model="tinylm-2-block", world_size=WORLD_SIZE)
print(f"All checks passed: {WORLD_SIZE} ranks hold {sum(shares):,} elements together, "
      f"the unsharded model's {full:,}.")

# %%
# One figure, one message
# -----------------------
plotting.style()
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.bar([f"rank {r}" for r in range(WORLD_SIZE)], shares, color="#1f77b4", label="held")
ax.axhline(full / WORLD_SIZE, color="grey", ls="--", label="1/N of the model")
ax.set(ylabel="parameter elements held", title="Each rank holds about 1/N of the model")
plotting.legend_below(fig)
plt.show()
# sphinx_gallery_thumbnail_number = 1
