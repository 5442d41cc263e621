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
  it stays a fraction of one step (the learning rates are in :data:`guide.training.OPTIMIZERS`),
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

from guide.comm.expected import Collective, summarize
from guide.layout import ParamLayout, chunk_rows
from guide.validate import positive_int

__all__ = ["CheckFailed", "LEARN_MIN_DROP", "LOSS_TOL", "assert_learns", "PARAM_TOL", "assert_losses_match", "assert_params_match",
           "assert_ranks_agree", "assert_replicated", "assert_same_init", "assert_sharded",
           "expect", "expect_close", "max_abs_diff", "assert_hsdp_sharded",
           "assert_replicas_identical",
           "ELEMENT_TOL", "WIRE_TOL", "check_volume", "check_wire"]

LOSS_TOL = 1e-5
#: The least the loss of one batch must fall, re-evaluated after training, for a run to count as
#: training (nats). Measured on the main example's model, first batch: SGD (lr 0.1) falls 0.11 after
#: 3 steps and 0.29 after 20, AdamW 1.9 and 3.1; a step that never applies its gradient
#: (``zero_grad`` between ``backward`` and ``step``) leaves it unchanged to the bit. 1e-3 is 100x
#: LOSS_TOL: a run equivalent to a reference that did not learn cannot pass.
LEARN_MIN_DROP = 1e-3
PARAM_TOL = {"sgd": 1e-6, "adamw": 1e-3}


class CheckFailed(AssertionError):
    """A claim of the site did not hold. The message names the check."""



def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """Largest ``|a_i - b_i|``; the sequences must have the same length."""
    if len(a) != len(b):
        raise CheckFailed(f"length mismatch: {len(a)} vs {len(b)} steps.")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def expect(ok: bool, check: str, run: str, detail: str) -> None:
    """One-line build assertion: raise :class:`CheckFailed` ``"[check] run: detail"`` unless ``ok``.

    ``ok`` must be a real ``bool`` (write ``not gap <= tol`` style comparisons so NaN fails)."""
    if not isinstance(ok, bool):
        raise TypeError(f"expect() takes a bool, got {type(ok).__name__}: compare explicitly.")
    if not ok:
        raise CheckFailed(f"[{check}] {run}: {detail}")


def expect_close(check: str, run: str, got: Sequence[float] | float,
                 want: Sequence[float] | float, tol: float, what: str = "value") -> float:
    """Every ``got`` equals ``want`` within ``tol`` (NaN fails); returns the worst gap."""
    got_l = list(got) if isinstance(got, Sequence) else [got]
    want_l = list(want) if isinstance(want, Sequence) else [want]
    gaps = [abs(g - w) for g, w in zip(got_l, want_l)]
    if len(got_l) != len(want_l):
        raise CheckFailed(f"[{check}] {run}: {len(got_l)} {what}s, expected {len(want_l)}.")
    gap = next((g for g in gaps if g != g), max(gaps, default=0.0))  # NaN wins
    if not all(g <= tol for g in gaps):
        raise CheckFailed(f"[{check}] {run}: {what} differs by {gap:.2e} > tol {tol:.0e} "
                          f"(got {got_l[:4]}{'...' if len(got_l) > 4 else ''}, expected "
                          f"{want_l[:4]}{'...' if len(want_l) > 4 else ''}).")
    return gap


def assert_learns(run: str, losses: Sequence[float], min_drop: float = LEARN_MIN_DROP) -> float:
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
    return drop


def assert_losses_match(run: str, reference: Sequence[float], losses: Sequence[float],
                        tol: float = LOSS_TOL) -> float:
    """Every step's loss of ``run`` equals the reference within ``tol``; returns the worst gap."""
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
            f"[loss equivalence] {run}: from step {first} on, the loss differs from the "
            f"single-process reference (step {first}: {losses[first]:.8f} vs "
            f"{reference[first]:.8f}, gap {gaps[first]:.2e} > tol {tol:.0e}; worst gap "
            f"{max(gaps):.2e}); {cause}")
    return max(gaps)


def assert_params_match(run: str, reference: Mapping[str, torch.Tensor],
                        params: Mapping[str, torch.Tensor], tol: float,
                        check: str = "parameter equivalence", hint: str = "") -> float:
    """Every parameter of ``run`` equals the reference's within ``tol`` (max abs, elementwise);
    returns the worst gap. ``check`` names the check in the failure message, ``hint`` says what
    usually causes it."""
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
        raise CheckFailed(f"[{check}] {run}: {worst_name} differs from the single-process "
                          f"reference by {worst:.2e} > tol {tol:.0e}.{' ' + hint if hint else ''}")
    return worst


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


def assert_sharded(run: str, layouts: Sequence[ParamLayout], world_size: int) -> None:
    """Each parameter on each rank is a DTensor with ``(Shard(dim=0),)`` holding its dim-0 chunk."""
    _expect_dtensors_from_every_rank("sharding", run, layouts, world_size)
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


# -- communication: measured collectives against guide.comm.expected ------------------------------

#: How far measured element counts may sit from the communication model (relative) before a page
#: fails (the communication example prints each run's gap).
ELEMENT_TOL = 0.02

#: How far a rank's measured wire bytes (``wchar``) may sit from the gloo model (relative): the gap
#: is gloo's message headers; the communication example prints both for every run.
WIRE_TOL = 0.02


def check_volume(run: str, measured: Sequence[Collective], expected: Sequence[Collective],
                 steps: int, tol: float = ELEMENT_TOL,
                 exact_calls: Sequence[str] = ("all_gather", "reduce_scatter", "broadcast"),
                 ) -> dict[tuple[str, str], tuple[float, int, float]]:
    """Compare ``measured`` (all records of ``steps`` steps, :class:`guide.comm.CollectiveLog`) with
    one step of ``expected`` (:mod:`guide.comm.expected`).

    For each ``(kind, dtype)`` the measured elements per step must sit within ``tol`` (relative) of
    the model, and for the kinds in ``exact_calls`` the calls per step must match exactly (DDP's
    all-reduce is left out by default: how many buckets it uses is DDP's choice). Raises
    :class:`CheckFailed` naming the run, kind and dtype; returns
    ``{(kind, dtype): (measured elements/step, model elements/step, relative gap)}``.
    """
    got, want = summarize(measured, steps), summarize(expected)
    if set(got) != set(want):
        raise CheckFailed(
            f"[comm volume] {run}: issued {sorted(got)} (kind, dtype) per step, the model says "
            f"{sorted(want)}.")
    out = {}
    for key, row in want.items():
        m, e = got[key]["numel"], row["numel"]
        gap = abs(m - e) / e if e else float(m != 0)
        if not gap <= tol:
            raise CheckFailed(
                f"[comm volume] {run}: {key[0]} in {key[1]} moved {m:,.0f} elements per step, the "
                f"model says {e:,} (gap {gap:.2%} > {tol:.0%}).")
        if key[0] in exact_calls and got[key]["calls"] != row["calls"]:
            raise CheckFailed(
                f"[comm calls] {run}: {got[key]['calls']:g} {key[0]} calls in {key[1]} per step, "
                f"the model says {row['calls']}.")
        out[key] = (m, e, gap)
    return out


def check_wire(run: str, wire_bytes_per_rank: Sequence[int | None], expected_per_rank: float,
               steps: int, tol: float = WIRE_TOL) -> list[float]:
    """Each rank's measured wire bytes per step must sit within ``tol`` of ``expected_per_rank``
    (e.g. the sum of :func:`guide.comm.gloo_bytes` over one step's model). Raises
    :class:`CheckFailed` naming the run and rank; returns the bytes per step per rank."""
    if any(w is None for w in wire_bytes_per_rank):
        raise CheckFailed(f"[comm wire] {run}: /proc/self/io is not readable here; no wire bytes.")
    per_step = [w / steps for w in wire_bytes_per_rank]
    for rank, w in enumerate(per_step):
        gap = abs(w - expected_per_rank) / expected_per_rank
        if not gap <= tol:
            raise CheckFailed(
                f"[comm wire] {run}: rank {rank} wrote {w:,.0f} B per step, the gloo model says "
                f"{expected_per_rank:,.0f} B (gap {gap:.2%} > {tol:.0%}).")
    return per_step
