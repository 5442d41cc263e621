"""Faults injected into the real example's source, each the shape of a real bug.

Each fault is a list of exact text replacements in ``examples/plot_ddp_vs_fsdp2.py``. An anchor that
is missing or ambiguous raises, so an edit to the example cannot silently turn a fault test into a
test of the unmodified example.
"""

from __future__ import annotations

from pathlib import Path

DDP_WRAP = "    model = wrap_ddp(build_model(CFG, device=rank.device))\n"
FSDP_BUILD = ("    model = build_model(CFG, device=rank.device)\n"
              "    mesh = make_mesh(rank.device.type)\n")
FSDP_BLOCKS = ("    for block in model.blocks:\n"
               "        fully_shard(block, mesh=mesh)\n"
               "    fully_shard(model, mesh=mesh)\n")
# The worker's call of the page's shard_fsdp2 (the faults on rank 1 hook in after it).
FSDP_ROOT = "    shard_fsdp2(model, mesh)\n"
FSDP_LAUNCH = "    runs[FSDP2_, opt] = guide.launch(fsdp2_worker, WORLD_SIZE, opt)\n"


def _on_rank1_at_step3(action: str) -> str:
    """Code for the FSDP2 worker: a forward pre-hook that does ``action`` on rank 1's 4th step."""
    return (FSDP_ROOT +
            "    if rank.rank == 1:\n"
            "        _steps = []\n"
            "        def _fault(module, args):\n"
            "            _steps.append(1)\n"
            "            if len(_steps) == 4:\n"
            f"                {action}\n"
            "        model.register_forward_pre_hook(_fault)\n")


# A DDP communication hook that all-reduces with SUM and skips the division by world size.
_SUM_HOOK = ("    import torch.distributed as _dist\n"
             "    def _sum_hook(state, bucket):\n"
             "        fut = _dist.all_reduce(bucket.buffer(), async_op=True).get_future()\n"
             "        return fut.then(lambda f: f.value()[0])\n"
             "    model.register_comm_hook(None, _sum_hook)\n")

FAULTS: dict[str, list[tuple[str, str]]] = {
    # DDP replaced by the bare module: every rank trains on its own half, nothing is averaged.
    "no_grad_sync": [(DDP_WRAP, "    model = build_model(CFG, device=rank.device)\n")],
    # DDP's gradient all-reduce as a SUM without the division by N: the shape of pytorch#162338
    # (gloo AVG computed as SUM), every step N times too large.
    "grads_summed": [(DDP_WRAP, DDP_WRAP + _SUM_HOOK)],
    # fully_shard never called: plain replicated tensors, and no communication either.
    "no_sharding": [(FSDP_BLOCKS, "")],
    # fully_shard on the blocks only: the root's parameters (embeddings, head) stay unsharded.
    "root_not_sharded": [(FSDP_BLOCKS, "    for block in model.blocks:\n"
                                       "        fully_shard(block, mesh=mesh)\n")],
    # Each rank seeds its own model: FSDP2 does not broadcast, so the shards disagree.
    "different_seeds": [(FSDP_BUILD, FSDP_BUILD.replace("build_model(CFG, ",
                                                         "build_model(CFG, seed=rank.rank, "))],
    "rank_raises": [(FSDP_ROOT, _on_rank1_at_step3(
        "raise RuntimeError('injected fault: rank 1 raises at step 3')"))],
    "rank_killed": [(FSDP_ROOT, _on_rank1_at_step3(
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))],
    # The page's FSDP2 jobs wait 10 s (not the default 30) for the hung peer: 20 s less per run.
    "rank_hangs": [(FSDP_ROOT, _on_rank1_at_step3("import time; time.sleep(3600)")),
                   (FSDP_LAUNCH, FSDP_LAUNCH.replace(", opt)", ", opt, collective_timeout_s=10)"))],
}


def inject(source: str, fault: str) -> str:
    """``source`` with ``fault``'s replacements applied; each anchor must occur exactly once."""
    for anchor, replacement in FAULTS[fault]:
        count = source.count(anchor)
        if count != 1:
            raise AssertionError(f"fault {fault!r}: anchor found {count} times, expected once:\n"
                                 f"{anchor}")
        source = source.replace(anchor, replacement)
    return source


def write_faulty_example(example: Path, fault: str, dest_dir: Path) -> Path:
    """Write the example with ``fault`` injected into ``dest_dir``, keeping its file name."""
    dest = dest_dir / example.name
    dest.write_text(inject(example.read_text(), fault))
    return dest
