"""Edges of the communication checks (guide.checks.check_volume, check_wire) that
tests/checks/test_comm.py does not reach: a collective kind the model does not have, or one it has
that never ran; a kind the model expects zero elements of; a gap exactly at the default tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest

from guide import checks
from guide.checks import CheckFailed
from guide.comm import Collective

AG = Collective("all_gather", "float32", 1000, 4000, "forward", 2)
RS = Collective("reduce_scatter", "float32", 1000, 4000, "backward", 2)
BCAST = Collective("broadcast", "float32", 1000, 4000, None, 2)


def test_an_extra_broadcast_the_model_does_not_have_is_named() -> None:
    """DDP's constructor broadcasts rank 0's weights; a step that broadcasts is doing something else."""
    with pytest.raises(CheckFailed, match=r"^\[comm volume\] r: issued \[\('all_gather', 'float32'\), "
                                          r"\('broadcast', 'float32'\), \('reduce_scatter', "
                                          r"'float32'\)\] \(kind, dtype\) per step, the model says "
                                          r"\[\('all_gather', 'float32'\), \('reduce_scatter', "
                                          r"'float32'\)\]\.$"):
        checks.check_volume("r", [AG, RS, BCAST], [AG, RS], steps=1)


def test_a_kind_the_model_has_that_never_ran_is_named() -> None:
    """No reduce-scatter: gradients were never reduced (``set_requires_gradient_sync(False)``)."""
    with pytest.raises(CheckFailed, match=r"issued \[\('all_gather', 'float32'\)\] .* the model says "
                                          r"\[\('all_gather', 'float32'\), \('reduce_scatter', "):
        checks.check_volume("r", [AG, AG], [AG, RS], steps=2)


def test_a_kind_the_model_expects_zero_elements_of_must_move_none() -> None:
    empty = dataclasses.replace(BCAST, numel=0, bytes=0)
    gaps = checks.check_volume("r", [AG, empty], [AG, empty], steps=1)
    assert gaps[("broadcast", "float32")] == (0, 0, 0.0)
    with pytest.raises(CheckFailed, match=r"broadcast in float32 moved 1 elements per step, the model "
                                          r"says 0 \(gap 100\.00% > 2%\)"):
        checks.check_volume("r", [AG, dataclasses.replace(empty, numel=1, bytes=4)], [AG, empty],
                            steps=1)


def test_a_volume_gap_of_exactly_the_default_tolerance_passes() -> None:
    """ELEMENT_TOL = 0.02 is inclusive: 51 elements against 50 is a gap of exactly 0.02."""
    got = dataclasses.replace(AG, numel=51, bytes=204)
    assert checks.check_volume("r", [got], [dataclasses.replace(AG, numel=50, bytes=200)],
                               steps=1) == {("all_gather", "float32"): (51, 50, 0.02)}


def test_a_wire_gap_of_exactly_the_default_tolerance_passes() -> None:
    """WIRE_TOL = 0.02 is inclusive: 102 B per step against 100 B is a gap of exactly 0.02."""
    assert checks.check_wire("w", [204, 196], 100.0, steps=2) == [102.0, 98.0]
    with pytest.raises(CheckFailed, match=r"^\[comm wire\] w: rank 0 wrote 103 B per step, the gloo "
                                          r"model says 100 B \(gap 3\.00% > 2%\)\.$"):
        checks.check_wire("w", [206, 196], 100.0, steps=2)
