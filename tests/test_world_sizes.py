"""The world-size contract (:mod:`guide.world_sizes`): every example declares one, an unsupported
size stops an example at once with a message that names the fix, and the site's statements, the
Slurm script and the test matrix are generated from the same declarations."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

import guide
from guide.world_sizes import (Contract, NoDeclaration, UnsupportedWorldSize, check, declared,
                               english, header, main)

EXAMPLE_FILES = sorted(EXAMPLES.glob("plot_*.py"))
MATRIX_SIZES = (1, 2, 4, 8)
TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}

#: (example, an unsupported size among 1, 2, 4, 8): each is started as torchrun's rank 0 would be.
UNSUPPORTED = [(p, n) for p in EXAMPLE_FILES for n in MATRIX_SIZES
               if n not in declared(p).supports]


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_every_example_declares_its_world_sizes(path: Path) -> None:
    """One literal declaration per example; a restricted one says why (2 is the size a user tries
    first: any example that refuses it must explain itself)."""
    contract = declared(path)
    assert contract.default in contract.supports
    if 2 not in contract.supports:
        assert contract.why, f"{path.name} refuses 2 ranks without saying why"


def test_the_examples_that_refuse_2_ranks_need_a_2d_mesh_or_a_divisor() -> None:
    restricted = {p.stem: declared(p).supports for p in EXAMPLE_FILES
                  if 2 not in declared(p).supports}
    assert restricted == {"plot_hsdp": (4, 8), "plot_fsdp1_migration": (4,),
                          "plot_reshard_after_forward": (4,), "plot_tp_fsdp2": (4, 8),
                          "plot_choosing_units": (4,),
                          "plot_gradient_accumulation": (4,),
                          "plot_experts_mesh": (4, 8)}


def test_the_message_names_the_sizes_the_reason_and_the_command() -> None:
    contract = Contract(4, (4, 8), "HSDP needs a 2-D mesh: an even N >= 4")
    with pytest.raises(UnsupportedWorldSize) as err:
        check(2, contract, "/somewhere/plot_hsdp.py")
    assert str(err.value) == (
        "plot_hsdp supports 4 and 8 ranks (HSDP needs a 2-D mesh: an even N >= 4); you started 2. "
        "Run `torchrun --standalone --nproc-per-node=4 plot_hsdp.py`, or `python plot_hsdp.py` "
        "(4 ranks).")
    assert check(8, contract) == 8


def test_world_size_refuses_an_unsupported_size_under_torchrun(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**TORCHRUN_ENV, "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UnsupportedWorldSize,
                       match=r"supports 4 and 8 ranks \(why\); you started 2"):
        guide.world_size(4, supports=(4, 8), why="why")
    assert guide.world_size(2, supports=(2, 4)) == 2


def test_world_size_is_the_default_with_python(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (*TORCHRUN_ENV, "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    assert guide.world_size(4, supports=(4, 8)) == 4


@pytest.mark.parametrize("default, supports", [(2, (4, 8)), (4, (8, 4)), (4, (0, 4)), (4, ())])
def test_a_contract_that_contradicts_itself_is_refused(default: int, supports: tuple) -> None:
    with pytest.raises(ValueError):
        Contract(default, supports)


@pytest.mark.parametrize("text, error", [
    ("import guide\n", NoDeclaration),
    ("N = guide.world_size(2, supports=(2,))\nM = guide.world_size(2, supports=(2,))\n",
     "found 2"),
    ("S = (2, 4)\nN = guide.world_size(2, supports=S)\n", "literal values"),
    ("N = guide.world_size(2)\n", "declare the world sizes as"),
])
def test_a_declaration_the_docs_cannot_read_is_refused(tmp_path: Path, text: str,
                                                       error: type | str) -> None:
    path = tmp_path / "plot_x.py"
    path.write_text(text)
    with pytest.raises(error if isinstance(error, type) else ValueError,
                       match=None if isinstance(error, type) else error):
        declared(path)


def test_the_slurm_check_refuses_only_an_unsupported_declared_size(tmp_path: Path,
                                                                   capsys) -> None:
    hsdp = str(EXAMPLES / "plot_hsdp.py")
    assert main([hsdp, "8"]) == 0
    assert main([hsdp, "2"]) == 2
    assert "plot_hsdp supports 4 and 8 ranks" in capsys.readouterr().err
    plain = tmp_path / "mine.py"
    plain.write_text("print('not an example of this site')\n")
    assert main([str(plain), "3"]) == 0


def test_the_slurm_script_refuses_an_unsupported_size_before_the_job(tmp_path: Path) -> None:
    """2 GPUs on one node for the HSDP page: the script stops with the message; srun never runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/bash\ntouch {tmp_path}/srun-ran\n")
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_ID": "1"}
    proc = subprocess.run(["bash", str(ROOT / "docs" / "_static" / "ddp_vs_fsdp2.sbatch"),
                           str(EXAMPLES / "plot_hsdp.py")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "plot_hsdp supports 4 and 8 ranks" in proc.stderr
    assert not (tmp_path / "srun-ran").exists()


def declaring_statement(path: Path) -> ast.Module:
    """The module-level statement of ``path`` that makes its ``guide.Page(...)`` call, alone."""
    tree = ast.parse(path.read_text(), str(path))
    found = [stmt for stmt in tree.body if any(
        isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Page"
        for node in ast.walk(stmt))]
    assert len(found) == 1, f"{path.name}: {len(found)} module-level guide.Page statements"
    return ast.Module(body=found, type_ignores=[])


@pytest.mark.parametrize("path, n", UNSUPPORTED, ids=[f"{p.stem}-n{n}" for p, n in UNSUPPORTED])
def test_the_declaring_statement_refuses_an_unsupported_size(path: Path, n: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example's own declaring statement (``PAGE = guide.Page(...)``), as its file writes it, run in this process with
    torchrun's rank-0 environment at ``n`` ranks and the example as ``__main__``, stops with the
    message naming the example, its sizes and the command (in-process: the decision is made before
    any rank starts, so no rank is started here; the two subprocess runs below show the exit)."""
    for key in ("TORCHELASTIC_RUN_ID",):
        monkeypatch.delenv(key, raising=False)
    for key, value in {**TORCHRUN_ENV, "WORLD_SIZE": str(n)}.items():
        monkeypatch.setenv(key, value)
    main_module = types.ModuleType("__main__")
    main_module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, "__main__", main_module)
    namespace = {"__name__": "__main__", "__file__": str(path), "guide": guide}
    with pytest.raises(UnsupportedWorldSize) as refused:
        exec(compile(declaring_statement(path), str(path), "exec"), namespace)
    message, contract = str(refused.value), declared(path)
    assert f"{path.stem} supports {english(contract.supports)} ranks" in message
    assert (f"you started {n}. Run `torchrun --standalone --nproc-per-node={contract.default} "
            f"{path.name}`") in message
    assert not set(namespace) - {"__name__", "__file__", "guide", "__builtins__"}  # stopped there


def test_the_declaring_statement_accepts_each_supported_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same statements at every supported size return that size (the refusal above is not a
    statement that refuses everything)."""
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    for path in EXAMPLE_FILES:
        for n in declared(path).supports:
            monkeypatch.setenv("WORLD_SIZE", str(n))
            namespace = {"__name__": "__main__", "__file__": str(path), "guide": guide}
            exec(compile(declaring_statement(path), str(path), "exec"), namespace)
            assert namespace["PAGE"].world_size == n, path.name


#: The refusal run as a process: one example whose smallest size is too many (the main example at
#: 1 rank) and one that needs a 2-D mesh (HSDP at 2). ``nox -s modes`` runs every unsupported size.
REAL_REFUSALS = (UNSUPPORTED if os.environ.get("GUIDE_MODES") == "1" else
                 [(p, n) for p, n in UNSUPPORTED
                  if (p.stem, n) in {("plot_ddp_vs_fsdp2", 1), ("plot_hsdp", 2)}])


def test_the_real_refusal_runs_are_the_two_named() -> None:
    assert len(REAL_REFUSALS) == (len(UNSUPPORTED) if os.environ.get("GUIDE_MODES") == "1" else 2)


@pytest.mark.parametrize("path, n", REAL_REFUSALS,
                         ids=[f"{p.stem}-n{n}" for p, n in REAL_REFUSALS])
def test_an_unsupported_size_stops_the_example_at_once(path: Path, n: int,
                                                       tmp_path: Path) -> None:
    """Started as torchrun's rank 0 at a size it does not support, the example exits 1 with the
    message and no traceback, before its first job (no process group: MASTER_PORT 1 is never
    dialled; measured 9-35 s each, mostly importing torch, on 2 cores shared with other jobs)."""
    env = {**os.environ, **TORCHRUN_ENV, "WORLD_SIZE": str(n), "MPLBACKEND": "Agg"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    contract = declared(path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{path.stem} supports {english(contract.supports)} ranks" in proc.stderr
    assert f"you started {n}. Run `torchrun --standalone" in proc.stderr
    assert "Traceback" not in proc.stderr and "[guide]" not in proc.stderr
    assert time.monotonic() - start < 110


def test_the_gallery_index_and_cluster_page_use_the_generated_list() -> None:
    """The statements are generated: the directive stands where a typed list would, and no page
    claims one size for all examples."""
    gallery = (EXAMPLES / "GALLERY_HEADER.rst").read_text()
    cluster = (ROOT / "docs" / "pages" / "cluster.md").read_text()
    assert ".. world-sizes::" in gallery and "```{world-sizes}" in cluster
    assert "at any world size" not in cluster
    assert not re.search(r"runs unchanged[^.]*--nproc-per-node=2", gallery)


def test_each_page_header_line_states_the_declared_sizes() -> None:
    """The extension puts the declared sizes under the title of each generated page, and refuses
    a page where it finds no title (rather than silently leaving the line out)."""
    from types import SimpleNamespace
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from world_sizes_ext import _header_line
    finally:
        sys.path.remove(str(ROOT / "docs"))
    conf = SimpleNamespace(world_sizes_examples_dir="../examples")
    app = SimpleNamespace(srcdir=str(ROOT / "docs"), config=conf)
    page = [".. only:: html\n\n    note\n\n.. _sphx_glr_auto_examples_plot_hsdp.py:\n\n"
            "HSDP: shard inside a node\n=========================\n\nText.\n"]
    _header_line(app, "auto_examples/plot_hsdp", page)
    assert ("=========================\n\n.. rst-class:: world-sizes\n\n*World sizes under "
            "torchrun: 4 and 8 ranks (HSDP needs a 2-D mesh") in page[0]
    two_blank_lines = [page_text.replace("py:\n\n", "py:\n\n\n") for page_text in (
        ".. _sphx_glr_auto_examples_plot_hsdp.py:\n\nHSDP\n====\n",)]  # an example not run
    _header_line(app, "auto_examples/plot_hsdp", two_blank_lines)
    assert "====\n\n.. rst-class:: world-sizes" in two_blank_lines[0]
    with pytest.raises(ValueError, match="no title"):
        _header_line(app, "auto_examples/plot_hsdp", ["no title here\n"])


@pytest.mark.parametrize("got", [1, 2, 3, 5, 6, 7, 16])
def test_the_slurm_check_refuses_every_size_outside_the_list(tmp_path: Path, got: int,
                                                             capsys) -> None:
    """Sizes above the default that the list lacks (5, 6, 16 for 4-and-8) are refused too: the
    check is membership, not a bound."""
    page = tmp_path / "plot_x.py"
    page.write_text('N = guide.world_size(4, supports=(4, 8), why="a 2-D mesh")\n')
    assert main([str(page), str(got)]) == 2
    assert capsys.readouterr().err == (
        f"plot_x supports 4 and 8 ranks (a 2-D mesh); you started {got}. Run `torchrun "
        "--standalone --nproc-per-node=4 plot_x.py`, or `python plot_x.py` (4 ranks).\n")
    assert main([str(page), "4"]) == 0 and main([str(page), "8"]) == 0


@pytest.mark.parametrize("argv", [[], ["plot_x.py"], ["plot_x.py", "four"],
                                  ["plot_x.py", "4", "8"], ["plot_x.py", "-4"]])
def test_the_slurm_check_refuses_a_malformed_command_line(argv: list, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == "usage: EXAMPLE.py RANKS\n"


@pytest.mark.parametrize("supports", ["(8, 4)", "(4, 4, 8)", "[8, 4]"])
def test_declared_reads_the_sizes_as_written_and_refuses_unsorted_or_repeated_ones(
        tmp_path: Path, supports: str) -> None:
    """The docs must show what the example says: an unsorted or repeated list is an error in the
    example, not something to tidy silently."""
    page = tmp_path / "plot_x.py"
    page.write_text(f"N = guide.world_size(4, supports={supports})\n")
    with pytest.raises(ValueError, match="increasing and distinct"):
        declared(page)


def test_declared_returns_the_default_sizes_and_reason_as_written(tmp_path: Path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text('import guide\nN = guide.world_size(2, supports=[1, 2, 8], why="w")\n')
    assert declared(page) == Contract(2, (1, 2, 8), "w")
    page.write_text("from guide import world_size\nN = world_size(8, supports=(8,))\n")
    assert declared(page) == Contract(8, (8,), "")
    page.write_text("N = guide.world_size(2, supports=(2,), reason='typo')\n")
    with pytest.raises(ValueError, match=r"plot_x.py, line 1: declare the world sizes"):
        declared(page)


def test_english_and_the_header_name_every_size_and_the_reason() -> None:
    assert english((8,)) == "8" and english((2, 4)) == "2 and 4"
    assert english((1, 2, 4, 8)) == "1, 2, 4 and 8"
    assert header(Contract(4, (4, 8), "why")) == "World sizes under torchrun: 4 and 8 ranks (why)."
    assert header(Contract(2, (1, 2))) == "World sizes under torchrun: 1 and 2 ranks."
    assert Contract(2, (1, 2)).message(3, "x/plot_y.py") == (
        "plot_y supports 1 and 2 ranks; you started 3. Run `torchrun --standalone "
        "--nproc-per-node=2 plot_y.py`, or `python plot_y.py` (2 ranks).")


@pytest.mark.parametrize("supports", [(True, 2), (2, 2.0), (2, "4")])
def test_a_contract_of_non_int_sizes_is_refused(supports: tuple) -> None:
    with pytest.raises(ValueError, match="positive ints"):
        Contract(2, supports)


def test_the_default_outside_the_list_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"default world size 2 is not among the supported "
                                         r"sizes 4 and 8: add it, or change the default"):
        Contract(2, (4, 8))


def test_the_message_names_the_running_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """No script given: the file ``python`` ran (``__main__``), else ``argv[0]``, else (a notebook,
    a REPL) a placeholder."""
    from types import SimpleNamespace

    contract = Contract(4, (4,))
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__file__="/x/plot_main.py"))
    with pytest.raises(UnsupportedWorldSize,
                       match=r"^plot_main supports 4 ranks; .*plot_main\.py`"):
        check(2, contract)
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace())
    monkeypatch.setattr(sys, "argv", ["/y/plot_argv.py", "--flag"])
    with pytest.raises(UnsupportedWorldSize, match=r"^plot_argv supports"):
        check(2, contract)
    for argv in ([""], [], ["ipykernel_launcher"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(UnsupportedWorldSize, match=r"^example supports 4 ranks; you started "
                                                       r"2\. Run `torchrun --standalone "
                                                       r"--nproc-per-node=4 example\.py`"):
            check(2, contract)
    assert check(4, contract, "whatever.py") == 4


@pytest.mark.parametrize("text", [
    "N = guide.world_size(2, 4, supports=(2, 4))\n",
    "N = guide.world_size(supports=(2, 4))\n",
    "N = guide.world_size(2, supports=(2, 4), why='w', default=2)\n",
])
def test_a_declaration_with_the_wrong_arguments_names_its_line(tmp_path: Path, text: str) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text("import guide\n\n" + text)
    with pytest.raises(ValueError, match=r"^plot_x\.py, line 3: declare the world sizes as "
                                         r"guide\.world_size\(default, supports=\(\.\.\.\), "
                                         r"why='\.\.\.'\)\.$"):
        declared(page)


def test_declared_names_the_file_and_what_it_found(tmp_path: Path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text("N = guide.world_size(2, supports=(2,))\nM = world_size(2, supports=(2,))\n")
    with pytest.raises(ValueError, match=r"^plot_x\.py: expected one guide\.world_size\(\.\.\.\) "
                                         r"call declaring its world sizes, found 2\.$"):
        declared(page)
    page.write_text("f()()\nN = g.world_sizes(2)\n")
    with pytest.raises(NoDeclaration, match=r"^plot_x\.py: no guide\.world_size\(\.\.\.\) call "
                                            r"declares its world sizes\.$"):
        declared(page)
    page.write_text("N = guide.world_size(2, supports=(2,), why=WHY)\n")
    with pytest.raises(ValueError, match=r"^plot_x\.py, line 1: the world-size declaration must "
                                         r"use literal values \(the docs read it without running "
                                         r"the page\)\.$"):
        declared(page)


def test_a_page_that_does_not_parse_is_named_in_the_syntax_error(tmp_path: Path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text("N = guide.world_size(2, supports=(2,)\n")
    with pytest.raises(SyntaxError) as err:
        declared(page)
    assert err.value.filename == str(page)


@pytest.mark.parametrize("call", ["guide.Page(world_size=2)", "guide.Page(supports=(2,))",
                                  "guide.Page(section='s', order=1)"])
def test_a_page_declaration_without_its_sizes_names_its_line_and_the_fix(tmp_path: Path,
                                                                         call: str) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text(f"import guide\n\nPAGE = {call}\n")
    with pytest.raises(ValueError) as err:
        declared(page)
    assert str(err.value) == ("plot_x.py, line 3: the page declaration lacks its world sizes: "
                              "guide.Page(..., world_size=D, supports=(...), why='...').")


def test_a_page_declaration_is_read_once_and_literally_and_its_reason_defaults_to_empty(
        tmp_path: Path) -> None:
    page = tmp_path / "plot_x.py"
    page.write_text("PAGE = guide.Page(world_size=2, supports=(2, 4))\n")
    assert declared(page) == Contract(2, (2, 4), "")
    page.write_text("PAGE = guide.Page(world_size=2, supports=(2,))\n"
                    "OTHER = guide.Page(world_size=2, supports=(2,))\n")
    with pytest.raises(ValueError) as err:
        declared(page)
    assert str(err.value) == ("plot_x.py: expected one guide.Page(...) call declaring the page, "
                              "found 2.")
    page.write_text("\nPAGE = guide.Page(world_size=N, supports=(2,))\n")
    with pytest.raises(ValueError) as err:
        declared(page)
    assert str(err.value) == ("plot_x.py, line 2: the page declaration must use literal values "
                              "(the docs read it without running the page).")
