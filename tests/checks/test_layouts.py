"""guide.checks.assert_sharded and assert_replicated on hand-made layouts: what FSDP2 and DDP must
store on each rank, and every near miss that must raise.

(tests/test_checks.py runs the same checks on layouts read from real FSDP2 and DDP models.)
"""

from __future__ import annotations

import pytest

from guide import checks
from guide.checks import CheckFailed
from guide.layout import ParamLayout

SHARD0 = "(Shard(dim=0),)"


def _sharded(rows: dict[int, int], name: str = "w", global_shape: tuple[int, ...] = (127, 4),
             placements: str = SHARD0) -> list[ParamLayout]:
    """One parameter as FSDP2 stores it: rank r holds ``rows[r]`` rows of dim 0."""
    return [ParamLayout(name, r, True, placements, global_shape, (n, *global_shape[1:]))
            for r, n in rows.items()]


def _replicated(ranks: int = 2, name: str = "w", shape: tuple[int, ...] = (4, 4)) -> list[ParamLayout]:
    return [ParamLayout(name, r, False, "-", shape, shape) for r in range(ranks)]


# -- assert_sharded ----------------------------------------------------------------------------------

def test_torch_chunk_shards_pass_including_uneven_and_empty_ones() -> None:
    checks.assert_sharded("r", _sharded({0: 64, 1: 63}), 2)                       # 127 rows over 2
    checks.assert_sharded("r", _sharded({0: 43, 1: 43, 2: 41}), 3)                # over 3
    checks.assert_sharded("r", _sharded({0: 1, 1: 1, 2: 0}, global_shape=(2,)), 3)  # rank 2: nothing
    checks.assert_sharded("r", _sharded({0: 64, 1: 63}) + _sharded({0: 2, 1: 2}, "b", (4,)), 2)


@pytest.mark.parametrize("placements", ["(Shard(dim=1),)", "(Replicate(),)",
                                        "(Replicate(), Shard(dim=0))", "(Shard(dim=0), Shard(dim=0))",
                                        "Shard(dim=0)"])
def test_any_placement_but_shard_0_is_named(placements: str) -> None:
    """The shapes are right for Shard(0): only the placement is wrong."""
    expected = rf"w on rank 0 has placements {placements.replace('(', '[(]').replace(')', '[)]')}, " \
               r"expected \(Shard\(dim=0\),\)\.$"
    with pytest.raises(CheckFailed, match=r"^\[sharding\] r: " + expected):
        checks.assert_sharded("r", _sharded({0: 64, 1: 63}, placements=placements), 2)


@pytest.mark.parametrize("rows", [{0: 64, 1: 64}, {0: 63, 1: 64}, {0: 127, 1: 127}, {0: 64, 1: 0}])
def test_a_wrong_chunk_is_named(rows: dict[int, int]) -> None:
    bad = next(r for r, n in rows.items() if n != (64, 63)[r])
    want = (64, 63)[bad]
    with pytest.raises(CheckFailed, match=rf"^\[sharding\] r: w on rank {bad} holds a local shard of "
                                          rf"shape \({rows[bad]}, 4\); Shard\(0\) over 2 ranks gives "
                                          rf"\({want}, 4\) \(global \(127, 4\)\)\.$"):
        checks.assert_sharded("r", _sharded(rows), 2)


def test_a_wrong_trailing_dimension_is_named() -> None:
    lays = _sharded({0: 64, 1: 63})
    lays[1] = ParamLayout("w", 1, True, SHARD0, (127, 4), (63, 2))
    with pytest.raises(CheckFailed, match=r"w on rank 1 holds a local shard of shape \(63, 2\)"):
        checks.assert_sharded("r", lays, 2)


def test_every_parameter_is_checked_not_only_the_first() -> None:
    lays = _sharded({0: 64, 1: 63}) + _sharded({0: 4, 1: 0}, "b", (4,))
    with pytest.raises(CheckFailed, match=r"b on rank 0 holds a local shard of shape \(4,\); .* "
                                          r"gives \(2,\)"):
        checks.assert_sharded("r", lays, 2)


def test_a_plain_tensor_is_named() -> None:
    lays = _sharded({0: 64}) + [ParamLayout("w", 1, False, "-", (127, 4), (127, 4))]
    with pytest.raises(CheckFailed, match=r"^\[sharding\] r: w on rank 1 is a plain tensor of shape "
                                          r"\(127, 4\), not a DTensor: fully_shard was not "
                                          r"applied\.$"):
        checks.assert_sharded("r", lays, 2)


@pytest.mark.parametrize("rows, got", [({0: 64}, r"\[0\]"), ({1: 63}, r"\[1\]"),
                                       ({0: 43, 1: 43, 2: 41}, r"\[0, 1, 2\]")])
def test_missing_or_extra_ranks_are_named(rows: dict[int, int], got: str) -> None:
    with pytest.raises(CheckFailed, match=rf"^\[sharding\] r: layouts from ranks {got}, expected "
                                          r"0\.\.1\.$"):
        checks.assert_sharded("r", _sharded(rows), 2)


def test_no_layouts_at_all_is_not_sharding() -> None:
    with pytest.raises(CheckFailed, match=r"^\[sharding\] r: no parameters were reported\.$"):
        checks.assert_sharded("r", [], 2)


# -- assert_replicated -------------------------------------------------------------------------------

def test_full_plain_tensors_on_every_rank_pass() -> None:
    checks.assert_replicated("r", _replicated() + _replicated(name="b", shape=(4,)),
                             {"w": (4, 4), "b": (4,)})


def test_a_dtensor_is_not_replication_even_at_full_shape() -> None:
    """``Replicate()`` DTensors (FSDP2 on a 1-rank mesh, ``replicate()``) are not what DDP stores."""
    lays = _replicated()
    lays[1] = ParamLayout("w", 1, True, "(Replicate(),)", (4, 4), (4, 4))
    with pytest.raises(CheckFailed, match=r"^\[replication\] r: w on rank 1 is a DTensor with "
                                          r"placements \(Replicate\(\),\), not a plain tensor"):
        checks.assert_replicated("r", lays, {"w": (4, 4)})


@pytest.mark.parametrize("local", [(2, 4), (4, 2), (4,), (4, 4, 1)])
def test_a_wrong_shape_is_named(local: tuple[int, ...]) -> None:
    lays = [*_replicated(1), ParamLayout("w", 1, False, "-", local, local)]
    with pytest.raises(CheckFailed, match=r"^\[replication\] r: w on rank 1 has local shape "
                                          rf"{str(local).replace('(', '[(]').replace(')', '[)]')}, "
                                          r"expected the full \(4, 4\)\.$"):
        checks.assert_replicated("r", lays, {"w": (4, 4)})


def test_a_parameter_the_model_does_not_have_is_named() -> None:
    with pytest.raises(CheckFailed, match=r"^\[replication\] r: w on rank 0 is not a parameter of the "
                                          r"model \(it has \['b'\]\)\.$"):
        checks.assert_replicated("r", _replicated(), {"b": (4,)})


def test_no_layouts_at_all_is_not_replication() -> None:
    with pytest.raises(CheckFailed, match=r"^\[replication\] r: no parameters were reported\.$"):
        checks.assert_replicated("r", [], {"w": (4, 4)})
