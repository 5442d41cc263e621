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
``--cpu-offload`` adds FSDP2 with ``CPUOffloadPolicy`` (:mod:`guide.memory.offload`): per N, the
GPU bytes without and with offload, the bytes saved, the host RAM each rank needs, and the
host-device bytes of one synced micro-batch (GPU-only, predicted).
Bad input exits with status 2 and one line naming the fix, never a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from guide.memory.activations import CHECKPOINTING, activation_bytes
from guide.memory.architectures import PRESETS, Architecture
from guide.memory.display import UNITS, assumptions, format_bytes, smallest_text
from guide.memory.finetune import lora_state_bytes
from guide.memory.fit import (
    DEFAULT_SHARD_GROUP,
    FIT_STRATEGIES,
    FIT_WORLD_SIZES,
    GPU_BYTES,
    capacity_bytes,
    fit_report,
    per_gpu,
)
from guide.memory.inputs import (
    BOUNDS,
    CLI_HEAD_NAMES,
    MAX_WORLD_SIZES,
    check_heads,
    check_param_count,
    check_seq_len,
    parse_gib,
    parse_int,
    unknown,
)
from guide.memory.offload import offload_memory, offload_traffic
from guide.memory.predicted import PRECISIONS
from guide.report import table
from guide.sharding import Strategy
from guide.optimizers import OPTIMIZERS

__all__ = ["UNITS", "format_bytes", "main"]

#: Short names for the one-line verdict.
FIT_LABELS_SHORT = {"fsdp2_no_reshard": "ZeRO-2", "zero2": "ZeRO-2 (paper)", "ddp": "DDP",
                    "zero1": "ZeRO-1", "fsdp2": "FSDP2", "hsdp": "HSDP"}

_LORA = ("params", "grads", "optimizer", "total")
_OFFLOAD = ("gpu_without", "gpu_saved", "gpu_with", "host", "to_device", "to_host")
_PARTS = ("params", "unsharded", "grads", "optimizer", "buckets", "activations", "autocast",
          "buffers", "total")


class _Parser(argparse.ArgumentParser):
    """argparse's own mistakes (an unknown option, a missing value) in one line, status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help).\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="guide-memory",
        description="Predicted per-GPU memory for DDP, ZeRO-1, ZeRO-2, FSDP2 and HSDP, from a "
                    "parameter count, an architecture or a preset; with a GPU, whether it fits.",
        epilog="presets: " + ", ".join(PRESETS))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", help="parameter count, e.g. 70e9 (no shapes: ideal "
                     "1/N sharding, no padding)")
    src.add_argument("--preset", help="a known model shape: " + ", ".join(PRESETS))
    src.add_argument("--hidden", help="hidden size (with --vocab --layers --heads --mlp)")
    p.add_argument("--vocab")
    p.add_argument("--layers")
    p.add_argument("--heads")
    p.add_argument("--kv-heads")
    p.add_argument("--mlp", help="MLP width")
    p.add_argument("--tied", action="store_true", help="tied input/output embeddings")
    p.add_argument("--max-seq-len", help="the longest sequence the architecture supports")
    p.add_argument("--strategy", nargs="+", default=["ddp", "zero1", "fsdp2"],
                   help=f"one or more of {', '.join(s.value for s in Strategy)}, hsdp; or all "
                        f"({' '.join(FIT_STRATEGIES)}) (default: ddp zero1 fsdp2)")
    p.add_argument("--shard-group", default=str(DEFAULT_SHARD_GROUP),
                   help=f"HSDP: GPUs per shard group (default {DEFAULT_SHARD_GROUP}, one node)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", help="say whether it fits this GPU: " + ", ".join(GPU_BYTES))
    gpu.add_argument("--gpu-memory", metavar="GIB",
                     help="say whether it fits a GPU of this many GiB")
    p.add_argument("--precision", default="bf16_mixed", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--lora-rank", metavar="R",
                   help="also price FSDP2 LoRA fine-tuning: rank-R adapters, the base frozen")
    p.add_argument("--base-precision", default="bf16",
                   help=f"the frozen base's dtype with --lora-rank: one of {', '.join(PRECISIONS)}")
    p.add_argument("--cpu-offload", action="store_true",
                   help="add FSDP2 with CPUOffloadPolicy: GPU bytes saved, host RAM per rank, "
                        "host-device bytes per step (needs an architecture)")
    p.add_argument("--optimizer", default="adamw", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--world-size", "-N", nargs="+", default=["1", "8", "64"],
                   help="one or more world sizes (default: 1 8 64)")
    p.add_argument("--seq-len", help="add activation memory for this sequence length")
    p.add_argument("--micro-batch", default="1", help="sequences per rank (default 1)")
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


def _numbers(args: argparse.Namespace) -> None:
    """Every number given, read exactly and within :data:`~guide.memory.inputs.BOUNDS` (in
    place); the first out of bounds raises ``ValueError`` naming its option and the fix."""
    for key in ("params", "hidden", "vocab", "layers", "heads", "kv_heads", "mlp", "max_seq_len",
                "seq_len", "micro_batch", "shard_group", "lora_rank"):
        if getattr(args, key) is not None:
            setattr(args, key, parse_int(key, getattr(args, key), BOUNDS[key].flag))
    if len(args.world_size) > MAX_WORLD_SIZES:
        raise ValueError(f"--world-size: at most {MAX_WORLD_SIZES} world sizes at once, got "
                         f"{len(args.world_size)}.")
    args.world_size = [parse_int("world_size", n, "--world-size") for n in args.world_size]
    if args.gpu_memory is not None:
        args.gpu_memory = parse_gib(args.gpu_memory, "--gpu-memory")
    for flag, key, options in (("--precision", args.precision, PRECISIONS),
                               ("--base-precision", args.base_precision, PRECISIONS),
                               ("--optimizer", args.optimizer, OPTIMIZERS),
                               ("--activation-checkpointing", args.activation_checkpointing,
                                CHECKPOINTING),
                               ("--unit", args.unit, ("auto", *UNITS))):
        if key not in options:
            raise unknown(flag, key, options)
    for key in args.strategy:
        if key not in ("all", "hsdp", *(s.value for s in Strategy)):
            raise unknown("--strategy", key, [*(s.value for s in Strategy), "hsdp", "all"])
    if args.gpu is not None and args.gpu not in GPU_BYTES:
        raise unknown("--gpu", args.gpu, GPU_BYTES)


def _architecture(args: argparse.Namespace) -> Architecture | None:
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise unknown("--preset", args.preset, PRESETS)
        return PRESETS[args.preset]
    if args.hidden is not None:
        missing = [f"--{n}" for n in ("vocab", "layers", "heads", "mlp") if getattr(args, n) is None]
        if missing:
            raise ValueError(f"an architecture needs {' '.join(missing)} as well as --hidden.")
        check_heads(args.hidden, args.heads, args.kv_heads, CLI_HEAD_NAMES)
        arch = Architecture(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                            heads=args.heads, mlp=args.mlp, kv_heads=args.kv_heads,
                            tied_embeddings=args.tied, max_seq_len=args.max_seq_len)
        check_param_count(arch.n_params)
        return arch
    return None


def _n_params(args: argparse.Namespace, arch: Architecture | None) -> int:
    return arch.n_params if arch is not None else args.params


def _activations(args: argparse.Namespace, arch: Architecture | None) -> int:
    if args.seq_len is None:
        if args.activation_checkpointing != "none":
            raise ValueError("--activation-checkpointing prices activations: give --seq-len too.")
        return 0
    if arch is None:
        raise ValueError("activation memory needs an architecture (--preset or --hidden ...), "
                         "not just --params.")
    check_seq_len(args.seq_len, arch.max_seq_len, args.preset or "this architecture",
                  "--seq-len")
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
    rows = []
    for n in args.world_size:
        sb = lora_state_bytes(arch, args.lora_rank, n, base_precision=args.base_precision,
                              adapter_precision=args.precision, optimizer=args.optimizer)[0]
        rows.append({"N": n, "params": sb.params, "grads": sb.grads,
                     "optimizer": sb.optimizer, "total": sb.model_state})
    return {"rank": args.lora_rank, "base_precision": args.base_precision, "rows": rows}


def _offload(args: argparse.Namespace, arch: Architecture | None, act: int) -> dict | None:
    """With ``--cpu-offload``: per N, FSDP2's fullest GPU without and with ``CPUOffloadPolicy``
    (the model state moves to the host; buffers and activations stay), the host bytes per rank and
    the host-device bytes of one synced micro-batch, in bytes."""
    if not args.cpu_offload:
        return None
    if arch is None:
        raise ValueError("--cpu-offload prices FSDP2's shards unit by unit: give an architecture "
                         "(--preset or --hidden ...), not just --params.")
    rows = []
    for n in args.world_size:
        gpu = per_gpu(arch, "fsdp2", n, args.precision, args.optimizer, activations=act,
                      ddp_buckets=False)
        moved = offload_memory(arch, n, args.precision, args.optimizer)
        traffic = offload_traffic(arch.fsdp2_units(), n, args.precision)
        rows.append({"N": n, "gpu_without": gpu.total, "gpu_saved": moved.gpu_saved,
                     "gpu_with": gpu.total - moved.gpu_saved, "host": moved.host,
                     "to_device": traffic.to_device, "to_host": traffic.to_host})
    return {"estimate": "GPU-only, predicted", "rows": rows}


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
        _numbers(args)
        arch = _architecture(args)
        n_params = _n_params(args, arch)
        fit = _fit(args, arch, n_params, _activations(args, arch))
        lora = _lora(args, arch)
        offload = _offload(args, arch, _activations(args, arch))
    except ValueError as err:
        parser.exit(2, f"guide-memory: error: {err}\n")
    if args.json:
        print(json.dumps({**_report(args, n_params), **fit,
                          **({"lora": lora} if lora else {}),
                          **({"cpu_offload": offload} if offload else {})}, indent=2))
        return 0
    rows = fit["rows"]
    act = args.seq_len is not None
    report = _report(args, n_params)
    print(assumptions(report["model"], n_params, (PRECISIONS[args.precision].label,
                                                  args.precision),
                      OPTIMIZERS[args.optimizer].label, report["activations"]))
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
                  f"{FIT_LABELS_SHORT.get(k, k)}: {smallest_text(n, FIT_WORLD_SIZES[-1])}"
                  for k, n in fit["smallest_world_size"].items()))
    if lora:
        print(table([{"N": r["N"], **{c: format_bytes(r[c], args.unit) for c in _LORA}}
                     for r in lora["rows"]], ["N", *_LORA],
                    title=f"FSDP2, LoRA rank {lora['rank']} on every linear, base frozen in "
                          f"{args.base_precision}: predicted {unit} on rank 0 (activations "
                          "not included)"))
    if offload:
        print(table([{"N": r["N"], **{c: format_bytes(r[c], args.unit) for c in _OFFLOAD}}
                     for r in offload["rows"]], ["N", *_OFFLOAD],
                    title=f"FSDP2 + CPUOffloadPolicy (GPU-only, predicted): {unit} per rank; "
                          "gpu_with = gpu_without - gpu_saved (the shards move to the host); "
                          "to_device / to_host: per synced micro-batch"))
    print("buckets: DDP's gradient buckets, held by DDP and ZeRO-1 "
          + ("with gradient_as_bucket_view=False (the default); --bucket-view drops them."
             if not args.bucket_view else "— none: --bucket-view (gradient_as_bucket_view=True)."))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
