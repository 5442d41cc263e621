"""The browser calculator's stamp: which Python memory model its JavaScript port was checked
against.

``docs/_static/memory_widget.js`` is a hand port of :mod:`guide.memory.fit` (and of what it calls),
of ``guide-memory``'s ``--lora-rank`` (:mod:`guide.memory.finetune`) and ``--cpu-offload``
(:mod:`guide.memory.offload`).
Its ``DATA`` block is written here: the presets, precisions, optimizers, GPUs and constants the port
reads (so they cannot drift from Python's), and :func:`source_hash`, a hash of the Python model's
sources. ``tests/test_calculator_widget.py`` proves the port equal to the Python model on
:data:`CHECKED_CONFIGS` configurations; :func:`check` (run by the memory calculator page, so by
every docs build, and by ``tests/memory/test_widget.py``) fails when the model's sources or data
changed since the stamp was written, naming the fix.

``python -m guide.memory.widget`` rewrites the stamp (after the port is updated and the browser
test passes); ``--check`` only checks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import guide.memory.activations as activations
import guide.memory.architectures as architectures
import guide.memory.display as display
import guide.memory.finetune as finetune
import guide.memory.fit as fit
import guide.memory.inputs as inputs
import guide.memory.offload as offload
import guide.memory.predicted as predicted
import guide.memory.state as state
import guide.memory.transient as transient
from guide.memory.activations import CHECKPOINTING
from guide.memory.architectures import PRESETS
from guide.memory.cli import FIT_LABELS_SHORT
from guide.memory.fit import (
    DEFAULT_SHARD_GROUP,
    FIT_LABELS,
    FIT_STRATEGIES,
    FIT_WORLD_SIZES,
    GPU_BYTES,
)
from guide.memory.predicted import PRECISIONS
from guide.optimizers import OPTIMIZERS

__all__ = ["ANALYTIC_STRATEGIES", "CHECKED_CONFIGS", "MIRRORED", "OUTSIDE", "SHORT", "WIDGET_JS",
           "StaleWidget", "check", "data", "hashed_sources", "main", "render", "source_hash"]

#: The widget's file in a source checkout.
WIDGET_JS = Path(__file__).resolve().parents[3] / "docs" / "_static" / "memory_widget.js"
#: How many configurations the browser test compares (the widget states it).
CHECKED_CONFIGS = 320
#: Short names the widget's table and chart use, the command's (its one-line verdict):
#: ``ZeRO-1`` is DDP + torch's ZeroRedundancyOptimizer, ``ZeRO-2`` FSDP2 with
#: reshard_after_forward=False, ``ZeRO-2 (paper)`` the paper's stage 2 (their full labels,
#: :data:`guide.memory.fit.FIT_LABELS`, are in the strategy menu).
SHORT = dict(FIT_LABELS_SHORT)
#: Strategies the widget offers one at a time, outside "all" (as ``--strategy all`` leaves them
#: out): the ZeRO paper's stage 2, analytic (no PyTorch wrapper).
ANALYTIC_STRATEGIES = ("zero2",)
_BEGIN, _END = "// DATA-BEGIN", "// DATA-END"
#: The modules the port mirrors, hashed whole: every ``guide.memory`` module they import must be
#: here (``tests/memory/test_widget.py`` follows the imports and fails on one left out).
MIRRORED = (fit, predicted, activations, architectures, state, transient, finetune, inputs,
            display, offload)
#: Each name the mirrored modules import from outside ``guide.memory``, and how the stamp covers
#: it: ``"source"`` (its source is hashed too), ``"data"`` (only values, which the DATA block
#: carries and :func:`check` compares) or ``"not ported: ..."`` (the widget does not use it).
OUTSIDE = {
    "guide.layout.chunk_sizes": "source",
    "guide.validate.positive_int": "source",
    "guide.sharding.Strategy": "source",
    "guide.constants.CONSTANTS": "data",
    "guide.optimizers.OPTIMIZERS": "data",
    "guide.optimizers.Optimizer": "data",
    "guide.model.ModelConfig": "not ported: TinyLM's exact activations, not the calculator's",
}


class StaleWidget(RuntimeError):
    """The browser calculator was checked against another version of the Python model."""


def hashed_sources() -> dict[str, str]:
    """What :func:`source_hash` hashes, by name: each module of :data:`MIRRORED` whole, then each
    ``"source"`` entry of :data:`OUTSIDE` (read as text, so a CRLF checkout hashes as an LF one)."""
    out = {m.__name__: Path(m.__file__).read_text() for m in MIRRORED}
    for name, how in OUTSIDE.items():
        if how == "source":
            module, _, attr = name.rpartition(".")
            out[name] = inspect.getsource(getattr(importlib.import_module(module), attr))
    return out


def source_hash() -> str:
    """12 hex digits of SHA-256 over the Python sources the port mirrors
    (:func:`hashed_sources`)."""
    digest = hashlib.sha256()
    for text in hashed_sources().values():
        digest.update(text.encode())
    return digest.hexdigest()[:12]


def data() -> dict:
    """Everything the port reads besides its formulas, and the stamp."""
    return {
        "source_hash": source_hash(),
        "checked_configs": CHECKED_CONFIGS,
        "strategies": list(FIT_STRATEGIES),
        "analytic_strategies": list(ANALYTIC_STRATEGIES),
        "labels": {k: FIT_LABELS[k] for k in (*FIT_STRATEGIES, *ANALYTIC_STRATEGIES)},
        "short": SHORT,
        "default_shard_group": DEFAULT_SHARD_GROUP,
        "bounds": {k: {"label": b.label, "low": b.low, "high": b.high, "example": b.example}
                   for k, b in inputs.BOUNDS.items()},
        "gib_max": inputs.GIB_MAX,
        "order": {"presets": list(PRESETS), "precisions": list(PRECISIONS),
                  "optimizers": list(OPTIMIZERS), "gpus": list(GPU_BYTES)},
        "world_sizes": list(FIT_WORLD_SIZES),
        "checkpointing": list(CHECKPOINTING),
        "korthikanti": {"sbh": int(activations.KORTHIKANTI_SBH),
                        "scores": int(activations.KORTHIKANTI_SCORES),
                        "bytes": activations.KORTHIKANTI_BYTES},
        "gpus": GPU_BYTES,
        "precisions": {k: {"label": p.label, "param": p.param, "grad": p.grad,
                           "moment": p.moment, "master": p.master, "compute": p.compute}
                       for k, p in PRECISIONS.items()},
        "optimizers": {k: {"label": o.label, "moments": o.moments, "step_bytes": o.step_bytes}
                       for k, o in OPTIMIZERS.items()},
        "presets": {k: {"vocab": a.vocab, "hidden": a.hidden, "layers": a.layers,
                        "heads": a.heads, "kv_heads": a.kv_heads, "mlp": a.mlp,
                        "tied_embeddings": a.tied_embeddings, "gated_mlp": a.gated_mlp,
                        "bias": a.bias, "layernorm": a.layernorm,
                        "learned_positions": a.learned_positions,
                        "max_seq_len": a.max_seq_len} for k, a in PRESETS.items()},
    }


def _block(values: dict) -> str:
    return f"{_BEGIN} (written by `python -m guide.memory.widget`; do not edit by hand)\n" \
           f"  const DATA = {_indent(json.dumps(values, sort_keys=True, indent=1))};\n  {_END}"


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def render(js: str) -> str:
    """``js`` with its DATA block replaced by the current one."""
    pattern = re.compile(re.escape(_BEGIN) + r".*?" + re.escape(_END), re.S)
    if len(pattern.findall(js)) != 1:
        raise ValueError(f"the widget has no single {_BEGIN} ... {_END} block.")
    return pattern.sub(lambda _: _block(data()), js)


def check(path: Path = WIDGET_JS) -> str:
    """The stamp (:func:`source_hash`) if ``path`` carries the current model's DATA block; else
    :class:`StaleWidget` naming the fix."""
    if not path.is_file():
        raise StaleWidget(f"no browser calculator at {path}.")
    js = path.read_text()
    if render(js) != js:
        match = re.search(r'"source_hash": "([0-9a-f]+)"', js)
        raise StaleWidget(
            f"the Python memory model changed (sources {source_hash()}, the widget was checked "
            f"against {match.group(1) if match else 'nothing'}): update docs/_static/"
            "memory_widget.js's port of guide.memory.fit if a formula changed, run `python -m "
            "guide.memory.widget` to stamp it, and rerun `nox -s browser` "
            "(tests/test_calculator_widget.py) to prove it equal to the Python model.")
    return source_hash()


def main(argv: Sequence[str] | None = None) -> int:
    """Stamp the widget (or ``--check`` it); exit 1 with the fix when stale."""
    p = argparse.ArgumentParser(prog="python -m guide.memory.widget", description=__doc__)
    p.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    p.add_argument("--path", type=Path, default=WIDGET_JS)
    args = p.parse_args(argv)
    if args.check:
        try:
            print(f"widget current: model sources {check(args.path)}")
        except StaleWidget as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(render(args.path.read_text()))
    print(f"stamped {args.path} with model sources {source_hash()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
