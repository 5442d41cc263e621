"""The package's shape, as issue 11 set it: no module over 400 lines, no import cycle, no lazy
(function-level) import between guide modules, and every module documented on the API page."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "guide"
MODULES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def guide_imports(path: Path) -> tuple[set[str], list[str]]:
    """(guide modules imported at module level, lazy guide imports inside functions)."""
    tree = ast.parse(path.read_text())
    top, lazy = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            if isinstance(node, ast.ImportFrom) and node.module == "guide":
                names = [f"guide.{a.name}" for a in node.names]
            names = [n for n in names if n == "guide" or n.startswith("guide.")]
            if not names:
                continue
            if node.col_offset == 0:
                top.update(names)
            else:
                lazy += [f"line {node.lineno}: {n}" for n in names]
    return top, lazy


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_at_most_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 400


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_lazy_import_between_guide_modules(path: Path) -> None:
    assert not guide_imports(path)[1]


def _resolve(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def test_no_import_cycle() -> None:
    known = {module_name(p) for p in MODULES}
    graph = {}
    for path in MODULES:
        me = module_name(path)
        deps = {_resolve(n, known) for n in guide_imports(path)[0]} - {None, me}
        # a package's __init__ importing its own submodules is how it re-exports, not a cycle
        graph[me] = {d for d in deps if not (d.startswith(me + ".") and path.name == "__init__.py")}
        # a submodule importing its own package's __init__ would be one
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep == "guide" or (node.startswith(dep + ".") and dep != node):
                raise AssertionError(f"{node} imports its parent package {dep}: a cycle through "
                                     "its __init__")
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack, node, dep]))
            if not state.get(dep):
                visit(dep, [*stack, node])
        state[node] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [])


def test_every_module_is_on_the_api_page() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    public = {module_name(p) for p in MODULES if not p.name.startswith("_") or p.name == "__init__.py"}
    private_parts = {"guide.launcher.local", "guide.launcher.rank_main", "guide.launcher.supervise",
                     "guide.launcher.torchrun", "guide.launcher.torch_support",
                     "guide.launcher.errors", "guide.launcher.rank"}  # documented via guide.launcher
    missing = sorted(m for m in public - private_parts if f"automodule:: {m}\n" not in api)
    assert not missing, f"modules missing from docs/api.md: {missing}"
