"""The communication checks of guide.checks: check_volume (measured collectives against
guide.comm.expected) and check_wire (measured wire bytes against the gloo model).

Each gets the ways it can be fooled: a gap just above its default tolerance raises and one just
below passes (ELEMENT_TOL and WIRE_TOL are typed here on purpose: changing one must change a test),
a wrong call count, a missing kind, missing padding, NaN, and an unreadable counter. The same checks
against real FSDP2 records are in tests/comm/test_log.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from guide import checks, comm
from guide.checks import CheckFailed
from guide.comm import Collective, FSDPGroup


def test_tolerances_are_the_documented_ones():
    assert (checks.ELEMENT_TOL, checks.WIRE_TOL) == (0.02, 0.02)


def test_check_volume_passes_the_model_and_returns_the_gaps():
    step = comm.fsdp2_step([FSDPGroup(((4, 3),)), FSDPGroup(((5,),))], 2)
    gaps = checks.check_volume("r", step * 3, step, steps=3)
    assert gaps[("all_gather", "float32")] == (36.0, 36, 0.0)


@pytest.mark.parametrize("factor,raises", [(1.019, False), (1.021, True), (0.981, False),
                                           (0.979, True), (math.nan, True)])
def test_check_volume_tolerance_edge(factor, raises):
    want = [Collective("all_reduce", "float32", 1000, 4000, "backward", 2)]
    got = [dataclasses.replace(want[0], numel=factor * 1000)]
    if raises:
        with pytest.raises(CheckFailed, match=r"^\[comm volume\] ddp: all_reduce in float32"):
            checks.check_volume("ddp", got, want, steps=1)
    else:
        checks.check_volume("ddp", got, want, steps=1)


def test_check_volume_needs_the_padding():
    shapes = [(3,), (5,)]  # at 4 ranks: padded to 4 + 8 = 12 elements, 8 without padding
    measured = comm.fsdp2_step([FSDPGroup(tuple(shapes))], 4)
    unpadded = [dataclasses.replace(c, numel=8, bytes=32) for c in measured]
    checks.check_volume("padded", measured, measured, steps=1)
    with pytest.raises(CheckFailed,
                       match="all_gather in float32 moved 24 elements per step, the model says 16"):
        checks.check_volume("padded", measured, unpadded, steps=1)


def test_check_volume_counts_calls_and_kinds_and_dtypes():
    step = comm.fsdp2_step([FSDPGroup(((4,),)), FSDPGroup(((4,),))], 2)
    merged = comm.fsdp2_step([FSDPGroup(((8,),))], 2)  # same elements, half the calls
    with pytest.raises(CheckFailed, match=r"\[comm calls\] r: 2 all_gather calls"):
        checks.check_volume("r", merged * 2, step, steps=2)
    with pytest.raises(CheckFailed, match=r"\[comm volume\] r: issued"):
        checks.check_volume("r", [Collective("all_reduce", "float32", 8, 32)], step, steps=1)
    bf16 = comm.fsdp2_step([FSDPGroup(((4,),)), FSDPGroup(((4,),))], 2, torch.bfloat16)
    with pytest.raises(CheckFailed, match=r"\[comm volume\] r: issued .*bfloat16"):
        checks.check_volume("r", bf16, step, steps=1)
    # DDP's all-reduce may come in any number of buckets: calls are not compared for it by default
    ddp = comm.ddp_step([(8,)], 2)
    buckets = [dataclasses.replace(ddp[0], numel=4, bytes=16)] * 2
    checks.check_volume("ddp", buckets, ddp, steps=1)


@pytest.mark.parametrize("written,raises", [(101.9, False), (102.1, True), (98.1, False),
                                            (97.9, True), (math.nan, True)])
def test_check_wire_tolerance_edge(written, raises):
    if raises:
        with pytest.raises(CheckFailed, match=r"^\[comm wire\] w: rank 1 wrote"):
            checks.check_wire("w", [200, 2 * written], 100.0, steps=2)
    else:
        assert checks.check_wire("w", [200, 2 * written], 100.0, steps=2) == [100.0, written]


def test_check_volume_returns_each_kinds_elements_checked_against_the_model():
    """What a page records: the measured elements per step carry the check, the run, the unit, the
    model's count and the relative allowance."""
    step = comm.fsdp2_step([FSDPGroup(((4, 3),)), FSDPGroup(((5,),))], 2)
    m, e, gap = checks.check_volume("FSDP2 x2", step * 3, step, steps=3)[("all_gather", "float32")]
    assert (m, e, gap) == (36.0, 36, 0.0)
    assert (m.check, m.run, m.unit, m.relation, m.tol, m.rel, m.reference, m.against) == (
        "comm volume", "FSDP2 x2", "elements/step", "≈", 0.02, True, 36, "guide.comm.expected")
    assert m.guard() == "asserted: comm volume (36 ≈ 36 ± 2% vs guide.comm.expected)"


def test_check_wire_returns_each_ranks_bytes_checked_against_the_model():
    """What a page records: each value carries the check, the run, the unit, the model's bytes and
    the relative allowance (mutants that dropped any of them survived the tests above)."""
    got = checks.check_wire("FSDP2 x2", [2000, 2040], 1000.0, steps=2)
    assert got == [1000.0, 1020.0]
    for w in got:
        assert (w.check, w.run, w.unit, w.relation, w.tol, w.rel, w.reference, w.against) == (
            "comm wire", "FSDP2 x2", "B/step", "≈", 0.02, True, 1000.0, "the gloo model")
    assert got[1].guard() == "asserted: comm wire (1020 ≈ 1000 ± 2% vs the gloo model)"
    assert got[1].allowance() == pytest.approx(20.0)


def test_check_wire_needs_readings():
    with pytest.raises(CheckFailed, match="not readable"):
        checks.check_wire("w", [200, None], 100.0, steps=2)
