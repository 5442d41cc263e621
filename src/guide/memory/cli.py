"""The ``guide-memory`` command: predicted bytes per rank for DDP, ZeRO-1 and FSDP2, as a table.

``guide-memory --preset llama-3-8b -N 1 8 64 --seq-len 8192`` (or ``python -m guide.memory ...``).
Every number comes from :mod:`guide.memory.predicted`; bad input exits with status 2 and one line
naming the fix, never a table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from guide.memory.activations import activation_bytes
from guide.memory.architectures import PRESETS, Architecture
from guide.memory.predicted import PRECISIONS, per_rank_state_bytes, state_bytes_for_count
from guide.memory.state import GiB
from guide.report import table
from guide.sharding import Strategy
from guide.training import OPTIMIZERS

__all__ = ["main"]

_COLUMNS = ("strategy", "N", "params", "grads", "optimizer", "buckets", "activations", "total")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="guide-memory",
        description="Predicted per-rank memory (GiB = 2**30 bytes) for DDP, ZeRO-1 and FSDP2, from "
                    "a parameter count, an architecture or a preset.",
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
                   help=f"one or more of {', '.join(s.value for s in Strategy)} "
                        "(default: ddp zero1 fsdp2)")
    p.add_argument("--precision", default="bf16_mixed", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--optimizer", default="adamw", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--world-size", "-N", type=int, nargs="+", default=[1, 8, 64],
                   help="one or more world sizes (default: 1 8 64)")
    p.add_argument("--seq-len", type=int, help="add activation memory for this sequence length")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank (default 1)")
    p.add_argument("--unfused-attention", action="store_true",
                   help="keep the 5as/h attention-score term of Korthikanti's formula")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP with gradient_as_bucket_view=True: no separate gradient buckets")
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


def _rows(args: argparse.Namespace, arch: Architecture | None, n_params: int) -> list[dict]:
    act = 0
    if args.seq_len is not None:
        if arch is None:
            raise ValueError("activation memory needs an architecture (--preset or --hidden ...), "
                             "not just --params.")
        act = activation_bytes(arch, args.seq_len, args.micro_batch,
                               fused_attention=not args.unfused_attention)
    rows = []
    for key in args.strategy:
        strategy = Strategy.parse(key)
        for n in args.world_size:
            if arch is None:
                sb = state_bytes_for_count(n_params, strategy, n, args.precision, args.optimizer,
                                           ddp_buckets=not args.bucket_view)
            else:
                sb = per_rank_state_bytes(arch.param_shapes(), strategy, n, args.precision,
                                          args.optimizer, ddp_buckets=not args.bucket_view)
            gib = sb.gib()
            rows.append({"strategy": strategy.label, "N": n, "params": gib["params"],
                         "grads": gib["grads"], "optimizer": gib["optimizer"],
                         "buckets": gib["buckets"], "activations": act / GiB,
                         "total": (sb.total + act) / GiB})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Print the per-rank table; exit 2 with a one-line message on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        arch = _architecture(args)
        if arch is None:
            if args.params != args.params or args.params < 1 or args.params != int(args.params):
                raise ValueError(f"--params must be a positive whole number, got {args.params!r}.")
            n_params = int(args.params)
        else:
            n_params = arch.n_params
        rows = _rows(args, arch, n_params)
    except ValueError as err:
        parser.exit(2, f"guide-memory: error: {err}\n")
    what = args.preset or ("architecture" if arch else "parameter count")
    act = args.seq_len is not None
    print(f"{what}: {n_params:,} parameters; {PRECISIONS[args.precision].label} "
          f"({args.precision}), {OPTIMIZERS[args.optimizer].label}"
          + (f"; activations of {args.micro_batch} x {args.seq_len:,} tokens, "
             f"{'unfused' if args.unfused_attention else 'fused'} attention (estimate)" if act else ""))
    columns = [c for c in _COLUMNS if act or c != "activations"]
    print(table(rows, columns, formats={c: ",.2f" for c in columns[2:]},
                title="predicted GiB per rank; total = " + " + ".join(columns[2:-1])))
    print("buckets: DDP's gradient buckets, held by DDP and ZeRO-1 "
          + ("with gradient_as_bucket_view=False (the default); --bucket-view drops them."
             if not args.bucket_view else "— none: --bucket-view (gradient_as_bucket_view=True)."))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
