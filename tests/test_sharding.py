"""guide.sharding: one Strategy vocabulary (key, label, colour) and the apply_* functions."""

from __future__ import annotations

import pytest
import torch

import guide
from guide.model import build_model
from guide.sharding import Strategy, fsdp2_units, wrap


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


def test_wrap_refuses_what_it_cannot_do() -> None:
    rank = guide.Rank(0, 1, torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match=r"unknown strategy 'ZeRO-4'; choose one of \['ddp', "):
        wrap(build_model(), "ZeRO-4", rank)
    with pytest.raises(ValueError, match="ZeRO-1 is modelled, not run"):
        wrap(build_model(), Strategy.ZERO1, rank)
    with pytest.raises(ValueError, match="are FSDP2's; DDP takes none"):
        wrap(build_model(), "ddp", rank, reshard_after_forward=False)
    with pytest.raises(ValueError, match="expected a model with .blocks"):
        fsdp2_units(torch.nn.Linear(2, 2))
