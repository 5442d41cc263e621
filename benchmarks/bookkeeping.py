"""How much of a page's code is bookkeeping: lines that only route numbers to the page's ledger.

A page is a lesson first; every line that exists to record a number is a line a reader has to
skip. Bookkeeping lines are the lines of a call to the ledger (``claims.Ledger(...)``,
``ledger.claim/record/scope/...``, and the page kit's ``PAGE.check/state/cite/scope/assume``)
and every line of the ``record=``, ``name=`` and ``keys=`` arguments of a table call. The value a
``check``/``state``/``claim``/``record`` call records is not bookkeeping where it has lines of its
own: a check or a computation the page would show anyway (``--whole-calls`` counts them too, the
ruler of the first count). This prints, per example, its code lines (not blank, not comments, not
the docstring or the text cells), the bookkeeping lines among them, and the share; the page
kit's target is at most 5 %.

    python benchmarks/bookkeeping.py                      # every example
    python benchmarks/bookkeeping.py plot_ddp_vs_fsdp2    # some
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: Calls that only record: on the ledger (old spelling) or on the page (the page kit's).
LEDGER_CALL = re.compile(r"^(ledger|claims)\.|^PAGE\.(check|state|cite|scope|assume|record|claim)$|"
                         r"^claims\.Ledger$")
#: Calls whose second argument is the value recorded (a check's result or a computation).
VALUE_CALL = re.compile(r"(^|\.)(check|state|claim|record)$")
#: Arguments of a table call that only route it to the ledger.
ROUTING_KEYWORDS = {"record", "name", "keys"}
TABLE_CALL = re.compile(r"(^|\.)(table|show)$")


def code_lines(source: str) -> list[tuple[int, str]]:
    """The lines of ``source`` that hold code: not blank, not only a comment, not in a string
    statement (the module docstring and sphinx-gallery's text cells are comments or strings)."""
    text_lines: set[int] = set()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        # A string that is a whole statement: a docstring, not an argument.
        if tok.type == tokenize.STRING:
            before = next((t for t in reversed(tokens[:i])
                           if t.type not in (tokenize.NL, tokenize.COMMENT)), None)
            after = tokens[i + 1] if i + 1 < len(tokens) else None
            if (before is None or before.type in (tokenize.NEWLINE, tokenize.INDENT,
                                                  tokenize.DEDENT)) and \
                    (after is None or after.type in (tokenize.NEWLINE, tokenize.ENDMARKER)):
                text_lines.update(range(tok.start[0], tok.end[0] + 1))
    lines = source.splitlines()
    return [(n, line) for n, line in enumerate(lines, 1)
            if n not in text_lines and line.strip() and not line.strip().startswith("#")]


def _lines(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def bookkeeping_lines(source: str, whole_calls: bool = False) -> set[int]:
    """The line numbers of ``source`` that only record (see the module docstring)."""
    found: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if LEDGER_CALL.search(func):
            lines = _lines(node)
            if not whole_calls and VALUE_CALL.search(func) and len(node.args) >= 2:
                rest = [node.func, *node.args[:1], *node.args[2:], *node.keywords]
                lines -= _lines(node.args[1]) - {node.lineno} - set().union(*map(_lines, rest))
            found.update(lines)
        elif TABLE_CALL.search(func):
            for kw in node.keywords:
                if kw.arg in ROUTING_KEYWORDS:
                    found.update(range(kw.value.lineno, kw.value.end_lineno + 1))
    return found


def share(path: Path, whole_calls: bool = False) -> tuple[int, int]:
    """(bookkeeping lines, code lines) of one example."""
    source = path.read_text()
    numbered = dict(code_lines(source))
    return len(bookkeeping_lines(source, whole_calls) & set(numbered)), len(numbered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", help="example stems (default: all)")
    parser.add_argument("--whole-calls", action="store_true",
                        help="count the recorded value's own lines too (the first count's ruler)")
    args = parser.parse_args(argv)
    paths = ([EXAMPLES / f"{p.removesuffix('.py')}.py" for p in args.pages] if args.pages
             else sorted(EXAMPLES.glob("plot_*.py")))
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        print(f"no such example: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(f"{'page':34} {'bookkeeping':>11} {'code':>5} {'share':>6}")
    total_b = total_c = 0
    for path in paths:
        b, c = share(path, args.whole_calls)
        total_b, total_c = total_b + b, total_c + c
        print(f"{path.stem:34} {b:>11} {c:>5} {b / c:>6.1%}")
    print(f"{'all':34} {total_b:>11} {total_c:>5} {total_b / max(total_c, 1):>6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
