"""How many bytes of model state one rank holds, for DDP, ZeRO-1 and FSDP2, and a calculator for it.

*Model state* is what lives between two training steps: the parameters, their gradients and the
optimizer state (ZeRO, arXiv 1910.02054 §3.1). Activations and communication buffers are transient;
:func:`activation_bytes` estimates the former, peak memory is another page's subject.

The model counts bytes the way PyTorch stores them, tensor by tensor, so that
:mod:`guide.model_state` can measure a real rank and the two must agree:

* **Strategies** (:data:`STRATEGIES`):

  - ``"ddp"``: every rank holds everything.
  - ``"zero1"``: DDP + :class:`torch.distributed.optim.ZeroRedundancyOptimizer`. Optimizer state is
    split **by whole parameter**, greedily (largest first, each to the rank with the fewest elements so
    far), exactly as ``ZeroRedundancyOptimizer._partition_parameters`` does; this is not exactly 1/N,
    so the model replays the partition from the shapes (:func:`zero1_partition`).
  - ``"zero2"``: the ZeRO paper's stage 2 (gradients and optimizer state split evenly, parameters
    replicated). PyTorch has no such wrapper; it is here for the paper's Figure 1 and is analytic only.
  - ``"fsdp2"`` (``fully_shard``, default) and ``"fsdp2_no_reshard"``
    (``reshard_after_forward=False``): every parameter is a ``Shard(0)`` DTensor. Each rank stores
    ``ceil(dim0/N)`` rows of every parameter and of every gradient (FSDP2 pads the shards, so the
    rank holding fewer real rows still allocates the padded size); the optimizer state is built from
    the unpadded local view, so it holds this rank's real rows only. Between steps both FSDP2 modes
    hold the same state: ``reshard_after_forward=False`` keeps the *unsharded* parameters from the
    forward until the backward, then reshards them (:func:`unsharded_param_bytes` is that transient
    extra).

* **Precisions** (:data:`PRECISIONS`), bytes per element of (parameter, gradient, optimizer moment,
  fp32 master copy kept *inside* the optimizer):

  - ``"fp32"``: 4, 4, 4, 0.
  - ``"bf16_mixed"``: bf16 compute with fp32 master weights, as PyTorch does it: the stored
    parameter *is* the fp32 master (FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)``, or DDP under ``torch.autocast``); the bf16 copies exist only while a layer
    runs. So the model state is the same as fp32: 4, 4, 4, 0.
  - ``"bf16"``: pure bf16, no master copy (``model.to(torch.bfloat16)``): 2, 2, 2, 0.
  - ``"zero_mixed"``: the ZeRO paper's accounting (fp16/bf16 parameters and gradients persist, the
    optimizer keeps an fp32 master copy and fp32 moments, K = 12 for Adam): 2, 2, 4, 4.

  With AdamW all of fp32, bf16_mixed and zero_mixed are 16 B per parameter; pure bf16 is 8.
* **Optimizers** (:data:`OPTIMIZERS`): number of moment tensors per parameter: ``"sgd"`` 0,
  ``"sgd_momentum"`` 1 (``momentum_buffer``), ``"adamw"`` 2 (``exp_avg``, ``exp_avg_sq``). AdamW also
  keeps a 4-byte fp32 ``step`` tensor per parameter tensor, which the shape-based model counts.

DDP's extra copy: with ``gradient_as_bucket_view=False`` (the default) DDP's reducer keeps its own
flat gradient buckets, one more copy of all gradients (:func:`ddp_bucket_bytes`); it is not part of
:class:`StateBytes` because it is not in ``param.grad`` but in the reducer.

Units: ``GB`` is 1e9 bytes, ``GiB`` is 2**30 bytes (:data:`GB`, :data:`GiB`). The ZeRO paper uses GB.

Run ``python -m guide.memory --help`` (or ``guide-memory``) for the calculator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence

__all__ = [
    "GB", "GiB", "GPU_CAPACITY_GIB", "OPTIMIZERS", "PRECISIONS", "PRESETS", "STRATEGIES",
    "Architecture", "Precision", "StateBytes", "activation_bytes", "ddp_bucket_bytes", "main",
    "per_rank_state_bytes", "per_rank_total_bytes", "state_bytes_by_rank", "state_bytes_for_count",
    "unsharded_param_bytes", "zero1_partition",
]

GB = 10**9
GiB = 2**30

#: Usable memory of one GPU as ``nvidia-smi`` reports it, in GiB (H100 80GB HBM3: 81,559 MiB;
#: H200: 143,771 MiB). Marketing's "80 GB" and "141 GB" are these.
GPU_CAPACITY_GIB = {"H100 (80 GB)": 81_559 / 1024, "H200 (141 GB)": 143_771 / 1024}


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of model state (see the module docstring)."""

    param: int
    grad: int
    moment: int
    master: int


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(param=4, grad=4, moment=4, master=0),
    "bf16_mixed": Precision(param=4, grad=4, moment=4, master=0),
    "bf16": Precision(param=2, grad=2, moment=2, master=0),
    "zero_mixed": Precision(param=2, grad=2, moment=4, master=4),
}

#: Moment tensors per parameter.
OPTIMIZERS: dict[str, int] = {"sgd": 0, "sgd_momentum": 1, "adamw": 2}
#: Bytes of AdamW's per-tensor ``step`` (a 0-d fp32 tensor).
_STEP_BYTES = {"sgd": 0, "sgd_momentum": 0, "adamw": 4}

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp2", "fsdp2_no_reshard")
_FSDP = ("fsdp2", "fsdp2_no_reshard")
#: The strategies that wrap the model in DDP and so keep its gradient buckets.
_DDP_UNDERNEATH = ("ddp", "zero1")


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Model-state bytes held by one rank: parameters, gradients, optimizer state."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def __add__(self, other: StateBytes) -> StateBytes:
        return StateBytes(self.params + other.params, self.grads + other.grads,
                          self.optimizer + other.optimizer)

    def gib(self) -> tuple[float, float, float, float]:
        """(params, grads, optimizer, total) in GiB."""
        return (self.params / GiB, self.grads / GiB, self.optimizer / GiB, self.total / GiB)


# ---------------------------------------------------------------------------------------------
# validation


def _check_choice(kind: str, value: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; choose one of {', '.join(choices)}.")


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer (number of ranks), got {world_size!r}.")


def _check_shapes(param_shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    if isinstance(param_shapes, (str, bytes)) or not isinstance(param_shapes, Sequence):
        raise ValueError("param_shapes must be a sequence of shapes such as [(4096, 4096), (4096,)], "
                         f"got {type(param_shapes).__name__}.")
    if not param_shapes:
        raise ValueError("param_shapes is empty: pass one shape per parameter tensor.")
    shapes = []
    for i, shape in enumerate(param_shapes):
        try:
            dims = tuple(shape)
        except TypeError:
            raise ValueError(f"param_shapes[{i}] = {shape!r} is not a shape; "
                             "pass a tuple of dimension sizes.") from None
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ValueError(f"param_shapes[{i}] = {shape!r}: every dimension must be an integer >= 0.")
        shapes.append(dims)
    return shapes


def _check_common(strategy: str, world_size: int, precision: str, optimizer: str) -> None:
    _check_choice("strategy", strategy, STRATEGIES)
    _check_world_size(world_size)
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, OPTIMIZERS)


# ---------------------------------------------------------------------------------------------
# the shape-based model (exact, what a rank really allocates)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _chunk_sizes(length: int, n: int) -> list[int]:
    """How ``torch.chunk`` splits ``length`` rows over ``n`` ranks: ``ceil(length/n)`` each, the
    remainder on the last rank that gets any, 0 for the ranks after it."""
    chunk = math.ceil(length / n)
    return [max(0, min(chunk, length - r * chunk)) for r in range(n)]


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(dim 0, elements per row); a 0-d tensor is one row of one element."""
    if not shape:
        return 1, 1
    return shape[0], math.prod(shape[1:])


def zero1_partition(param_shapes: Sequence[Sequence[int]], world_size: int) -> list[list[int]]:
    """Which parameter indices each rank's ``ZeroRedundancyOptimizer`` owns.

    The same greedy rule as ``ZeroRedundancyOptimizer._partition_parameters`` (one parameter group):
    sort by ``numel`` descending (stable), give each to the first rank with the fewest elements.
    """
    shapes = _check_shapes(param_shapes)
    _check_world_size(world_size)
    order = sorted(range(len(shapes)), key=lambda i: _numel(shapes[i]), reverse=True)
    sizes = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        rank = sizes.index(min(sizes))
        owned[rank].append(i)
        sizes[rank] += _numel(shapes[i])
    return owned


def state_bytes_by_rank(param_shapes: Sequence[Sequence[int]], strategy: str, world_size: int,
                        precision: str = "fp32", optimizer: str = "adamw") -> list[StateBytes]:
    """Model-state bytes of every rank, in rank order (see :func:`per_rank_state_bytes`)."""
    shapes = _check_shapes(param_shapes)
    _check_common(strategy, world_size, precision, optimizer)
    pr = PRECISIONS[precision]
    opt_per_elem = pr.master + OPTIMIZERS[optimizer] * pr.moment
    step = _STEP_BYTES[optimizer]
    n = world_size
    total = sum(_numel(s) for s in shapes)

    if strategy == "ddp":
        same = StateBytes(total * pr.param, total * pr.grad, total * opt_per_elem + len(shapes) * step)
        return [same] * n
    if strategy == "zero1":
        out = []
        for idx in zero1_partition(shapes, n):
            owned = sum(_numel(shapes[i]) for i in idx)
            out.append(StateBytes(total * pr.param, total * pr.grad,
                                  owned * opt_per_elem + len(idx) * step))
        return out
    if strategy == "zero2":
        # DeepSpeed-style flat, even partition of gradients and optimizer state.
        return [StateBytes(total * pr.param, mine * pr.grad,
                           mine * opt_per_elem + (len(shapes) * step if mine else 0))
                for mine in _chunk_sizes(total, n)]
    # FSDP2: padded ceil(dim0/N) rows of storage for params and grads on every rank; the optimizer
    # state follows the unpadded local rows (torch.chunk: ceil-sized, the remainder on later ranks).
    padded = 0
    real = [0] * n
    for shape in shapes:
        dim0, row = _rows(shape)
        sizes = _chunk_sizes(dim0, n)
        padded += sizes[0] * row
        for r, rows in enumerate(sizes):
            real[r] += rows * row
    return [StateBytes(padded * pr.param, padded * pr.grad, real[r] * opt_per_elem + len(shapes) * step)
            for r in range(n)]


def per_rank_state_bytes(param_shapes: Sequence[Sequence[int]], strategy: str, world_size: int,
                         precision: str = "fp32", optimizer: str = "adamw") -> StateBytes:
    """Model-state bytes on the rank that holds the most (ties: the lowest rank).

    ``param_shapes`` is one shape per parameter tensor, in ``model.parameters()`` order (the order
    matters only for ZeRO-1's tie-breaking). The result is exact to the byte for what PyTorch
    allocates (verified by :mod:`guide.model_state` on real ranks), including FSDP2's dim-0 padding,
    ZeRO-1's uneven greedy partition and AdamW's ``step`` tensors. It excludes DDP's gradient buckets
    (:func:`ddp_bucket_bytes`).

    >>> per_rank_state_bytes([(1024, 1024)], "fsdp2", 8, "fp32", "adamw").total
    2097156
    """
    per_rank = state_bytes_by_rank(param_shapes, strategy, world_size, precision, optimizer)
    return max(per_rank, key=lambda s: s.total)


def ddp_bucket_bytes(param_shapes: Sequence[Sequence[int]], precision: str = "fp32") -> int:
    """Bytes of DDP's gradient buckets on every rank with ``gradient_as_bucket_view=False`` (default).

    The reducer copies each gradient into a flat bucket to all-reduce it and keeps the buckets alive
    between steps: one more full copy of the gradients. ``gradient_as_bucket_view=True`` makes
    ``param.grad`` a view into the bucket and saves exactly this much.
    """
    shapes = _check_shapes(param_shapes)
    _check_choice("precision", precision, PRECISIONS)
    return sum(_numel(s) for s in shapes) * PRECISIONS[precision].grad


def per_rank_total_bytes(param_shapes: Sequence[Sequence[int]], strategy: str, world_size: int,
                         precision: str = "fp32", optimizer: str = "adamw") -> int:
    """What the fullest rank holds between steps with DDP's defaults: :func:`per_rank_state_bytes`'
    total plus, for the strategies with DDP underneath (``"ddp"``, ``"zero1"``), DDP's gradient
    buckets (:func:`ddp_bucket_bytes`).

    This is the number to compare with a rank's measured ``model_state.measure(...).total`` plus
    ``model_state.ddp_bucket_bytes(model)``, or with a GPU's capacity.
    """
    total = per_rank_state_bytes(param_shapes, strategy, world_size, precision, optimizer).total
    if strategy in _DDP_UNDERNEATH:
        total += ddp_bucket_bytes(param_shapes, precision)
    return total


def unsharded_param_bytes(param_shapes: Sequence[Sequence[int]], world_size: int,
                          compute_dtype_bytes: int = 4) -> int:
    """Bytes of all parameters unsharded (padded to N equal chunks) in the compute dtype.

    This is what ``fully_shard(..., reshard_after_forward=False)`` keeps alive from the forward to the
    backward on top of its shards (2 bytes per element under ``param_dtype=torch.bfloat16``).
    """
    shapes = _check_shapes(param_shapes)
    _check_world_size(world_size)
    if compute_dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"compute_dtype_bytes must be 1, 2, 4 or 8, got {compute_dtype_bytes!r}.")
    padded = 0
    for shape in shapes:
        dim0, row = _rows(shape)
        padded += math.ceil(dim0 / world_size) * world_size * row
    return padded * compute_dtype_bytes


# ---------------------------------------------------------------------------------------------
# the count-based model (the ZeRO paper's formulas)


def state_bytes_for_count(n_params: int, strategy: str, world_size: int, precision: str = "fp32",
                          optimizer: str = "adamw") -> StateBytes:
    """Per-rank model-state bytes from a parameter count alone (ZeRO §5's formulas).

    Sharded parts are ``ceil(n_params / N)`` elements: an ideal, even partition with no padding and
    no per-tensor ``step``. Use :func:`per_rank_state_bytes` when the shapes are known. ZeRO-1 here
    is the ideal 1/N (DeepSpeed's flat partition), not PyTorch's per-parameter greedy one.

    >>> round(state_bytes_for_count(7_500_000_000, "zero1", 64, "zero_mixed").total / GB, 1)
    31.4
    """
    if isinstance(n_params, bool) or not isinstance(n_params, int) or n_params < 0:
        raise ValueError(f"n_params must be an integer >= 0, got {n_params!r}.")
    _check_common(strategy, world_size, precision, optimizer)
    pr = PRECISIONS[precision]
    opt = pr.master + OPTIMIZERS[optimizer] * pr.moment
    share = math.ceil(n_params / world_size)
    p_n = share if strategy in _FSDP else n_params
    g_n = share if strategy in ("zero2", *_FSDP) else n_params
    o_n = n_params if strategy == "ddp" else share
    return StateBytes(p_n * pr.param, g_n * pr.grad, o_n * opt)


# ---------------------------------------------------------------------------------------------
# architectures


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape, enough to list its parameter tensors.

    Llama-style by default (RMSNorm without bias, SwiGLU MLP with three matrices, no biases, no
    learned positions); set ``gated_mlp=False, bias=True, layernorm=True, max_positions=1024`` for
    GPT-2-style. ``kv_heads`` < ``heads`` is grouped-query attention.
    """

    vocab: int
    hidden: int
    layers: int
    heads: int
    mlp: int
    kv_heads: int | None = None
    tied_embeddings: bool = False
    gated_mlp: bool = True
    bias: bool = False
    layernorm: bool = False
    max_positions: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "mlp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Architecture.{name} must be a positive integer, got {value!r}.")
        if self.kv_heads is not None and (not isinstance(self.kv_heads, int) or self.kv_heads < 1
                                          or self.heads % self.kv_heads):
            raise ValueError(f"Architecture.kv_heads must be a positive divisor of heads={self.heads}, "
                             f"got {self.kv_heads!r}.")
        if self.hidden % self.heads:
            raise ValueError(f"Architecture.hidden={self.hidden} must be divisible by "
                             f"heads={self.heads}.")
        if not isinstance(self.max_positions, int) or self.max_positions < 0:
            raise ValueError(f"Architecture.max_positions must be an integer >= 0, "
                             f"got {self.max_positions!r}.")

    def _parts(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[tuple[int, ...]]]:
        """(embeddings, one layer, tail): the tail is the final norm and, unless tied, the head."""
        h, f = self.hidden, self.mlp
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        norm: list[tuple[int, ...]] = [(h,), (h,)] if self.layernorm else [(h,)]

        def linear(out: int, inp: int) -> list[tuple[int, ...]]:
            return [(out, inp), (out,)] if self.bias else [(out, inp)]

        mlp = (linear(f, h) + linear(f, h) + linear(h, f) if self.gated_mlp
               else linear(f, h) + linear(h, f))
        layer = norm + linear(h, h) + linear(kv, h) + linear(kv, h) + linear(h, h) + norm + mlp
        embeddings = [(self.vocab, h)] + ([(self.max_positions, h)] if self.max_positions else [])
        tail = norm + ([] if self.tied_embeddings else [(self.vocab, h)])
        return embeddings, layer, tail

    def param_shapes(self) -> list[tuple[int, ...]]:
        """One shape per parameter tensor, in the order a Hugging Face model lists them."""
        embeddings, layer, tail = self._parts()
        return embeddings + layer * self.layers + tail

    def fsdp_units(self) -> tuple[list[tuple[int, ...]], list[list[tuple[int, ...]]]]:
        """The parameter shapes grouped as FSDP2 shards them: ``(root, layers)``.

        ``layers[i]`` holds layer ``i``'s shapes (one ``fully_shard(layer)`` unit each); ``root``
        holds what the final ``fully_shard(model)`` picks up: embeddings, final norm, output head.
        """
        embeddings, layer, tail = self._parts()
        return embeddings + tail, [list(layer) for _ in range(self.layers)]

    @property
    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes())


#: Public model shapes (from each model's published config).
PRESETS: dict[str, Architecture] = {
    "gpt2-xl": Architecture(vocab=50257, hidden=1600, layers=48, heads=25, mlp=6400,
                            tied_embeddings=True, gated_mlp=False, bias=True, layernorm=True,
                            max_positions=1024),
    "llama-2-7b": Architecture(vocab=32000, hidden=4096, layers=32, heads=32, mlp=11008),
    "mistral-7b": Architecture(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, mlp=14336),
    "llama-3-8b": Architecture(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, mlp=14336),
    "llama-3-70b": Architecture(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8,
                                mlp=28672),
    "llama-3.1-405b": Architecture(vocab=128256, hidden=16384, layers=126, heads=128, kv_heads=8,
                                   mlp=53248),
}


def activation_bytes(arch: Architecture, seq_len: int, micro_batch: int,
                     fused_attention: bool = True) -> int:
    """Activation bytes kept for the backward, per rank, after Korthikanti et al. (arXiv 2205.05198,
    Eq. 1): ``s*b*h*(34 + 5*a*s/h)`` per layer, 16-bit activations, no recomputation, no tensor
    parallelism. ``fused_attention=True`` drops the ``5*a*s/h`` term (FlashAttention/SDPA do not
    store the s x s scores). The 34 assumes a GPT-style 4h MLP and multi-head attention, so for
    SwiGLU/GQA models it is an estimate. Data parallelism does not shard activations: each rank holds
    those of its own micro-batch.
    """
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    s, b, h, a = seq_len, micro_batch, arch.hidden, arch.heads
    per_layer = s * b * h * 34 + (0 if fused_attention else 5 * a * s * s * b)
    return arch.layers * per_layer


# ---------------------------------------------------------------------------------------------
# calculator


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="guide-memory",
        description="Per-rank model-state memory (GiB) for DDP, ZeRO-1 and FSDP2, from a parameter "
                    "count, an architecture or a preset. GiB = 2**30 bytes.",
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
    p.add_argument("--strategy", nargs="+", default=["ddp", "zero1", "fsdp2"],
                   help=f"one or more of {', '.join(STRATEGIES)} (default: ddp zero1 fsdp2)")
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
                            tied_embeddings=args.tied)
    return None


def table(rows: Sequence[tuple[str, int, StateBytes, int, int]]) -> str:
    """Format (strategy, N, state, DDP bucket bytes, activation bytes) rows as a GiB table; the
    activation column appears only when some row has activations."""
    with_act = any(act for *_, act in rows)
    head = (f"{'strategy':<17}{'N':>5}{'params':>10}{'grads':>10}{'optim':>10}{'buckets':>10}"
            + (f"{'activ.':>10}" if with_act else "") + f"{'total':>10}")
    lines = [head + "   GiB per rank", "-" * len(head)]
    for strategy, n, sb, buckets, act in rows:
        p, g, o, _ = sb.gib()
        line = f"{strategy:<17}{n:>5}{p:>10.2f}{g:>10.2f}{o:>10.2f}{buckets / GiB:>10.2f}"
        if with_act:
            line += f"{act / GiB:>10.2f}"
        lines.append(line + f"{(sb.total + buckets + act) / GiB:>10.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``guide-memory`` command: print the per-rank table; exit 2 with a message on bad input."""
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
        act = 0
        if args.seq_len is not None:
            if arch is None:
                raise ValueError("activation memory needs an architecture (--preset or --hidden ...), "
                                 "not just --params.")
            act = activation_bytes(arch, args.seq_len, args.micro_batch,
                                   fused_attention=not args.unfused_attention)
        shapes = None if arch is None else arch.param_shapes()
        rows = []
        for strategy in args.strategy:
            for n in args.world_size:
                if shapes is None:
                    sb = state_bytes_for_count(n_params, strategy, n, args.precision, args.optimizer)
                else:
                    sb = per_rank_state_bytes(shapes, strategy, n, args.precision, args.optimizer)
                buckets = 0
                if strategy in _DDP_UNDERNEATH and not args.bucket_view:
                    # one copy of every gradient: n_params x gradient bytes, shapes or not
                    buckets = n_params * PRECISIONS[args.precision].grad
                rows.append((strategy, n, sb, buckets, act))
    except ValueError as err:
        parser.exit(2, f"guide-memory: error: {err}\n")
    what = args.preset or ("architecture" if arch else "parameter count")
    print(f"{what}: {n_params:,} parameters; precision {args.precision}, optimizer {args.optimizer}"
          + (f"; activations for seq {args.seq_len} x micro-batch {args.micro_batch}, "
             f"{'unfused' if args.unfused_attention else 'fused'} attention" if act else ""))
    print(table(rows))
    if any(row[3] for row in rows):
        print("buckets: DDP's gradient buckets (gradient_as_bucket_view=False, the default), "
              "a second copy of the gradients; --bucket-view drops them.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
