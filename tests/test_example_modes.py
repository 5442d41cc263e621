"""The main example runs four ways unchanged: docs build (test_faults' control + nox -s docs),
``python example.py`` (test_faults), under ``torchrun``, and as the notebook sphinx-gallery makes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from conftest import MAIN_EXAMPLE
from nbclient import NotebookClient
from sphinx_gallery.notebook import jupyter_notebook, save_notebook
from sphinx_gallery.py_source_parser import split_code_and_text_blocks


def test_under_torchrun_each_rank_runs_the_checks(tmp_path: Path) -> None:
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(MAIN_EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("All checks passed") == 2, out[-3000:]  # one per rank


def test_generated_notebook_executes(tmp_path: Path) -> None:
    """The .ipynb sphinx-gallery generates from the example runs top to bottom in a kernel: the worker
    functions live in the notebook's ``__main__`` and still reach the ranks (sent by value)."""
    _, blocks = split_code_and_text_blocks(str(MAIN_EXAMPLE))[:2]
    gallery_conf = {"first_notebook_cell": None, "last_notebook_cell": None,
                    "notebook_images": False, "pypandoc": False, "promote_jupyter_magic": False}
    nb_path = tmp_path / "example.ipynb"
    save_notebook(jupyter_notebook(blocks, gallery_conf, str(tmp_path)), str(nb_path))
    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "All checks passed" in text
