"""Mixed precision, observed: which dtype each tensor really has, and what a dtype's rounding costs.

FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)`` changes dtypes in four places,
and a claim about any of them is checkable from inside a rank:

* **at rest**: the sharded parameters the optimizer updates (:func:`stored_dtypes`);
* **in forward**: the unsharded parameters a layer computes with, and the activations it returns,
  seen by forward hooks while the forward runs (:class:`ForwardDtypes`);
* **gradients**: the sharded ``.grad`` the optimizer reads (:func:`grad_dtypes`);
* **on the wire**: the dtype of each collective (:class:`guide.comm.CollectiveLog` records it;
  :func:`guide.layout.dtype_name` is the short name it records).

:func:`assert_dtypes` turns an observation into a build-failing check. :func:`collective_support`
asks the process group which collectives it can run in a dtype (gloo on CPU and bf16 is the case in
question), and the rounding functions say how far a result computed in a low-precision dtype can be
trusted: :func:`unit_roundoff`, :func:`loss_gap_bound`, :func:`lost_update_fraction`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from guide.checks import CheckFailed
from guide.layout import dtype_name, local_tensor, plain_name
from guide.launcher.torch_support import flat_collective

__all__ = ["ForwardDtypes", "assert_dtypes", "assert_loss_gap_within", "collective_support",
           "grad_dtypes", "loss_gap_bound", "lost_update_fraction", "stored_dtypes",
           "unit_roundoff"]

_FLOATS = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def stored_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    """The dtype each parameter is *stored* in on this rank, between steps: for FSDP2 the dtype of
    the local shard of the ``DTensor`` (what the optimizer updates), else the tensor's own."""
    return {plain_name(n): local_tensor(p).dtype for n, p in model.named_parameters()}


def grad_dtypes(model: nn.Module) -> dict[str, torch.dtype | None]:
    """The dtype of each parameter's ``.grad`` on this rank (the local shard for FSDP2), ``None``
    where there is no gradient. Read it after ``backward()`` and before ``zero_grad()``."""
    return {plain_name(n): None if p.grad is None else local_tensor(p.grad).dtype
            for n, p in model.named_parameters()}


class ForwardDtypes:
    """Context manager: record what every layer computes with while the forward runs.

    One forward hook per module records, each time the module runs, the dtype of its output and
    the dtype, type and shape of each parameter it owns directly *as the module sees it* (under
    FSDP2, the unsharded tensor that ``fully_shard`` swapped in for the forward, not the sharded
    ``DTensor`` stored between steps). After the block:

    * ``params``: ``{parameter name: dtype}``;
    * ``param_kinds``: ``{parameter name: "DTensor" | "Tensor"}`` (a plain tensor means unsharded);
    * ``param_shapes``: ``{parameter name: shape}`` (the full shape when unsharded);
    * ``outputs``: ``{module name: dtype of its output}`` (``None`` for a non-tensor output).

    The last call wins when a module runs more than once. Hooks are removed on exit.
    """

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"ForwardDtypes needs the nn.Module to observe, got {type(model).__name__}.")
        self.model = model
        self.params: dict[str, torch.dtype] = {}
        self.param_kinds: dict[str, str] = {}
        self.param_shapes: dict[str, tuple[int, ...]] = {}
        self.outputs: dict[str, torch.dtype | None] = {}
        self._handles: list = []

    def __enter__(self) -> ForwardDtypes:
        for mod_name, module in self.model.named_modules():
            local = [n for n, _ in module.named_parameters(recurse=False)]
            prefix = plain_name(f"{mod_name}.") if mod_name else ""

            def hook(mod, _args, out, prefix=prefix, local=local, mod_name=mod_name):
                for pname in local:
                    p = getattr(mod, pname)
                    key = prefix + pname
                    self.params[key] = p.dtype
                    self.param_kinds[key] = "DTensor" if isinstance(p, DTensor) else "Tensor"
                    self.param_shapes[key] = tuple(p.shape)
                self.outputs[plain_name(mod_name)] = out.dtype if isinstance(out, torch.Tensor) else None

            self._handles.append(module.register_forward_hook(hook))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def assert_dtypes(run: str, what: str, observed: Mapping[str, torch.dtype | str | None],
                  expected: torch.dtype) -> int:
    """Every entry of ``observed`` (name -> dtype) is ``expected``; returns how many were checked.

    ``what`` names the place ("sharded parameters at rest", "gradients", ...) for the message.
    Raises :class:`guide.checks.CheckFailed` naming the first tensor that disagrees, or when there is
    nothing to check (an empty observation proves nothing).
    """
    if not observed:
        raise CheckFailed(f"[dtype] {run}: no {what} were observed; nothing to check.")
    want = dtype_name(expected)
    for name, dtype in observed.items():
        got = dtype_name(dtype)
        if got != want:
            differ = sum(dtype_name(d) != want for d in observed.values())
            raise CheckFailed(f"[dtype] {run}: {what}: {name} is {got}, expected {want} "
                              f"({differ} of {len(observed)} differ).")
    return len(observed)


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative error of rounding a real number to ``dtype`` (round to nearest):
    ``u = eps / 2 = 2**-p`` for a format with ``p`` significant bits. bfloat16 keeps 8 significant
    bits (7 stored, 1 implicit), so ``u = 2**-8 = 0.0039``; float32 keeps 24, ``u = 2**-24``.
    (``torch.finfo(dtype).eps`` is the spacing just above 1.0, twice ``u``.)"""
    if dtype not in _FLOATS:
        raise ValueError(f"unit_roundoff needs a floating dtype ({', '.join(map(str, _FLOATS))}), "
                         f"got {dtype}.")
    return torch.finfo(dtype).eps / 2


def loss_gap_bound(reference_losses: Sequence[float], dtype: torch.dtype = torch.bfloat16,
                   roundings: float = 1.0) -> list[float]:
    """Per step, the gap a correct low-precision run is allowed against the fp32 reference:
    ``roundings * u(dtype) * |L_ref|``.

    A chosen tolerance, not a derived bound (see the mixed-precision page): computing in ``dtype``
    perturbs every weight, activation and logit by a relative error of at most ``u``, but the
    worst case of their sum grows with the number of operations (``n * u``), so no small bound
    follows. ``u * L``, one rounding of the loss itself, is a heuristic: independent rounding
    errors mostly cancel, so correct runs stay well inside it, and a run that computes another
    step (a gradient summed, not averaged) leaves it (``tests/test_precision.py``).
    ``roundings`` scales the allowance (``1``: one rounding of the loss).
    """
    if not reference_losses:
        raise ValueError("loss_gap_bound needs the reference's per-step losses; got none.")
    if not roundings > 0:
        raise ValueError(f"roundings must be a positive number, got {roundings!r}.")
    u = unit_roundoff(dtype)
    return [roundings * u * abs(x) for x in reference_losses]


def assert_loss_gap_within(run: str, reference: Sequence[float], losses: Sequence[float],
                           bounds: Sequence[float]) -> float:
    """Every step's ``|loss - reference|`` is at most that step's bound; returns the largest
    gap as a fraction of its bound. Raises :class:`guide.checks.CheckFailed` naming the step."""
    if not len(reference) == len(losses) == len(bounds) or not losses:
        raise CheckFailed(f"[loss gap] {run}: {len(losses)} losses, {len(reference)} reference "
                          f"losses and {len(bounds)} bounds; they must be equal and non-zero.")
    worst = 0.0
    for step, (ref, got, bound) in enumerate(zip(reference, losses, bounds)):
        gap = abs(got - ref)
        if not gap <= bound:  # `not <=` also catches NaN
            raise CheckFailed(f"[loss gap] {run}: step {step} loss {got:.6f} is {gap:.2e} from the "
                              f"fp32 reference {ref:.6f}, above the bound {bound:.2e}.")
        worst = max(worst, gap / bound)
    return worst


def lost_update_fraction(before: Iterable[torch.Tensor], after: Iterable[torch.Tensor],
                         dtype: torch.dtype = torch.bfloat16) -> float:
    """Of the parameter elements one optimizer step changed (``before`` -> ``after``, fp32), the
    fraction whose change would vanish if the parameters were stored in ``dtype``: both values round
    to the same ``dtype`` number. An update smaller than half the spacing of ``dtype`` around the
    weight is rounded away; FSDP2 keeps fp32 sharded parameters (master weights) to keep it."""
    lost = total = 0
    for b, a in zip(before, after, strict=True):
        b, a = local_tensor(b).detach().float(), local_tensor(a).detach().float()
        if b.shape != a.shape:
            raise ValueError(f"a parameter of shape {tuple(b.shape)} was paired with one of shape "
                             f"{tuple(a.shape)}; pass the same parameters before and after the step.")
        changed = a != b
        lost += int((changed & (a.to(dtype) == b.to(dtype))).sum())
        total += int(changed.sum())
    if total == 0:
        raise ValueError("the step changed no parameter element; nothing to measure.")
    return lost / total


def collective_support(dtype: torch.dtype, group=None) -> dict[str, str]:
    """Which collectives this rank's process group runs in ``dtype``, and whether the result is right.

    Call it on every rank (it issues collectives). Each of all-gather, reduce-scatter (sum, avg) and
    all-reduce (sum, avg) runs on small integer-valued tensors, exact in any float dtype, and is
    reported as ``"ok"``, ``"wrong result"`` or ``"fails: <error>"``.
    """
    if dtype not in _FLOATS:
        raise ValueError(f"collective_support checks floating dtypes ({', '.join(map(str, _FLOATS))}),"
                         f" got {dtype}.")
    n, r = dist.get_world_size(group), dist.get_rank(group)
    ranks = torch.arange(n, dtype=torch.float64)
    x = torch.full((2 * n,), float(r + 1), dtype=dtype)

    def all_gather():
        out = torch.empty(2 * n * n, dtype=dtype)
        flat_collective("all_gather")(out, x, group=group)
        return out, (ranks + 1).repeat_interleave(2 * n)

    def reduce_scatter(op, scale):
        def run():
            out = torch.empty(2, dtype=dtype)
            flat_collective("reduce_scatter")(out, x.clone(), op=op, group=group)
            return out, torch.full((2,), float((ranks + 1).sum()) * scale, dtype=torch.float64)
        return run

    def all_reduce(op, scale):
        def run():
            y = x.clone()
            dist.all_reduce(y, op=op, group=group)
            return y, torch.full((2 * n,), float((ranks + 1).sum()) * scale, dtype=torch.float64)
        return run

    cases = {"all_gather": all_gather,
             "reduce_scatter (sum)": reduce_scatter(dist.ReduceOp.SUM, 1.0),
             "reduce_scatter (avg)": reduce_scatter(dist.ReduceOp.AVG, 1.0 / n),
             "all_reduce (sum)": all_reduce(dist.ReduceOp.SUM, 1.0),
             "all_reduce (avg)": all_reduce(dist.ReduceOp.AVG, 1.0 / n)}
    report = {}
    for name, case in cases.items():
        try:
            got, want = case()
            report[name] = "ok" if torch.equal(got.double(), want.to(dtype).double()) else "wrong result"
        except Exception as exc:  # noqa: BLE001 -- the failure *is* the finding
            report[name] = f"fails: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
    return report
