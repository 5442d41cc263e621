"""Faults injected into a page through its tagged fault points, each the shape of a real bug.

A page marks each statement a fault may replace with a trailing comment, ``# fault-point: NAME``.
A fault is a list of ``(NAME, replacement)``: the whole statement that carries the tag (however it
is formatted, over however many lines) is replaced by ``replacement``, dedented code indented as the
statement was; ``{statement}`` in it stands for the statement itself (its text, without the tag), so
a fault can add code after a statement instead of replacing it. A tag found on no statement or on
more than one raises, naming the tag and the page, so an edit to a page cannot silently turn a fault
test into a test of the unmodified page.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from collections.abc import Iterable
from pathlib import Path

from guide.fault_points import TAG, without_tags  # one pattern: the rendered page drops it

STATEMENT = "{statement}"


def fault_points(source: str) -> dict[str, list[int]]:
    """Each tag in ``source`` -> the (1-based) lines its comments are on, real comments only."""
    points: dict[str, list[int]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := TAG.fullmatch(tok.string)):
            points.setdefault(m.group(1), []).append(tok.start[0])
    return points


def _statement_at(tree: ast.Module, line: int) -> ast.stmt:
    """The innermost simple statement whose lines hold ``line``."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno and \
                not hasattr(node, "body"):
            found = node
    if found is None:
        raise AssertionError(f"line {line}: a fault-point tag must end a simple statement")
    return found


def inject(source: str, edits: list[tuple[str, str]], page: str = "the page") -> str:
    """``source`` with each ``(tag, replacement)`` of ``edits`` applied (see the module's doc)."""
    for tag, replacement in edits:
        lines = fault_points(source).get(tag, [])
        if len(lines) != 1:
            raise AssertionError(f"fault point {tag!r} found {len(lines)} times in {page}, "
                                 f"expected once (a statement ending '# fault-point: {tag}')")
        node = _statement_at(ast.parse(source), lines[0])
        text = source.splitlines(keepends=True)
        first, last = node.lineno - 1, node.end_lineno  # the statement's whole lines
        indent = text[first][:node.col_offset]
        statement = textwrap.dedent("".join(text[first:last]))
        statement = without_tags(statement).strip("\n")
        new = textwrap.dedent(replacement).replace(STATEMENT, statement).rstrip("\n")
        new = textwrap.indent(new + "\n", indent, lambda ln: True) if new.strip() else ""
        source = "".join(text[:first]) + new + "".join(text[last:])
        ast.parse(source)  # the fault must leave a program
    return source


def mistagged(page: Path, edit_lists: Iterable[list[tuple[str, str]]]) -> dict[str, int]:
    """Each tag the faults' edits name that ``page`` does not carry exactly once, with how many
    times it does: ``{}`` when every fault can be injected. A quick test of this keeps a page edit
    that drops a tag from surfacing only in a slow fault test."""
    points = fault_points(page.read_text())
    tags = {tag for edits in edit_lists for tag, _ in edits}
    return {tag: len(points.get(tag, [])) for tag in sorted(tags) if len(points.get(tag, [])) != 1}


def write_faulty(page: Path, edits: list[tuple[str, str]], dest_dir: Path) -> Path:
    """Write ``page`` with ``edits`` injected into ``dest_dir``, keeping its file name."""
    dest = dest_dir / page.name
    dest.write_text(inject(page.read_text(), edits, page.name))
    return dest


def assert_fails_by_name(page: Path, fault: str, edits: list[tuple[str, str]], pattern: str,
                         dest_dir: Path, timeout: float):
    """Run ``page`` with ``edits`` injected as a user would (``python page.py``): it must exit
    non-zero, say ``pattern`` and stop before its last line (``All checks passed.``). Returns the
    run (``conftest.Run``) for a test's own checks; ``fault`` names the fault in a failure."""
    from conftest import run_python

    run = run_python(write_faulty(page, edits, dest_dir), timeout=timeout)
    tail = run.output[-3000:]
    assert run.returncode != 0, f"{fault}: the page passed with the fault\n{tail}"
    assert re.search(pattern, run.output), f"{fault}: {pattern} not found\n{tail}"
    assert "All checks passed." not in run.output, f"{fault}: the page reached its end\n{tail}"
    return run


# -- the main example's faults (examples/plot_ddp_vs_fsdp2.py) -----------------------------------

def _on_rank1_at_step3(action: str) -> str:
    """After the FSDP2 worker shards the model: a forward pre-hook that does ``action`` on rank 1's
    4th step."""
    return (STATEMENT + "\n"
            "if rank.rank == 1:\n"
            "    _steps = []\n"
            "    def _fault(module, args):\n"
            "        _steps.append(1)\n"
            "        if len(_steps) == 4:\n"
            f"            {action}\n"
            "    model.register_forward_pre_hook(_fault)\n")


# A DDP communication hook that all-reduces with SUM and skips the division by world size.
_SUM_HOOK = ("import torch.distributed as _dist\n"
             "def _sum_hook(state, bucket):\n"
             "    fut = _dist.all_reduce(bucket.buffer(), async_op=True).get_future()\n"
             "    return fut.then(lambda f: f.value()[0])\n"
             "model.register_comm_hook(None, _sum_hook)\n")

# The tags: ddp-wrap (the DDP worker builds and wraps its model), fsdp2-build (the FSDP2 worker
# builds its model), fsdp2-shard (it shards it with the page's shard_fsdp2), fsdp2-launch (the
# page launches the FSDP2 jobs).
FAULTS: dict[str, list[tuple[str, str]]] = {
    # DDP replaced by the bare module: every rank trains on its own half, nothing is averaged.
    "no_grad_sync": [("ddp-wrap", "model = build_model(CFG, device=rank.device)")],
    # DDP's gradient all-reduce as a SUM without the division by N: the shape of pytorch#162338
    # (gloo AVG computed as SUM), every step N times too large.
    "grads_summed": [("ddp-wrap", STATEMENT + "\n" + _SUM_HOOK)],
    # fully_shard never called: plain replicated tensors, and no communication either.
    "no_sharding": [("fsdp2-shard", "")],
    # fully_shard on the blocks only: the root's parameters (embeddings, head) stay unsharded.
    "root_not_sharded": [("fsdp2-shard", "for block in model.blocks:\n"
                                         "    fully_shard(block, mesh=mesh)\n")],
    # Each rank seeds its own model: FSDP2 does not broadcast, so the shards disagree.
    "different_seeds": [("fsdp2-build",
                         "model = build_model(CFG, seed=rank.rank, device=rank.device)")],
    "rank_raises": [("fsdp2-shard", _on_rank1_at_step3(
        "raise RuntimeError('injected fault: rank 1 raises at step 3')"))],
    "rank_killed": [("fsdp2-shard", _on_rank1_at_step3(
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))],
    # The page's FSDP2 jobs wait 10 s (not the default 30) for the hung peer: 20 s less per run.
    "rank_hangs": [("fsdp2-shard", _on_rank1_at_step3("import time; time.sleep(3600)")),
                   ("fsdp2-launch", "runs[FSDP2_, opt] = guide.launch(fsdp2_worker, WORLD_SIZE, "
                                    "opt, collective_timeout_s=10)")],
}


def write_faulty_example(example: Path, fault: str, dest_dir: Path) -> Path:
    """Write the main example with ``fault`` (a key of :data:`FAULTS`) injected, in ``dest_dir``."""
    return write_faulty(example, FAULTS[fault], dest_dir)
