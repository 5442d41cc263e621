"""The package's layers: every import of a ``guide`` module goes down (or across) the order below,
so no module loads one above it and nothing imports in a cycle.

The graph is read from the source (``ast``: every ``import`` and ``from ... import`` of a ``guide``
module, inside functions too), and importing ``guide.a.b`` counts as importing the package
``guide.a`` as well, as Python runs its ``__init__`` first (the root package ``guide`` aside: every
import runs it, and it imports only the launcher and the page declaration).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "guide"

#: Low to high. A module belongs to the longest entry that is a prefix of its name; it may import
#: modules of its own entry or of an entry before it.
LAYERS = (
    "guide.fault_points", "guide.validate", "guide.world_sizes", "guide.checked", "guide.claims", "guide.constants",
    "guide.launcher", "guide.declaration", "guide.model", "guide.data", "guide.layout", "guide.sharding",
    "guide.optimizers", "guide.memory", "guide.comm", "guide.unshard_timeline", "guide.host_copies", "guide.checks",
    "guide.training",
    "guide.reference", "guide.precision", "guide.saved_tensors", "guide.tensor_parallel",
    "guide.experts",
    "guide.compiled", "guide.checkpoint_verify", "guide.checkpoint", "guide.hangs", "guide.report",
    "guide.script_diff", "guide.rendered", "guide.rendered_tables", "guide.page", "guide.plotting",
    "guide.memory.cli",
    "guide.memory.widget", "guide.memory.__main__", "guide", "guide.pitfalls",
)


def module_name(path: Path, src: Path = SRC) -> str:
    parts = ("guide", *path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The ``guide`` modules a file imports (absolute imports; the package's style)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "guide" or name.startswith("guide."):
                parts = name.split(".")
                found |= {".".join(parts[:k]) for k in range(2, len(parts) + 1)}  # parents too
    return found


def graph(src: Path = SRC) -> dict[str, set[str]]:
    g = {module_name(p, src): imports(p) for p in sorted(src.rglob("*.py"))}
    # A module's own packages are being imported already when it runs: not an edge.
    return {m: {d for d in deps if d != m and not m.startswith(d + ".")} for m, deps in g.items()}


def layer(module: str) -> int:
    matches = [k for k, entry in enumerate(LAYERS)  # the root entry holds the root module only
               if module == entry or (entry != "guide" and module.startswith(entry + "."))]
    if not matches:
        raise KeyError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return max(matches, key=lambda k: len(LAYERS[k]))


def upward(g: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a higher layer, as ``"a -> b"``."""
    return sorted(f"{m} -> {d}" for m, deps in g.items() for d in deps
                  if d in g and layer(d) > layer(m))


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among the package's modules (each found once, from its first module)."""
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(g.get(m, ())):
            if d not in g:
                continue
            if state.get(d) == "open":
                found.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    return found


def test_every_module_has_a_layer_and_no_import_goes_up() -> None:
    g = graph()
    for m in g:
        layer(m)
    assert upward(g) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize("low, high", [
    ("guide.training", "guide.checks"),          # the loop does not assert
    ("guide.launcher", "guide.memory"),          # ranks start without the memory arithmetic
    ("guide.memory", "guide.training"),          # the arithmetic does not load the loop
    ("guide.constants", "guide.claims"),         # a cited value needs no ledger to exist
])
def test_the_named_edges_stay_absent(low: str, high: str) -> None:
    g = graph()
    bad = [f"{m} -> {d}" for m, deps in g.items() if m == low or m.startswith(low + ".")
           for d in deps if d == high or d.startswith(high + ".")]
    assert bad == []


def test_the_guards_see_an_upward_import_a_cycle_and_an_unplaced_module(tmp_path: Path) -> None:
    pkg = tmp_path / "guide"
    (pkg / "launcher").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launcher" / "__init__.py").write_text("")
    (pkg / "launcher" / "rank_main.py").write_text("def f():\n    from guide.memory.peak import x\n")
    (pkg / "memory").mkdir()
    (pkg / "memory" / "__init__.py").write_text("from guide.memory.peak import x\n")
    (pkg / "memory" / "peak.py").write_text("import guide.launcher.rank_main\nx = 1\n")
    g = graph(pkg)
    assert "guide.launcher.rank_main -> guide.memory" in upward(g)
    assert "guide.launcher.rank_main -> guide.memory.peak" in upward(g)
    assert any({"guide.launcher.rank_main", "guide.memory.peak"} <= set(c) for c in cycles(g))
    with pytest.raises(KeyError, match="in no layer"):
        layer("guide.unplaced")
