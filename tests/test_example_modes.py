"""The main example runs four ways unchanged: docs build (test_faults' control + nox -s docs),
``python example.py`` (test_faults), under ``torchrun`` (here: the cluster page's two-node rehearsal;
one node under Slurm in test_site), and as the notebook sphinx-gallery makes."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import MAIN_EXAMPLE, ROOT
from nbclient import NotebookClient
from sphinx_gallery.notebook import jupyter_notebook, save_notebook
from sphinx_gallery.py_source_parser import split_code_and_text_blocks


CLUSTER_PAGE = ROOT / "docs" / "pages" / "cluster.md"


def _rehearsal_commands(port: int) -> list[list[str]]:
    """The two-"node" torchrun command pair exactly as the cluster page shows it, with this
    interpreter's torchrun, a free port and the path of the main example."""
    text = CLUSTER_PAGE.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    block = next(b for b in blocks if "--rdzv-endpoint=127.0.0.1:" in b)
    lines = block.replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("torchrun ")]
    assert len(commands) == 2, f"expected two torchrun commands in the rehearsal block:\n{block}"
    runnable = []
    for command in commands:
        args = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in command[1:]]
        args = [str(MAIN_EXAMPLE) if a == MAIN_EXAMPLE.name else a for a in args]
        runnable.append([sys.executable, "-m", "torch.distributed.run", *args])
    return runnable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(360)  # bounded by the 300 s the two torchrun processes get below
def test_two_node_rehearsal_runs_the_page_once(tmp_path: Path) -> None:
    """The cluster page's rehearsal: two torchrun "nodes" of 2 ranks on loopback (world size 4, c10d
    rendezvous) run the main example; only rank 0 speaks, so the page's output appears once."""
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for command in _rehearsal_commands(_free_port())]
    try:
        outs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    out = "\n".join(outs)
    assert [node.returncode for node in nodes] == [0, 0], out[-6000:]
    assert out.count("All checks passed") == 1, out[-6000:]  # rank 0's voice only
    assert out.count("DDP x4, sgd") == 1, out[-6000:]  # the results table: 4 ranks, printed once
    assert "[rank " not in out, out[-6000:]  # no rank failed


@pytest.mark.timeout(360)  # bounded by the notebook client's 300 s
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
