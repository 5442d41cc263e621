"""The exact words of the HSDP checks' refusals (guide.checks.assert_hsdp_sharded,
assert_replicas_identical), which tests/test_hsdp.py matches only in part: a mesh size that is not a
positive integer, a 1-D placement, nothing to compare.
"""

from __future__ import annotations

import pytest

from guide import checks
from guide.checks import CheckFailed
from guide.layout import ParamLayout

HSDP = "(Replicate(), Shard(dim=0))"
LAYOUTS = [ParamLayout("w", r, True, HSDP, (4,), (2,)) for r in range(4)]


@pytest.mark.parametrize("check, arg", [(checks.assert_hsdp_sharded, LAYOUTS),
                                        (checks.assert_replicas_identical, [[]] * 4)])
@pytest.mark.parametrize("replicas, shards, message", [
    (0, 2, "replicas must be a positive integer (the size of the mesh's replicate dimension), got 0."),
    (2, 0, "shards must be a positive integer (the size of the mesh's shard dimension), got 0."),
    (2, 1.0, "shards must be a positive integer (the size of the mesh's shard dimension), got 1.0."),
])
def test_a_mesh_size_that_is_not_a_positive_integer_is_refused(check, arg, replicas, shards,
                                                               message: str) -> None:
    with pytest.raises(ValueError) as err:
        check("x", arg, replicas, shards)
    assert str(err.value) == message


def test_a_1d_placement_says_what_fully_shard_was_given() -> None:
    lays = [ParamLayout("w", r, True, "(Shard(dim=0),)", (4,), (2,)) for r in range(4)]
    with pytest.raises(CheckFailed) as err:
        checks.assert_hsdp_sharded("x", lays, 2, 2)
    assert str(err.value) == ("[HSDP sharding] x: w on rank 0 has placements (Shard(dim=0),), "
                              "expected (Replicate(), Shard(dim=0)): fully_shard was not given the "
                              "2-D (replicate, shard) mesh.")


@pytest.mark.parametrize("replicas, shards, per_rank", [(2, 2, [[]] * 4), (1, 2, [[{}], [{}]])])
def test_nothing_to_compare_is_not_agreement(replicas: int, shards: int, per_rank: list) -> None:
    with pytest.raises(CheckFailed) as err:
        checks.assert_replicas_identical("x", per_rank, replicas, shards)
    assert str(err.value) == ("[HSDP replicas] x: no shards to compare (no steps reported, or one "
                              "replica).")


def test_missing_ranks_or_parameters_are_named_with_the_check_run_and_mesh() -> None:
    with pytest.raises(CheckFailed) as err:
        checks.assert_hsdp_sharded("x", LAYOUTS[:3], 2, 2)
    assert str(err.value) == ("[HSDP sharding] x: layouts from ranks [0, 1, 2], expected 0..3 "
                              "(2 replicas x 2 shards).")
    with pytest.raises(CheckFailed) as err:
        checks.assert_hsdp_sharded("x", [], 2, 2)
    assert str(err.value) == "[HSDP sharding] x: no parameters were reported."
