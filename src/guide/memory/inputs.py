"""The calculator's inputs: one table of bounds, one parser, one wording per mistake.

The command (:mod:`guide.memory.cli`) and the browser widget (``docs/_static/memory_widget.js``,
which reads :data:`BOUNDS` from its DATA block and ports :func:`parse_int`, :func:`parse_gib`,
:func:`unknown` and :func:`check_heads` line by line) refuse the same inputs with the same sentence;
only the name of the field differs (``--world-size`` on the command line, *Number of GPUs* in the
browser). A number is read exactly, as a decimal (``70e9``, ``1.5e3``, ``4,096``), never through a
float: ``9007199254740993`` stays itself and ``1e30`` is refused as too large, not printed as
1,000,000,000,000,000,019,884,624,838,656.

Why bound at all: every bound is far beyond any real model, and keeps one answer under a second
(the ZeRO-1 partition and FSDP2's shards are computed rank by rank, so the work grows with layers x
N) and every byte count exact in a browser (no parameter count above 2**53 - 1).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

__all__ = ["BOUNDS", "CLI_HEAD_NAMES", "GIB_MAX", "HEAD_NAMES", "MAX_WORLD_SIZES", "Bound",
           "check_heads", "check_param_count", "check_seq_len", "parse_gib",
           "parse_int", "unknown"]


@dataclasses.dataclass(frozen=True)
class Bound:
    """One whole-number input: its name in the browser (``label``) and on the command line
    (``flag``), the smallest and largest value accepted, and an example for the message."""

    label: str
    flag: str
    low: int
    high: int
    example: str = "8"


#: Every whole-number input of the calculator, by key (the widget's field names).
BOUNDS: dict[str, Bound] = {
    "params": Bound("Parameters", "--params", 1, 2**53 - 1, "70e9"),
    "layers": Bound("Layers", "--layers", 1, 512, "32"),
    "hidden": Bound("Hidden size", "--hidden", 1, 2**20, "4096"),
    "heads": Bound("Attention heads", "--heads", 1, 2**16, "32"),
    "kv_heads": Bound("KV heads", "--kv-heads", 1, 2**16, "8"),
    "vocab": Bound("Vocabulary", "--vocab", 1, 2**24, "128256"),
    "mlp": Bound("MLP size", "--mlp", 1, 2**22, "14336"),
    "max_seq_len": Bound("Longest sequence", "--max-seq-len", 1, 2**24, "8192"),
    "seq_len": Bound("Sequence length", "--seq-len", 1, 2**24, "4096"),
    "micro_batch": Bound("Micro-batch", "--micro-batch", 1, 2**16, "1"),
    "world_size": Bound("Number of GPUs", "--world-size", 1, 16384, "8"),
    "shard_group": Bound("HSDP shard group", "--shard-group", 1, 16384, "8"),
    "lora_rank": Bound("LoRA rank", "--lora-rank", 1, 65536, "16"),
}
#: The largest GPU memory accepted, in GiB (a pebibyte).
GIB_MAX = 2**20
#: The most world sizes one command prices (``-N 1 2 4 ...``).
MAX_WORLD_SIZES = 8

_NUMBER = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$")


def _clean(text: object) -> str:
    return re.sub(r"[,_\s]", "", str(text))


def parse_int(key: str, text: object, what: str | None = None) -> int:
    """The whole number ``text`` says, within :data:`BOUNDS` ``[key]``; else ``ValueError`` with
    one sentence naming the field (``what``, default the widget's label) and the fix.

    Read as an exact decimal: ``"70e9"`` is 70,000,000,000, ``"2.5"`` is not whole, ``"1e400"``
    is too large, ``"inf"`` is not a number."""
    b = BOUNDS[key]
    what = b.label if what is None else what
    t = _clean(text)
    if t == "":
        raise ValueError(f"{what}: enter a whole number (it is empty).")
    m = _NUMBER.match(t)
    if not m or not (m[2] or m[3]):
        raise ValueError(f'{what}: "{text}" is not a number; enter a whole number such as '
                         f"{b.example}.")
    digits = (m[2] + (m[3] or "")).lstrip("0")
    exp = m[4] or "0"
    exp_value = int(exp) if len(exp.lstrip("+-")) <= 9 else (-1 if exp[0] == "-" else 1) * 10**9
    if digits == "" or m[1] == "-":
        raise ValueError(f"{what} must be at least {b.low:,}, got {t}.")
    stripped = digits.rstrip("0")
    shift = exp_value - len(m[3] or "") + len(digits) - len(stripped)
    if shift < 0:
        raise ValueError(f"{what} must be a whole number, got {t}.")
    if len(stripped) + shift > len(str(b.high)):
        raise ValueError(f"{what} must be at most {b.high:,}, got {t}.")
    value = int(stripped) * 10**shift
    if value < b.low:
        raise ValueError(f"{what} must be at least {b.low:,}, got {t}.")
    if value > b.high:
        raise ValueError(f"{what} must be at most {b.high:,}, got {t}.")
    return value


def parse_gib(text: object, what: str = "GPU memory") -> float:
    """A GPU's memory in GiB: a positive decimal number up to :data:`GIB_MAX` (read as the
    nearest double, as a browser reads it)."""
    t = _clean(text)
    m = _NUMBER.match(t)
    value = float(t) if m and (m[2] or m[3]) else math.nan
    if not value > 0 or m[1] == "-":
        raise ValueError(f'{what} must be a positive number of GiB, such as 80; got "{t}".')
    if value > GIB_MAX:
        raise ValueError(f"{what} must be at most {GIB_MAX:,} GiB, got {t}.")
    return value


def unknown(what: str, value: object, options: Iterable[str]) -> ValueError:
    """The error for a choice that is not one of ``options``: it names them."""
    return ValueError(f'unknown {what} "{value}"; choose one of {", ".join(options)}.')


#: How :func:`check_heads` names the fields in the browser; the command names its options.
HEAD_NAMES = ("Attention heads", "the hidden size", "KV heads", "the attention heads")
CLI_HEAD_NAMES = ("--heads", "--hidden", "--kv-heads", "--heads")


def check_heads(hidden: int, heads: int, kv_heads: int | None,
                names: tuple[str, str, str, str] = HEAD_NAMES) -> None:
    """``ValueError`` naming the fix when ``heads`` does not divide ``hidden`` or ``kv_heads``
    does not divide ``heads``; ``names``: how the fields are called on this side
    (:data:`HEAD_NAMES`, :data:`CLI_HEAD_NAMES`)."""
    if hidden % heads:
        fit = hidden % 64 == 0
        raise ValueError(f"{names[0]} ({heads}) must divide {names[1]} ({hidden}): try "
                         f"{hidden // 64 if fit else 1} heads of {64 if fit else hidden} "
                         "dimensions.")
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{names[2]} ({kv_heads}) must divide {names[3]} ({heads}).")


def check_seq_len(seq_len: int, max_seq_len: int | None, model: str,
                  what: str = "Sequence length") -> None:
    """``ValueError`` when ``seq_len`` is longer than ``model`` supports (``max_seq_len``)."""
    if max_seq_len is not None and seq_len > max_seq_len:
        raise ValueError(f"{what} {seq_len:,} is longer than {model} supports "
                         f"({max_seq_len:,} positions); use {max_seq_len:,} or fewer.")


def check_param_count(n_params: int) -> int:
    """``n_params`` if within :data:`BOUNDS` ``["params"]``; else ``ValueError`` (a shape whose
    dimensions are each in bounds can still multiply past it)."""
    top = BOUNDS["params"].high
    if n_params > top:
        raise ValueError(f"this shape has {n_params:,} parameters, more than {top:,}: reduce "
                         "a dimension.")
    return n_params
