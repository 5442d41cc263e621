"""A gallery page's declaration, read without running the page: its section, order, key API, world sizes.

Each example declares itself in one call (:class:`guide.page.Page`), and the site reads that call
*statically* (``ast``, nothing run): the gallery's sections and order (``docs/gallery_order.py``),
the key API the first code block must call (the site tests), and the world sizes
(:func:`guide.world_sizes.declared`: the world-size directive, each page's header, the Slurm check
and the test matrix). Adding a page is writing that call; no list elsewhere names the page.

Nothing here imports torch.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from guide.world_sizes import Contract

__all__ = ["Declaration", "declared_page"]

#: The keywords of the declaring call: the page's place and key API, then its world-size contract.
PLACE = ("section", "order", "key_api")
SIZES = ("world_size", "supports", "why")


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a page declares: its ``section`` (a title of ``gallery_order.SECTIONS``), its ``order``
    within the section (1 first), the ``key_api`` text its first code block must contain, and its
    world-size contract."""

    section: str
    order: int
    key_api: str
    contract: Contract

    def __post_init__(self) -> None:
        for name in ("section", "key_api"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {value!r}.")
        if not isinstance(self.order, int) or isinstance(self.order, bool) or self.order < 1:
            raise ValueError(f"order must be a whole number from 1 (first in its section), "
                             f"got {self.order!r}.")


def declaring_call(tree: ast.AST, filename: str) -> ast.Call | None:
    """The one ``Page(...)`` call of a parsed file (``None`` if there is none); two is an error."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and (node.func.attr if isinstance(node.func, ast.Attribute)
                  else getattr(node.func, "id", "")) == "Page"]
    if len(calls) > 1:
        raise ValueError(f"{filename}: declare the page once; found {len(calls)} Page(...) calls "
                         f"(lines {', '.join(str(c.lineno) for c in calls)}).")
    return calls[0] if calls else None


def literal_keywords(call: ast.Call, filename: str) -> dict[str, object]:
    """The keyword arguments of the declaring call as values; only the known ones, all literal."""
    if call.args or any(k.arg is None for k in call.keywords):
        raise ValueError(f"{filename}, line {call.lineno}: declare the page with keywords only: "
                         f"Page({', '.join(f'{k}=...' for k in PLACE + SIZES)}).")
    unknown = sorted({k.arg for k in call.keywords} - set(PLACE + SIZES))
    if unknown:
        raise ValueError(f"{filename}, line {call.lineno}: Page() takes no {', '.join(unknown)}; "
                         f"its keywords are {', '.join(PLACE + SIZES)}.")
    try:
        return {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except ValueError:
        raise ValueError(f"{filename}, line {call.lineno}: the page declaration must use literal "
                         "values (the docs read it without running the page).") from None


def declared_page(path: str | Path) -> Declaration:
    """The declaration of an example file, read without running it: a :class:`ValueError` naming
    the file and the fix when it has none, two, or one that is not literal or not complete."""
    path = Path(path)
    call = declaring_call(ast.parse(path.read_text(), str(path)), path.name)
    if call is None:
        raise ValueError(f"{path.name}: no guide.Page(...) call declares the page: add "
                         "PAGE = guide.Page(section=..., order=..., key_api=..., world_size=..., "
                         "supports=...) before its first job.")
    given = literal_keywords(call, path.name)
    missing = [k for k in PLACE + SIZES[:2] if k not in given]
    if missing:
        raise ValueError(f"{path.name}, line {call.lineno}: the page declaration lacks "
                         f"{', '.join(missing)}.")
    contract = Contract(given["world_size"], tuple(given["supports"]), given.get("why", ""))
    return Declaration(given["section"], given["order"], given["key_api"], contract)
