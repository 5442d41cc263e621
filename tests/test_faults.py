"""Injected faults must fail the real example, fast, with a message that names the cause.

Each fault is the shape of a real bug (see ``faults.py``), injected into the shipped example's
source. The example runs the way users run it (``python example.py``) and, for one fault of each
kind, the way the site runs it (a real ``sphinx-build`` of a throwaway gallery).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MAIN_EXAMPLE, run_python
from faults import FAULTS, inject, write_faulty_example

# fault -> (regex the output must contain, seconds the whole run may take on 2 busy cores)
EXPECTED = {
    "no_grad_sync": (r"\[replica consistency\] DDP x2, sgd: .* gradients were not synchronised", 120),
    "grads_summed": (r"\[loss equivalence\] DDP x2, sgd: from step 1 on.*averaged \(not summed\)",
                     120),
    "no_sharding": (r"\[sharding\] FSDP2 x2, sgd: \S+ on rank 0 is a plain tensor.*fully_shard was "
                    r"not applied", 120),
    "root_not_sharded": (r"\[sharding\] FSDP2 x2, sgd: (tok_emb|pos_emb|ln_f|head)\.\S+ on rank 0 "
                         r"is a plain tensor", 120),
    "different_seeds": (r"\[initial weights\] FSDP2 x2, sgd: .*every rank must build the model "
                        r"with the same seed", 120),
    "rank_raises": (r"RankRaised: rank 1 of 2 raised RuntimeError: injected fault: rank 1 raises "
                    r"at step 3(.|\n)*Traceback from rank 1", 90),
    "rank_killed": (r"RankDied: rank 1 of 2 was killed by SIGKILL", 90),
    "rank_hangs": (r"RankHung: rank 1 of 2 hung: rank 0 waited collective_timeout_s=10 s(.|\n)*"
                   r"Python stack of rank 1(.|\n)*time\.sleep|_fault", 150),
}


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_fails_the_example(fault: str, tmp_path: Path) -> None:
    pattern, budget = EXPECTED[fault]
    run = run_python(write_faulty_example(MAIN_EXAMPLE, fault, tmp_path), timeout=budget + 60)
    assert run.returncode != 0, f"{fault}: the example passed with the fault injected\n{run.output}"
    assert re.search(pattern, run.output), f"{fault}: message not found:\n{run.output[-3000:]}"
    assert run.seconds < budget, f"{fault}: took {run.seconds:.0f} s (budget {budget} s)"


def test_unmodified_example_passes(tmp_path: Path) -> None:
    """The control: without a fault, the same run passes (so the fault tests test the faults)."""
    run = run_python(MAIN_EXAMPLE, cwd=tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    assert "All checks passed" in run.output


# --------------------------------------------------------------------------------------------------
# The fault points: found by their tags, not by the text of the statements they mark.

def _function(source: str, name: str) -> str:
    """The source of the page's function ``name``."""
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node)


def test_every_fault_changes_the_page_at_its_points_only() -> None:
    """Each fault leaves a program that differs from the page, and the tags stay out of it."""
    page = MAIN_EXAMPLE.read_text()
    assert set(FAULTS) == set(EXPECTED)
    for fault, edits in FAULTS.items():
        faulty = inject(page, edits, MAIN_EXAMPLE.name)
        assert faulty != page, fault
        for tag, _ in edits:
            assert f"# fault-point: {tag}" not in faulty, (fault, tag)


@pytest.mark.parametrize("how", ["missing", "duplicated"])
def test_a_missing_or_duplicated_tag_names_the_tag_and_the_page(how: str) -> None:
    page = MAIN_EXAMPLE.read_text()
    tagged = "  # fault-point: ddp-wrap\n"
    assert page.count(tagged) == 1
    if how == "missing":
        broken, found = page.replace(tagged, "\n"), 0
    else:  # the same tag on a second statement as well
        broken, found = page.replace("  # fault-point: fsdp2-build\n", tagged), 2
    with pytest.raises(AssertionError, match=rf"fault point 'ddp-wrap' found {found} times in "
                                             rf"{MAIN_EXAMPLE.name}"):
        inject(broken, FAULTS["no_grad_sync"], MAIN_EXAMPLE.name)


def test_a_reformatted_fault_point_keeps_its_fault() -> None:
    """Extra spaces inside the call, a statement split over lines: an exact-text anchor would miss
    both; the tags still find them, and the faults still do what they say."""
    page = MAIN_EXAMPLE.read_text()
    wrap = "model = wrap_ddp(build_model(CFG, device=rank.device))"
    launch = "runs[FSDP2_, opt] = guide.launch(fsdp2_worker, WORLD_SIZE, opt)"
    assert page.count(wrap) == 1 and page.count(launch) == 1
    page = page.replace(wrap, "model = wrap_ddp( build_model( CFG,  device = rank.device ) )")
    page = page.replace(launch, "runs[FSDP2_, opt] = guide.launch(\n"
                                "        fsdp2_worker, WORLD_SIZE, opt,\n"
                                "    )")
    assert wrap not in page and launch not in page  # what the old anchors looked for

    worker = _function(inject(page, FAULTS["no_grad_sync"], MAIN_EXAMPLE.name), "ddp_worker")
    assert "wrap_ddp" not in worker and "model = build_model(CFG, device=rank.device)" in worker
    worker = _function(inject(page, FAULTS["grads_summed"], MAIN_EXAMPLE.name), "ddp_worker")
    assert worker.index("wrap_ddp( build_model(") < worker.index("register_comm_hook(None, _sum")
    hangs = inject(page, FAULTS["rank_hangs"], MAIN_EXAMPLE.name)
    assert "guide.launch(fsdp2_worker, WORLD_SIZE, opt, collective_timeout_s=10)" in hangs
    assert "fsdp2_worker, WORLD_SIZE, opt,\n" not in hangs  # the whole statement was replaced
    assert "time.sleep(3600)" in _function(hangs, "fsdp2_worker")


# --------------------------------------------------------------------------------------------------
# Through sphinx-build: the path the site takes.

# The site's ledger extension too: the page cites its own claims in prose (the claim role).
CONF = f'''
import sys
sys.path.insert(0, {str(MAIN_EXAMPLE.parents[1] / "docs")!r})
extensions = ["sphinx_gallery.gen_gallery", "ledger_ext"]
sphinx_gallery_conf = {{"examples_dirs": "../examples", "gallery_dirs": "auto_examples",
                       "filename_pattern": "/plot_", "download_all_examples": False,
                       "image_scrapers": ("matplotlib", "guide.report.gallery_scraper")}}
suppress_warnings = ["ref.doc"]  # the page links the site's other pages, absent from this one
'''
INDEX = "Throwaway\n=========\n\n.. toctree::\n\n   auto_examples/index\n"


def make_gallery(tmp_path: Path, fault: str | None) -> Path:
    """A minimal Sphinx project whose gallery holds the main example (with ``fault`` injected)."""
    docs, examples = tmp_path / "docs", tmp_path / "examples"
    docs.mkdir(parents=True)
    examples.mkdir(parents=True)
    (docs / "conf.py").write_text(CONF)
    (docs / "index.rst").write_text(INDEX)
    (examples / "GALLERY_HEADER.rst").write_text("Gallery\n=======\n")
    if fault:
        write_faulty_example(MAIN_EXAMPLE, fault, examples)
    else:
        (examples / MAIN_EXAMPLE.name).write_text(MAIN_EXAMPLE.read_text())
    return docs


def sphinx_build(docs: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(docs),
         str(docs / "_build")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**__import__("os").environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("fault,pattern", [
    ("no_grad_sync", r"\[replica consistency\] DDP x2, sgd"),
    ("rank_killed", r"rank 1 of 2 was killed by SIGKILL"),
])
def test_fault_fails_sphinx_build(fault: str, pattern: str, tmp_path: Path) -> None:
    start = time.monotonic()
    proc = sphinx_build(make_gallery(tmp_path, fault))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, f"sphinx-build passed with fault {fault}:\n{out[-3000:]}"
    assert re.search(pattern, out), out[-3000:]
    assert time.monotonic() - start < 180


def test_two_builds_at_once_do_not_collide(tmp_path: Path) -> None:
    """Two docs builds on one machine at the same time: each gets its own loopback port; both pass."""
    builds = [sphinx_build(make_gallery(tmp_path / name, None)) for name in ("a", "b")]
    outs = [b.communicate(timeout=400)[0] for b in builds]
    for b, out in zip(builds, outs):
        assert b.returncode == 0, out[-3000:]
