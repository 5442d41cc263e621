"""The ``guide-memory`` command: predicted bytes per GPU for DDP, ZeRO-1, ZeRO-2, FSDP2 and HSDP.

``guide-memory --preset llama-3-8b -N 1 8 64 --seq-len 8192 --activation-checkpointing full``
(or ``python -m guide.memory ...``). Every number comes from :mod:`guide.memory.predicted` (model
state), :mod:`guide.memory.activations` (activations, operation by operation, with the logits and
their gradient; ``--activation-checkpointing full`` or ``selective`` keeps less, plus one block
recomputed during its backward) and :mod:`guide.memory.transient` (autocast's weight copies, FSDP2's
buffers).

Output: a table whose every value carries its own unit (B, KiB, MiB, GiB, TiB, chosen per value),
or one unit for all (``--unit GiB``), or ``--json`` for scripts (every field of the table, bytes as
integers). ``--strategy all`` prices the five layouts of :mod:`guide.memory.fit` (HSDP's shard
group: ``--shard-group``, default 8); with a GPU (``--gpu "H100 (80 GB)"`` or ``--gpu-memory 80``,
in GiB) every row says whether it fits and its headroom, and the output gives the smallest N that
fits for each strategy. ``--lora-rank R`` adds FSDP2 fine-tuning with a frozen base (in
``--base-precision``, default bf16) and rank-``R`` LoRA adapters (in ``--precision``) on every
linear of every layer (:func:`guide.memory.finetune.lora_state_bytes`: rank 0's bytes, the most).
Bad input exits with status 2 and one line naming the fix, never a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from guide.memory.activations import CHECKPOINTING, activation_bytes
from guide.memory.architectures import PRESETS, Architecture
from guide.memory.finetune import lora_state_bytes
from guide.memory.fit import (
    DEFAULT_SHARD_GROUP,
    FIT_STRATEGIES,
    FIT_WORLD_SIZES,
    GPU_BYTES,
    capacity_bytes,
    fit_report,
)
from guide.memory.predicted import PRECISIONS
from guide.report import table
from guide.sharding import Strategy
from guide.training import OPTIMIZERS

__all__ = ["UNITS", "format_bytes", "main"]

#: Short names for the one-line verdict.
FIT_LABELS_SHORT = {"fsdp2_no_reshard": "ZeRO-2", "zero2": "ZeRO-2 (paper)", "ddp": "DDP",
                    "zero1": "ZeRO-1", "fsdp2": "FSDP2", "hsdp": "HSDP"}

#: Binary units, by name: what ``--unit`` accepts besides ``auto``.
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

_LORA = ("params", "grads", "optimizer", "total")
_PARTS = ("params", "unsharded", "grads", "optimizer", "buckets", "activations", "autocast",
          "buffers", "total")


def format_bytes(n: int, unit: str = "auto") -> str:
    """``n`` bytes for a person: ``"512 B"``, ``"850.50 KiB"``, ``"1.23 GiB"``.

    ``unit="auto"`` picks the largest unit in which the value is at least 1, so a 217,728-parameter
    model reads in KiB and MiB, not as ``0.00`` GiB; a named unit (a key of :data:`UNITS`) prints
    the number alone, for columns that share one unit.
    """
    if unit == "auto":
        unit = next((u for u in reversed(UNITS) if abs(n) >= UNITS[u]), "B")
        return f"{n:,} B" if unit == "B" else f"{n / UNITS[unit]:,.2f} {unit}"
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; choose auto or one of {', '.join(UNITS)}.")
    return f"{n:,}" if unit == "B" else f"{n / UNITS[unit]:,.2f}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="guide-memory",
        description="Predicted per-GPU memory for DDP, ZeRO-1, ZeRO-2, FSDP2 and HSDP, from a "
                    "parameter count, an architecture or a preset; with a GPU, whether it fits.",
        epilog="presets: " + ", ".join(PRESETS))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", type=float, help="parameter count, e.g. 70e9 (no shapes: ideal "
                     "1/N sharding, no padding)")
    src.add_argument("--preset", help="a known model shape: " + ", ".join(PRESETS))
    src.add_argument("--hidden", type=int, help="hidden size (with --vocab --layers --heads --mlp)")
    p.add_argument("--vocab", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--mlp", type=int, help="MLP width")
    p.add_argument("--tied", action="store_true", help="tied input/output embeddings")
    p.add_argument("--max-seq-len", type=int, help="the longest sequence the architecture supports")
    p.add_argument("--strategy", nargs="+", default=["ddp", "zero1", "fsdp2"],
                   help=f"one or more of {', '.join(s.value for s in Strategy)}, hsdp; or all "
                        f"({' '.join(FIT_STRATEGIES)}) (default: ddp zero1 fsdp2)")
    p.add_argument("--shard-group", type=int, default=DEFAULT_SHARD_GROUP,
                   help=f"HSDP: GPUs per shard group (default {DEFAULT_SHARD_GROUP}, one node)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", help="say whether it fits this GPU: " + ", ".join(GPU_BYTES))
    gpu.add_argument("--gpu-memory", type=float, metavar="GIB",
                     help="say whether it fits a GPU of this many GiB")
    p.add_argument("--precision", default="bf16_mixed", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--lora-rank", type=int, metavar="R",
                   help="also price FSDP2 LoRA fine-tuning: rank-R adapters, the base frozen")
    p.add_argument("--base-precision", default="bf16",
                   help=f"the frozen base's dtype with --lora-rank: one of {', '.join(PRECISIONS)}")
    p.add_argument("--optimizer", default="adamw", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--world-size", "-N", type=int, nargs="+", default=[1, 8, 64],
                   help="one or more world sizes (default: 1 8 64)")
    p.add_argument("--seq-len", type=int, help="add activation memory for this sequence length")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank (default 1)")
    p.add_argument("--unfused-attention", action="store_true",
                   help="attention keeps its s x s probabilities (no fused kernel)")
    p.add_argument("--activation-checkpointing", default="none",
                   metavar="{" + ",".join(CHECKPOINTING) + "}",
                   help="none (default): every layer keeps its activations; full: each block "
                        "keeps its input and one block at a time is recomputed in backward; "
                        "selective: torchtitan's op policy (every second matmul kept)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP with gradient_as_bucket_view=True: no separate gradient buckets")
    p.add_argument("--unit", default="auto",
                   help="auto (default: a unit per value) or one of " + ", ".join(UNITS))
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of the table (bytes as integers)")
    return p


def _architecture(args: argparse.Namespace) -> Architecture | None:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise ValueError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}.")
        return PRESETS[args.preset]
    if args.hidden is not None:
        missing = [f"--{n}" for n in ("vocab", "layers", "heads", "mlp") if getattr(args, n) is None]
        if missing:
            raise ValueError(f"an architecture needs {' '.join(missing)} as well as --hidden.")
        return Architecture(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                            heads=args.heads, mlp=args.mlp, kv_heads=args.kv_heads,
                            tied_embeddings=args.tied, max_seq_len=args.max_seq_len)
    return None


def _n_params(args: argparse.Namespace, arch: Architecture | None) -> int:
    if arch is not None:
        return arch.n_params
    if args.params != args.params or args.params < 1 or args.params != int(args.params):
        raise ValueError(f"--params must be a positive whole number, got {args.params!r}.")
    return int(args.params)


def _activations(args: argparse.Namespace, arch: Architecture | None) -> int:
    if args.activation_checkpointing not in CHECKPOINTING:
        raise ValueError(f"unknown --activation-checkpointing {args.activation_checkpointing!r}; "
                         f"choose one of {', '.join(CHECKPOINTING)}.")
    if args.seq_len is None:
        if args.activation_checkpointing != "none":
            raise ValueError("--activation-checkpointing prices activations: give --seq-len too.")
        return 0
    if arch is None:
        raise ValueError("activation memory needs an architecture (--preset or --hidden ...), "
                         "not just --params.")
    return activation_bytes(arch, args.seq_len, args.micro_batch,
                            fused_attention=not args.unfused_attention,
                            checkpointing=args.activation_checkpointing,
                            bytes_per_element=PRECISIONS[args.precision].compute)


def _strategies(args: argparse.Namespace) -> list[str]:
    """The strategy keys asked for: ``all`` is :data:`~guide.memory.fit.FIT_STRATEGIES`."""
    keys: list[str] = []
    for key in args.strategy:
        more = (list(FIT_STRATEGIES) if key == "all"
                else ["hsdp"] if key == "hsdp" else [Strategy.parse(key).value])
        keys += [k for k in more if k not in keys]
    return keys


def _capacity(args: argparse.Namespace) -> int | None:
    if args.gpu is None and args.gpu_memory is None:
        return None
    return capacity_bytes(args.gpu, args.gpu_memory)


def _fit(args: argparse.Namespace, arch: Architecture | None, n_params: int, act: int) -> dict:
    """The rows (one per strategy and N, every part in bytes) and, with a GPU, the verdicts."""
    return fit_report(arch if arch is not None else n_params, _strategies(args), args.world_size,
                      args.precision, args.optimizer, activations=act,
                      ddp_buckets=not args.bucket_view, shard_group=args.shard_group,
                      capacity=_capacity(args))


def _lora(args: argparse.Namespace, arch: Architecture | None) -> dict | None:
    """With ``--lora-rank``: rank 0's bytes per N (params: frozen base + adapters), in bytes."""
    if args.lora_rank is None:
        return None
    if arch is None:
        raise ValueError("--lora-rank adds adapters to every linear: give an architecture "
                         "(--preset or --hidden ...), not just --params.")
    for name, key in (("--base-precision", args.base_precision), ("--precision", args.precision)):
        if key not in PRECISIONS:
            raise ValueError(f"unknown {name} {key!r}; choose one of {', '.join(PRECISIONS)}.")
    rows = []
    for n in args.world_size:
        sb = lora_state_bytes(arch, args.lora_rank, n, base_precision=args.base_precision,
                              adapter_precision=args.precision, optimizer=args.optimizer)[0]
        rows.append({"N": n, "params": sb.params, "grads": sb.grads,
                     "optimizer": sb.optimizer, "total": sb.model_state})
    return {"rank": args.lora_rank, "base_precision": args.base_precision, "rows": rows}


def _report(args: argparse.Namespace, n_params: int) -> dict:
    """Everything the table states, for ``--json``."""
    return {
        "model": args.preset or ("architecture" if args.hidden is not None else "parameter count"),
        "parameters": n_params,
        "precision": args.precision,
        "optimizer": args.optimizer,
        "ddp_buckets": not args.bucket_view,
        "gpu": args.gpu or (None if args.gpu_memory is None else f"{args.gpu_memory} GiB"),
        "activations": None if args.seq_len is None else {
            "seq_len": args.seq_len, "micro_batch": args.micro_batch,
            "attention": "unfused" if args.unfused_attention else "fused",
            "checkpointing": args.activation_checkpointing,
            "norm": "fused",
            "formula": "per-operation count (guide.memory.activations), logits included"},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print the per-rank table (or ``--json``); exit 2 with a one-line message on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.unit != "auto" and args.unit not in UNITS:
            raise ValueError(f"unknown --unit {args.unit!r}; choose auto or one of "
                             f"{', '.join(UNITS)}.")
        arch = _architecture(args)
        n_params = _n_params(args, arch)
        fit = _fit(args, arch, n_params, _activations(args, arch))
        lora = _lora(args, arch)
    except ValueError as err:
        parser.exit(2, f"guide-memory: error: {err}\n")
    if args.json:
        print(json.dumps({**_report(args, n_params), **fit,
                          **({"lora": lora} if lora else {})}, indent=2))
        return 0
    rows = fit["rows"]
    act = args.seq_len is not None
    print(f"{_report(args, n_params)['model']}: {n_params:,} parameters; "
          f"{PRECISIONS[args.precision].label} ({args.precision}), "
          f"{OPTIMIZERS[args.optimizer].label}"
          + (f"; activations of {args.micro_batch} x {args.seq_len:,} tokens, "
             f"{'unfused' if args.unfused_attention else 'fused'} attention, "
             f"{args.activation_checkpointing} checkpointing (estimate)" if act else ""))
    parts = [c for c in _PARTS if (act or c != "activations")
             and (c not in ("unsharded", "autocast", "buffers") or any(r[c] for r in rows))]
    verdict = ["fits", "headroom"] if "capacity" in fit else []
    cells = [{"strategy": r["label"], "N": r["N"],
              **{c: "n/a" if r[c] is None else format_bytes(r[c], args.unit) for c in parts},
              **({"fits": {True: "yes", False: "no", None: "n/a"}[r["fits"]],
                  "headroom": "n/a" if r["headroom"] is None
                  else format_bytes(r["headroom"], args.unit)} if verdict else {})}
             for r in rows]
    unit = "bytes" if args.unit == "auto" else args.unit
    print(table(cells, ["strategy", "N", *parts, *verdict],
                title=f"predicted {unit} per rank; total = " + " + ".join(parts[:-1])))
    for r in rows:
        if r.get("error"):
            print(f"{r['label']}, N = {r['N']}: {r['error']}")
    if verdict:
        print(f"smallest N that fits in {format_bytes(fit['capacity'])} (N = 1, 2, 4, ..., "
              f"{FIT_WORLD_SIZES[-1]:,}): " + "; ".join(
                  f"{FIT_LABELS_SHORT.get(k, k)} {'none' if n is None else n}"
                  for k, n in fit["smallest_world_size"].items()))
    if lora:
        print(table([{"N": r["N"], **{c: format_bytes(r[c], args.unit) for c in _LORA}}
                     for r in lora["rows"]], ["N", *_LORA],
                    title=f"FSDP2, LoRA rank {lora['rank']} on every linear, base frozen in "
                          f"{args.base_precision}: predicted {unit} on rank 0 (activations "
                          "not included)"))
    print("buckets: DDP's gradient buckets, held by DDP and ZeRO-1 "
          + ("with gradient_as_bucket_view=False (the default); --bucket-view drops them."
             if not args.bucket_view else "— none: --bucket-view (gradient_as_bucket_view=True)."))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
