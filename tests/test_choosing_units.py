"""The units page (``examples/plot_choosing_units.py``).

The page asserts what a ``fully_shard`` call costs: the root's reduce-scatter with an untied
embedding and head left in it, torch's rule for tied weights, and what each mesh does. The tests
read the page's ``RESULT`` after one in-process run (4 ranks), hold the page to torch's words for
the tied-weight refusal, and inject the mistakes its checks guard against at the page's tagged
fault points (tests/faults.py): the page must then fail by the check's name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES
from faults import assert_fails_by_name, mistagged

PAGE = EXAMPLES / "plot_choosing_units.py"

#: torch 2.13's refusal of a weight shared by two units, as the page prints it.
REFUSAL = ("ValueError: Parameter 'head.weight' is shared with a parameter already managed by "
           "another FSDP group. For shared/tied parameters, use fully_shard([module_a, "
           "module_b]) to place them in the same FSDP group.")

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the embedding and head never get their own units (the untied runs shard them with
    # ends_as_units=False): the predicted buffers are not logged
    "ends_stay_in_root": [
        ("untied-shard", "model = shard(build_model(CFG, device=rank.device),\n"
                         "              init_device_mesh(rank.device.type, (rank.world_size,)), "
                         "ends_as_units=False)")],
    # the sub-mesh row is really the flattened mesh: the rows per rank must give it away
    "sub_mesh_is_flat": [
        ("sub-mesh", 'return {"hsdp": mesh, "sub": mesh["dp_replicate", "dp_shard"]._flatten(),\n'
                     '        "flat": mesh["dp_replicate", "dp_shard"]._flatten()}')],
}
#: fault -> the check that must fail, by name
EXPECTED = {
    "ends_stay_in_root": r"\[reduce-scatters\] FSDP2 x4, embedding, head: own units",
    "sub_mesh_is_flat": r"\[local rows\] FSDP2 x4, mesh\[\"dp_shard\"\] only",
}


def test_every_fault_point_is_tagged_once() -> None:
    assert mistagged(PAGE, FAULTS.values()) == {}


def test_the_page_passes(page: dict) -> None:
    assert page["OUTPUT"].rstrip().endswith("All checks passed.")


def test_separate_ends_halve_the_largest_reduce_scatter_at_the_same_total(page: dict) -> None:
    cfg, sizes = page["RESULT"]["CFG"], page["RESULT"]["sizes"]
    emb = 4 * cfg.vocab * cfg.d_model  # fp32 bytes of one (vocab, d_model) matrix
    root = 2 * emb + 4 * (cfg.max_seq * cfg.d_model + 2 * cfg.d_model)
    assert sizes["root_only"][0] == root and sizes["ends_as_units"][0] == emb
    assert sum(sizes["root_only"]) == sum(sizes["ends_as_units"])
    assert len(sizes["ends_as_units"]) == len(sizes["root_only"]) + 2


def test_the_page_prints_torchs_refusal_of_tied_weights_apart(page: dict) -> None:
    """torch 2.13 refuses (its words printed); the 2.9 floor accepts and the page says the tie
    breaks. Either way the page says what this torch does."""
    from guide.pitfalls import torch_source_says

    if torch_source_says("already managed by another FSDP group"):
        assert REFUSAL in page["OUTPUT"]
        assert REFUSAL.replace("'head.weight'", "'tok_emb.weight'") in page["OUTPUT"]
    else:
        assert page["OUTPUT"].count("the tie breaks") == 2 and REFUSAL not in page["OUTPUT"]


def test_each_mesh_places_and_averages_as_torch_says(page: dict) -> None:
    from torch.distributed.tensor import Replicate, Shard

    mesh = page["RESULT"]["per_rank"][0]["mesh"]
    assert mesh["hsdp"]["placements"] == (Replicate(), Shard(0))
    assert mesh["flat"]["placements"] == mesh["sub"]["placements"] == (Shard(0),)
    assert mesh["hsdp"]["groups"] == {"reduce_scatter": [2], "all_reduce": [2]}
    assert mesh["sub"]["groups"] == {"reduce_scatter": [2], "all_reduce": []}
    assert mesh["flat"]["groups"] == {"reduce_scatter": [4], "all_reduce": []}
    rows = [r[-1] for r in page["RESULT"]["mesh_rows"]]
    assert rows == ["yes", "yes", "no"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_mistake_fails_the_page_by_name(fault: str, tmp_path: Path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED[fault], tmp_path, timeout=280)
