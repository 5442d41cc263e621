"""guide.sharding: one Strategy vocabulary (key, label, colour) and the apply_* functions."""

from __future__ import annotations

import pytest
import torch

import guide
from guide.model import build_model
from guide.sharding import Strategy, apply_ddp, apply_fsdp2, fsdp2_units
from guide.training import make_optimizer, train_steps


def test_one_vocabulary() -> None:
    assert Strategy.parse("fsdp2") is Strategy.FSDP2 is Strategy.parse("FSDP2")
    assert Strategy.parse(Strategy.ZERO1) is Strategy.ZERO1 and Strategy.ZERO1.label == "ZeRO-1"
    assert len({s.color for s in Strategy}) == len(Strategy)  # every strategy its own colour
    assert [s for s in Strategy if s.ddp_underneath] == [Strategy.DDP, Strategy.ZERO1]
    assert str(Strategy.FSDP2) == "FSDP2" and Strategy.FSDP2 == "fsdp2"
    with pytest.raises(ValueError, match="unknown strategy 'zero4'"):
        Strategy.parse("zero4")


def test_fsdp2_units_are_root_then_blocks() -> None:
    model = build_model()
    units = fsdp2_units(model)
    assert len(units) == 1 + len(model.blocks)
    root_ids = {id(p) for p in units[0]}
    assert {id(model.tok_emb.weight), id(model.head.weight), id(model.ln_f.weight)} <= root_ids
    assert sum(p.numel() for u in units for p in u) == sum(p.numel() for p in model.parameters())


def test_apply_functions_take_a_mesh_and_say_so() -> None:
    rank = guide.Rank(0, 1, torch.device("cpu"), "gloo")
    for apply in (apply_ddp, apply_fsdp2):  # the old apply_ddp(model, rank) spelling
        with pytest.raises(TypeError, match=r"takes a DeviceMesh, got Rank: .*init_device_mesh"):
            apply(build_model(), rank)
    with pytest.raises(ValueError, match="expected a model with .blocks"):
        apply_fsdp2(torch.nn.Linear(2, 2), mesh=None)
    with pytest.raises(ValueError, match="expected a model with .blocks"):
        fsdp2_units(torch.nn.Linear(2, 2))


def test_train_steps_takes_a_rank_not_its_fields() -> None:
    model = build_model()
    with pytest.raises(TypeError, match=r"pass `rank`, not `rank.rank, rank.world_size`"):
        train_steps(model, make_optimizer("sgd", model.parameters()),
                    torch.zeros(1, 2, 9, dtype=torch.long), 0)

