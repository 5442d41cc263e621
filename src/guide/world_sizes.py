"""The world sizes an example supports: declared once, at the top of the page, and read from there.

Each example declares its contract in its page declaration (:mod:`guide.declaration`), before its first
job::

    PAGE = guide.Page(section="Operate: checkpoints, clusters", order=1, key_api="init_device_mesh(",
                      world_size=4, supports=(4, 8), why="HSDP needs a 2-D mesh: an even N >= 4")

(a script that is not a gallery page may call ``guide.world_size(4, supports=(4, 8))`` itself). At
run time (:func:`guide.launcher.rank.world_size`) the call returns the default under ``python``
and torchrun's ``WORLD_SIZE`` under torchrun, and stops at once, with :class:`UnsupportedWorldSize`
naming the supported sizes and the command to use, when torchrun started a size outside it. The
docs (the gallery index, the cluster page, each page's header), the Slurm script and the test
matrix read the same call *statically* with :func:`declared` (``ast``, nothing run), so there is one
list per example and nothing to keep in step by hand.

Nothing here imports torch.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Contract", "NoDeclaration", "UnsupportedWorldSize", "check", "declared", "english",
           "header", "main"]

#: The name of the declaring call, as an example spells it: ``guide.world_size(...)``.
CALL = "world_size"
#: The call that declares a gallery page, world sizes included (:mod:`guide.declaration`).
PAGE_CALL = "Page"


class NoDeclaration(ValueError):
    """A file makes no ``guide.world_size(...)`` call: it declares no world sizes."""


class UnsupportedWorldSize(SystemExit):
    """torchrun started an example at a world size it does not support.

    A :class:`SystemExit` carrying the message: the process exits with status 1 and prints only the
    message (no traceback, and under torchrun only rank 0 speaks), before any job starts.
    """


@dataclasses.dataclass(frozen=True)
class Contract:
    """One example's world sizes: ``default`` under ``python``, any of ``supports`` under torchrun,
    and ``why`` the list is restricted (empty when it is not)."""

    default: int
    supports: tuple[int, ...]
    why: str = ""

    def __post_init__(self) -> None:
        if not self.supports or any(not isinstance(n, int) or isinstance(n, bool) or n < 1
                                    for n in self.supports):
            raise ValueError(f"supports must be positive ints, got {self.supports!r}.")
        if tuple(sorted(set(self.supports))) != self.supports:
            raise ValueError(f"supports must be increasing and distinct, got {self.supports!r}.")
        if self.default not in self.supports:
            raise ValueError(f"the default world size {self.default} is not among the supported "
                             f"sizes {english(self.supports)}: add it, or change the default.")

    def message(self, got: int, script: str) -> str:
        """What a user started at ``got`` ranks reads: the sizes, the reason, the command."""
        why = f" ({self.why})" if self.why else ""
        return (f"{Path(script).stem} supports {english(self.supports)} ranks{why}; you started "
                f"{got}. Run `torchrun --standalone --nproc-per-node={self.default} "
                f"{Path(script).name}`, or `python {Path(script).name}` ({self.default} ranks).")


def english(sizes: Iterable[int]) -> str:
    """``(2, 4, 8)`` as ``"2, 4 and 8"``."""
    words = [str(n) for n in sizes]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def check(got: int, contract: Contract, script: str | None = None) -> int:
    """``got`` if the contract supports it, else :class:`UnsupportedWorldSize` with the message."""
    if got not in contract.supports:
        raise UnsupportedWorldSize(contract.message(got, script or _script()))
    return got


def _script() -> str:
    """The running example's file name, for the command in the message."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else "")
    return path if path.endswith(".py") else "example.py"


def declared(path: str | Path) -> Contract:
    """The contract an example file declares, read without running it.

    The file must make exactly one ``Page(..., world_size=default, supports=(...), why="...")``
    call (a gallery page) or, failing that, one ``world_size(default, supports=(...), why="...")``
    call, with literal arguments; anything else is a :class:`ValueError` naming the file.
    """
    path = Path(path)
    tree = ast.parse(path.read_text(), str(path))
    pages = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _name(node.func) == PAGE_CALL]
    if pages:  # a gallery page: guide.Page(..., world_size=D, supports=(...), why=...)
        return _from_page(pages, path)
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _name(node.func) == CALL]
    if not calls:
        raise NoDeclaration(f"{path.name}: no guide.world_size(...) call declares its world sizes.")
    if len(calls) != 1:
        raise ValueError(f"{path.name}: expected one guide.world_size(...) call declaring its "
                         f"world sizes, found {len(calls)}.")
    call = calls[0]
    kwargs = {k.arg: k.value for k in call.keywords}
    if len(call.args) != 1 or "supports" not in kwargs or set(kwargs) - {"supports", "why"}:
        raise ValueError(f"{path.name}, line {call.lineno}: declare the world sizes as "
                         "guide.world_size(default, supports=(...), why='...').")
    try:
        default = ast.literal_eval(call.args[0])
        supports = tuple(ast.literal_eval(kwargs["supports"]))
        why = ast.literal_eval(kwargs["why"]) if "why" in kwargs else ""
    except ValueError:
        raise ValueError(f"{path.name}, line {call.lineno}: the world-size declaration must use "
                         "literal values (the docs read it without running the page).") from None
    return Contract(default, supports, why)


def _from_page(calls: list[ast.Call], path: Path) -> Contract:
    """The contract in a page's ``guide.Page(...)`` declaration (:mod:`guide.declaration` reads the rest)."""
    if len(calls) != 1:
        raise ValueError(f"{path.name}: expected one guide.Page(...) call declaring the page, "
                         f"found {len(calls)}.")
    kwargs = {k.arg: k.value for k in calls[0].keywords}
    if "world_size" not in kwargs or "supports" not in kwargs:
        raise ValueError(f"{path.name}, line {calls[0].lineno}: the page declaration lacks its "
                         "world sizes: guide.Page(..., world_size=D, supports=(...), why='...').")
    try:
        default, supports = (ast.literal_eval(kwargs["world_size"]),
                             tuple(ast.literal_eval(kwargs["supports"])))
        why = ast.literal_eval(kwargs["why"]) if "why" in kwargs else ""
    except ValueError:
        raise ValueError(f"{path.name}, line {calls[0].lineno}: the page declaration must use "
                         "literal values (the docs read it without running the page).") from None
    return Contract(default, supports, why)


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def header(contract: Contract) -> str:
    """The one line under a page's title: its sizes under torchrun, and why they are restricted."""
    why = f" ({contract.why})" if contract.why else ""
    return f"World sizes under torchrun: {english(contract.supports)} ranks{why}."


def main(argv: list[str]) -> int:
    """``python -c '...main(sys.argv[1:])' EXAMPLE.py N``: 0 if EXAMPLE supports N ranks (or is a
    script that declares no sizes), else 2 with the message, for a launcher script (the Slurm
    script) to refuse before it starts a job."""
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: EXAMPLE.py RANKS", file=sys.stderr)
        return 2
    try:
        contract, got = declared(argv[0]), int(argv[1])
    except NoDeclaration:
        return 0  # not one of the site's examples: nothing declared, nothing to refuse
    if got in contract.supports:
        return 0
    print(contract.message(got, argv[0]), file=sys.stderr)
    return 2
