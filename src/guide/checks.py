"""The assertions that fail the docs build: distributed runs must *be* the single-process run.

Every failure raises :class:`CheckFailed` (an ``AssertionError``) whose message starts with the name
of the check, the run and the worst offender, so a red build says what broke, not just that
something did.

Tolerances (fp32, CPU/gloo, a distributed run against one process on the full batch; the gap is
reduction order, never a bug). Each sits above the largest gap the build measures: every page that
compares prints its measured gap next to the tolerance, and the "Every number on this site" page
lists both, so a tolerance that no longer matches the build is visible there, not here.

* loss, any step: :data:`LOSS_TOL`, for SGD and AdamW.
* final parameters: :data:`PARAM_TOL`, per optimizer. AdamW's is wider than SGD's because Adam
  divides by sqrt(v), which magnifies the last bits of small gradients into whole lr-sized steps;
  it stays a fraction of one step (the learning rates are in :data:`guide.optimizers.OPTIMIZERS`),
  while a missing gradient sync moves parameters by about lr on every step.

A gradient that is summed instead of averaged over 2 ranks doubles every SGD step: the parameters
move by about ``lr * abs(g)`` more than the reference, orders of magnitude above
``PARAM_TOL["sgd"]``. AdamW hides that bug (its update is invariant to the gradient's scale), which
is why both optimizers run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from guide.checked import (CheckFailed, Checked, Tautology, ratio, refuse_derived,
                           refuse_self_comparison)
from guide.comm.checks import ELEMENT_TOL, WIRE_TOL, check_volume, check_wire
from guide.layout import ParamLayout, chunk_rows
from guide.validate import positive_int

__all__ = ["CheckFailed", "Checked", "LEARN_MIN_DROP", "LOSS_TOL", "PARAM_TOL", "SINGLE_PROCESS",
           "Tautology",
           "assert_learns", "assert_losses_match", "assert_params_match", "assert_ranks_agree",
           "assert_replicated", "assert_same_init", "assert_sharded", "expect", "expect_close", "ratio",
           "expect_order", "max_abs_diff", "assert_hsdp_sharded", "assert_replicas_identical",
           "ELEMENT_TOL", "WIRE_TOL", "check_volume", "check_wire"]

#: The usual reference of the equivalence checks: one process on the full batch. The checks take
#: what they compare with as ``against`` (the guard prints it), so a guard never names a
#: reference the check did not use.
SINGLE_PROCESS = "the single-process reference"

LOSS_TOL = 1e-5
#: The least the loss of one batch must fall, re-evaluated after training, for a run to count as
#: training (nats). Measured on the main example's model, first batch: SGD (lr 0.1) falls 0.11 after
#: 3 steps and 0.29 after 20, AdamW 1.9 and 3.1; a step that never applies its gradient
#: (``zero_grad`` between ``backward`` and ``step``) leaves it unchanged to the bit. 1e-3 is 100x
#: LOSS_TOL: a run equivalent to a reference that did not learn cannot pass.
LEARN_MIN_DROP = 1e-3
PARAM_TOL = {"sgd": 1e-6, "adamw": 1e-3}




def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """Largest ``|a_i - b_i|``; the sequences must have the same length."""
    if len(a) != len(b):
        raise CheckFailed(f"length mismatch: {len(a)} vs {len(b)} steps.")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def expect(check: str, run: str, ok: bool, detail: str) -> None:
    """One-line build assertion: raise :class:`CheckFailed` ``"[check] run: detail"`` unless ``ok``.

    ``ok`` must be a real ``bool`` (write ``not gap <= tol`` style comparisons so NaN fails). It
    returns nothing: a number it guards is not checked against a value, so record it as computed,
    or check the number itself with :func:`expect_close` / :func:`expect_order` and record what
    they return. Every check takes ``(check, run, ...)`` first."""
    if not isinstance(ok, bool):
        raise TypeError(f"expect() takes a bool, got {type(ok).__name__}: compare explicitly.")
    if not ok:
        raise CheckFailed(f"[{check}] {run}: {detail}")


def expect_close(check: str, run: str, got: Sequence[float] | float,
                 want: Sequence[float] | float, tol: float, what: str = "value", *,
                 rel: bool = False, unit: str = "", against: str = "") -> Checked:
    """Every ``got`` equals ``want`` within ``tol`` (absolute, or relative to ``want`` if ``rel``;
    NaN fails), ``want`` being an independent value (``against`` says what it is, in words).

    Returns what it checked: for one number, :class:`Checked` ``got`` matched to ``want`` (relation
    ``"≈"``); for sequences, or a ``want`` of 0, the worst gap bounded by ``tol`` (relation
    ``"≤"``). A ``want`` that is
    ``got`` itself, or flagged :func:`guide.checked.derived`, raises :class:`Tautology`.
    """
    scalar = not isinstance(got, Sequence)
    got_l = list(got) if isinstance(got, Sequence) else [got]
    want_l = list(want) if isinstance(want, Sequence) else [want]
    if len(got_l) != len(want_l):
        raise CheckFailed(f"[{check}] {run}: {len(got_l)} {what}s, expected {len(want_l)}.")
    gaps = [abs(g - w) / (abs(w) if rel else 1.0) if not (rel and w == 0) else
            (0.0 if g == 0 else math.inf) for g, w in zip(got_l, want_l)]
    gap = next((g for g in gaps if g != g), max(gaps, default=0.0))  # NaN wins
    if not all(g <= tol for g in gaps):
        kind = f"{gap:.2%} > {tol:.0%}" if rel else f"{gap:.2e} > tol {tol:.0e}"
        raise CheckFailed(f"[{check}] {run}: {what} differs by {kind} "
                          f"(got {got_l[:4]}{'...' if len(got_l) > 4 else ''}, expected "
                          f"{want_l[:4]}{'...' if len(want_l) > 4 else ''}).")
    refuse_derived(check, run, got, want)
    if scalar and want != 0:
        return Checked(float(got), check=check, run=run, unit=unit, relation="≈", tol=tol,
                       rel=rel, reference=float(want), against=against)
    return Checked(gap, check=check, run=run, unit=unit, relation="≤", tol=tol, rel=rel,
                   against=against)


def expect_order(check: str, run: str, low: float, high: float, *, low_name: str,
                 high_name: str, strict: bool = True, unit: str = "",
                 keep: str = "low") -> Checked:
    """``low < high`` (``<=`` unless ``strict``; NaN fails). Returns :class:`Checked` ``low``
    (relation ``"<"``), or ``high`` if ``keep="high"`` (relation ``">"``): the ledger records it as
    ``ordered: low_name < high_name`` (or ``high_name > low_name``), never as asserted, because an
    ordering checks neither value."""
    refuse_derived(check, run, low, high)
    if keep not in ("low", "high"):
        raise ValueError(f"expect_order: keep={keep!r} is 'low' or 'high'.")
    ok = low < high if strict else low <= high
    op = "<" if strict else "<="
    if not ok:
        raise CheckFailed(f"[{check}] {run}: expected {low_name} {op} {high_name}, got "
                          f"{low:.4g} vs {high:.4g}.")
    if keep == "high":
        return Checked(float(high), check=check, run=run, unit=unit, relation=op.replace("<", ">"),
                       reference=float(low), value_name=high_name, reference_name=low_name)
    return Checked(float(low), check=check, run=run, unit=unit, relation=op,
                   reference=float(high), value_name=low_name, reference_name=high_name)


def assert_learns(run: str, losses: Sequence[float],
                  min_drop: float = LEARN_MIN_DROP) -> Checked:
    """The loss falls: some later loss is at least ``min_drop`` below ``losses[0]``.

    Give losses of the *same* data (e.g. the first batch before and after training): losses of
    different batches differ by the batches alone, so a model that learns nothing can pass on them.
    Equivalence to a reference proves nothing if neither learns (a bug shared by the reference and
    the distributed runs passes every equivalence check); this is the check that catches it.
    Returns the drop.
    """
    if len(losses) < 2:
        raise CheckFailed(f"[training happens] {run}: {len(losses)} step(s); at least 2 are needed "
                          "to see the loss fall.")
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(loss)]
    if bad:  # an inf at step 0 'falls' by inf, and min() skips a NaN that is not first
        raise CheckFailed(f"[training happens] {run}: the loss is not finite at step {bad[0]} "
                          f"({losses[bad[0]]}).")
    drop = losses[0] - min(losses[1:])
    if not drop >= min_drop:  # `not >=` also catches NaN
        raise CheckFailed(f"[training happens] {run}: the loss fell by {drop:.2e} from step 0's "
                          f"{losses[0]:.6f} (needs >= {min_drop:.0e}): the optimizer step does not "
                          "apply the gradient (zero_grad after backward? a step that is skipped?).")
    return Checked(drop, check="training happens", run=run, unit="nats", relation="≥",
                   tol=min_drop, against="the loss of the same batch at step 0")


def assert_losses_match(run: str, reference: Sequence[float], losses: Sequence[float],
                        tol: float = LOSS_TOL, *, against: str) -> Checked:
    """Every step's loss of ``run`` equals ``reference``'s within ``tol``; returns the worst gap,
    bounded (:class:`Checked`, relation ``"≤"``). ``against`` names the reference in words (the
    guard prints it); a reference that is ``losses`` itself, or named as ``run``, raises
    :class:`Tautology`."""
    refuse_self_comparison("loss equivalence", run, against, reference is losses)
    if len(losses) != len(reference):
        raise CheckFailed(f"[loss equivalence] {run}: {len(losses)} steps, reference has "
                          f"{len(reference)}.")
    gaps = [abs(x - y) for x, y in zip(losses, reference)]
    bad = [i for i, gap in enumerate(gaps) if not gap <= tol]  # `not <=` also catches NaN
    if bad:
        first = bad[0]
        cause = ("the forward pass already differs: different weights or data on the ranks"
                 if first == 0 else
                 "step 0 matched, so the update differs: are gradients averaged (not summed) "
                 "across ranks, and is every rank's slice of the batch used?")
        raise CheckFailed(
            f"[loss equivalence] {run}: from step {first} on, the loss differs from "
            f"{against} (step {first}: {losses[first]:.8f} vs "
            f"{reference[first]:.8f}, gap {gaps[first]:.2e} > tol {tol:.0e}; worst gap "
            f"{max(gaps):.2e}); {cause}")
    return Checked(max(gaps, default=0.0), check="loss equivalence", run=run, unit="nats",
                   tol=tol, against=against)


def assert_params_match(run: str, reference: Mapping[str, torch.Tensor],
                        params: Mapping[str, torch.Tensor], tol: float,
                        check: str = "parameter equivalence", hint: str = "", *,
                        against: str) -> Checked:
    """Every parameter of ``run`` equals ``reference``'s within ``tol`` (max abs, elementwise);
    returns the worst gap, bounded. ``against`` names the reference (the guard prints it);
    ``check`` names the check in the failure message, ``hint`` says what usually causes it. A
    reference that is ``params`` itself (the same mapping, or the very same tensors), or named as
    ``run``, raises :class:`Tautology`."""
    refuse_self_comparison(check, run, against, reference is params or (
        bool(reference) and all(params.get(k) is v for k, v in reference.items())))
    if set(reference) != set(params):
        missing, extra = sorted(set(reference) - set(params)), sorted(set(params) - set(reference))
        raise CheckFailed(f"[{check}] {run}: parameter names differ; missing "
                          f"{missing}, unexpected {extra}.")
    worst_name, worst = "", 0.0
    for name, ref in reference.items():
        got = params[name]
        if got.shape != ref.shape:
            raise CheckFailed(f"[{check}] {run}: {name} has shape "
                              f"{tuple(got.shape)}, reference {tuple(ref.shape)}.")
        gap = (got.double() - ref.double()).abs().max().item()
        if math.isnan(gap) or gap > worst:  # once NaN is the worst, no finite gap replaces it
            worst_name, worst = name, gap
    if not worst <= tol:
        raise CheckFailed(f"[{check}] {run}: {worst_name} differs from {against} "
                          f"by {worst:.2e} > tol {tol:.0e}.{' ' + hint if hint else ''}")
    return Checked(worst, check=check, run=run, unit="absolute", tol=tol, against=against)


def assert_ranks_agree(run: str, per_rank: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """Every rank ends with the same full parameters. Replicas that drift apart mean gradients were
    not synchronised (DDP bypassed, a no-op reduction, ``no_sync`` left on)."""
    for rank, params in enumerate(per_rank[1:], start=1):
        if set(params) != set(per_rank[0]):
            raise CheckFailed(f"[replica consistency] {run}: rank {rank} has parameters "
                              f"{sorted(params)}, rank 0 {sorted(per_rank[0])}.")
        for name, ref in per_rank[0].items():
            gap = (params[name].double() - ref.double()).abs().max().item()
            if not gap == 0.0:
                raise CheckFailed(
                    f"[replica consistency] {run}: after training, rank {rank}'s {name} differs "
                    f"from rank 0's by {gap:.2e}; gradients were not synchronised across ranks.")


def assert_same_init(run: str, reference: Mapping[str, torch.Tensor],
                     params: Mapping[str, torch.Tensor]) -> None:
    """The model every rank trains starts from the reference's weights, bit for bit.

    DDP passes this even if ranks seed differently (it broadcasts rank 0's weights); FSDP2 does not
    broadcast, so each rank's shard is whatever that rank built.
    """
    assert_params_match(run, reference, params, 0.0, check="initial weights",
                        against="the reference's initial weights",
                        hint="The ranks built different initial weights: fully_shard does not "
                             "broadcast, so every rank must build the model with the same seed.")


def _expect_dtensors_from_every_rank(check: str, run: str, layouts: Sequence[ParamLayout],
                                     world_size: int, mesh_note: str = "") -> None:
    """Layouts came from ranks 0..world_size-1 and every parameter is a DTensor (else fully_shard
    was not applied): the common start of the sharding checks."""
    if not layouts:
        raise CheckFailed(f"[{check}] {run}: no parameters were reported.")
    ranks = {lay.rank for lay in layouts}
    if ranks != set(range(world_size)):
        raise CheckFailed(f"[{check}] {run}: layouts from ranks {sorted(ranks)}, expected "
                          f"0..{world_size - 1}{mesh_note}.")
    for lay in layouts:
        if not lay.is_dtensor:
            raise CheckFailed(f"[{check}] {run}: {lay.name} on rank {lay.rank} is a plain tensor of "
                              f"shape {lay.global_shape}, not a DTensor: fully_shard was not applied.")


def assert_sharded(run: str, layouts: Sequence[ParamLayout],
                   world_size: int) -> dict[int, Checked]:
    """Each parameter on each rank is a DTensor with ``(Shard(dim=0),)`` holding its dim-0 chunk.

    Returns, per rank, the elements it holds (:class:`Checked` against ``torch.chunk``'s rows)."""
    _expect_dtensors_from_every_rank("sharding", run, layouts, world_size)
    held = {r: 0 for r in range(world_size)}
    want = {r: 0 for r in range(world_size)}
    for lay in layouts:
        where = f"{lay.name} on rank {lay.rank}"
        if lay.placements != "(Shard(dim=0),)":
            raise CheckFailed(f"[sharding] {run}: {where} has placements {lay.placements}, "
                              "expected (Shard(dim=0),).")
        rows = chunk_rows(lay.global_shape[0], lay.rank, world_size)
        expected = (rows, *lay.global_shape[1:])
        if lay.local_shape != expected:
            raise CheckFailed(f"[sharding] {run}: {where} holds a local shard of shape "
                              f"{lay.local_shape}; Shard(0) over {world_size} ranks gives "
                              f"{expected} (global {lay.global_shape}).")
        held[lay.rank] += math.prod(lay.local_shape)
        want[lay.rank] += math.prod(expected)
    return {r: Checked(held[r], check="sharding", run=run, unit="elements", relation="≈", tol=0.0,
                       reference=want[r], against="torch.chunk rows of each parameter")
            for r in held}


def assert_replicated(run: str, layouts: Sequence[ParamLayout],
                      full_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Each DDP parameter on each rank is a plain tensor of the full shape: DDP replicates."""
    if not layouts:
        raise CheckFailed(f"[replication] {run}: no parameters were reported.")
    for lay in layouts:
        where = f"{lay.name} on rank {lay.rank}"
        if lay.name not in full_shapes:
            raise CheckFailed(f"[replication] {run}: {where} is not a parameter of the model (it "
                              f"has {sorted(full_shapes)}).")
        if lay.is_dtensor:
            raise CheckFailed(f"[replication] {run}: {where} is a DTensor with placements "
                              f"{lay.placements}, not a plain tensor: DDP replicates plain tensors.")
        if lay.local_shape != tuple(full_shapes[lay.name]):
            raise CheckFailed(f"[replication] {run}: {where} has local shape "
                              f"{lay.local_shape}, expected the full {tuple(full_shapes[lay.name])}.")


# -- HSDP: a 2-D mesh (replicate, shard) ----------------------------------------------------------

_HSDP_PLACEMENTS = "(Replicate(), Shard(dim=0))"


def assert_hsdp_sharded(run: str, layouts: Sequence[ParamLayout], replicas: int,
                        shards: int) -> None:
    """HSDP on a ``(replicas, shards)`` mesh: each parameter on each rank is a DTensor with
    placements ``(Replicate(), Shard(dim=0))`` holding the dim-0 chunk of its shard position.

    ``init_device_mesh(device, (replicas, shards))`` lays the ranks out row-major: rank ``r`` is in
    replica ``r // shards`` at shard position ``r % shards``, and holds chunk ``r % shards`` of
    ``shards`` (``torch.chunk``), whichever replica it is in.
    """
    positive_int("replicas", replicas, "the size of the mesh's replicate dimension")
    positive_int("shards", shards, "the size of the mesh's shard dimension")
    world_size = replicas * shards
    _expect_dtensors_from_every_rank("HSDP sharding", run, layouts, world_size,
                                     f" ({replicas} replicas x {shards} shards)")
    for lay in layouts:
        where = f"{lay.name} on rank {lay.rank}"
        if lay.placements != _HSDP_PLACEMENTS:
            raise CheckFailed(f"[HSDP sharding] {run}: {where} has placements {lay.placements}, "
                              f"expected {_HSDP_PLACEMENTS}: fully_shard was not given the 2-D "
                              "(replicate, shard) mesh.")
        rows = chunk_rows(lay.global_shape[0], lay.rank % shards, shards)
        expected = (rows, *lay.global_shape[1:])
        if lay.local_shape != expected:
            raise CheckFailed(f"[HSDP sharding] {run}: {where} (shard position "
                              f"{lay.rank % shards}) holds a local shard of shape {lay.local_shape};"
                              f" Shard(0) over {shards} ranks gives {expected} "
                              f"(global {lay.global_shape}).")


def assert_replicas_identical(run: str,
                              shards_by_rank: Sequence[Sequence[Mapping[str, torch.Tensor]]],
                              replicas: int, shards: int) -> int:
    """The ranks at the same shard position of different replicas hold equal local shards (every
    element, ``torch.equal``) after every step; returns the number of shards compared.

    ``shards_by_rank[rank][step]`` maps each parameter's name to that rank's local shard after that
    step; ranks are laid out as in :func:`assert_hsdp_sharded`. HSDP keeps the replicas equal by
    all-reducing every reduced gradient shard across the replicate dimension: without that
    all-reduce each replica trains on its own part of the batch and they drift apart.
    """
    positive_int("replicas", replicas, "the size of the mesh's replicate dimension")
    positive_int("shards", shards, "the size of the mesh's shard dimension")
    if len(shards_by_rank) != replicas * shards:
        raise CheckFailed(f"[HSDP replicas] {run}: shards from {len(shards_by_rank)} ranks, "
                          f"expected {replicas * shards} ({replicas} replicas x {shards} shards).")
    compared = 0
    for position in range(shards):
        first = shards_by_rank[position]
        for replica in range(1, replicas):
            rank = replica * shards + position
            other = shards_by_rank[rank]
            if len(other) != len(first):
                raise CheckFailed(f"[HSDP replicas] {run}: rank {rank} reported {len(other)} "
                                  f"steps, rank {position} {len(first)}.")
            for step, (mine, theirs) in enumerate(zip(first, other)):
                if set(mine) != set(theirs):
                    raise CheckFailed(f"[HSDP replicas] {run}: after step {step}, ranks "
                                      f"{position} and {rank} report different parameters.")
                for name, shard in mine.items():
                    got = theirs[name]
                    if got.shape != shard.shape or not torch.equal(got, shard):
                        gap = ((got.double() - shard.double()).abs().max().item()
                               if got.shape == shard.shape else float("inf"))
                        raise CheckFailed(
                            f"[HSDP replicas] {run}: after step {step}, rank {rank} (replica "
                            f"{replica}) holds a different {name} shard than rank {position} "
                            f"(replica 0, same shard position {position}): max gap {gap:.2e}; "
                            "the gradients were not all-reduced across the replicas.")
                    compared += 1
    if not compared:
        raise CheckFailed(f"[HSDP replicas] {run}: no shards to compare (no steps reported, or one "
                          "replica).")
    return compared
