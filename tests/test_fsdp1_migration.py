"""The FSDP1 -> FSDP2 page's claims about torch, and its checkpoint check, proven to bite.

* FSDP1 on a CPU-only machine needs ``device_id=torch.device("cpu")``: without it torch 2.13 raises
  the error the page prints (if a release changes that, this test says the page needs updating).
* A sharded checkpoint written the FSDP1 way (``FSDP.state_dict_type(SHARDED_STATE_DICT)``,
  ``FSDP.optim_state_dict``, ``dcp.save``) loads into FSDP2 (``get_state_dict``, ``dcp.load``,
  ``set_state_dict``) bit for bit, parameters and Adam moments; and the page's bitwise comparison
  fails by name when the load is forgotten, when only the model is loaded, or when one element is
  one float32 step off.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import guide
from guide import checkpoint, checks
from guide.data import synthetic_batches
from guide.model import Block, ModelConfig, build_model
from guide.sharding import apply_fsdp2
from guide.training import make_optimizer, train_steps

CFG = ModelConfig(vocab=64, d_model=32, n_layers=1, n_heads=2, d_mlp=64, max_seq=16)
BATCHES = synthetic_batches(steps=2, batch_size=4, seq_len=8, vocab=CFG.vocab, seed=0)


def _without_device_id(rank: guide.Rank) -> str:
    try:
        FSDP(build_model(CFG), auto_wrap_policy=ModuleWrapPolicy({Block}))
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_fsdp1_on_cpu_without_device_id_raises_the_error_the_page_shows() -> None:
    assert guide.launch(_without_device_id, 1) == [
        "FSDP needs a non-CPU accelerator device, but no accelerator device is detected."]


def _full(model, opt) -> dict[str, torch.Tensor]:
    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return checkpoint.flat_tensors({"model": model_sd, "optim": {"state": optim_sd["state"]}})


def _fsdp2_from(directory: str, rank: guide.Rank, load: str) -> dict[str, torch.Tensor]:
    """A fresh FSDP2 model + AdamW, loaded from the FSDP1 checkpoint as ``load`` says."""
    model = apply_fsdp2(build_model(CFG), init_device_mesh("cpu", (rank.world_size,)))
    opt = make_optimizer("adamw", model.parameters())
    if load != "nothing":
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd} if load == "model only" else {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state.get("optim", optim_sd))
    return _full(model, opt)


def _fsdp1_checkpoint_into_fsdp2(rank: guide.Rank, directory: str) -> dict:
    model = FSDP(build_model(CFG), auto_wrap_policy=ModuleWrapPolicy({Block}),
                 device_id=torch.device("cpu"))
    opt = make_optimizer("adamw", model.parameters())
    train_steps(model, opt, BATCHES, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # FSDP1's state_dict_type is deprecated
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            saved = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, opt)}
    dcp.save(saved, checkpoint_id=directory)
    return {"fsdp1": _full(model, opt),
            **{load: _fsdp2_from(directory, rank, load)
               for load in ("everything", "nothing", "model only")}}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    directory: Path = tmp_path_factory.mktemp("fsdp1-checkpoint")
    return guide.launch(_fsdp1_checkpoint_into_fsdp2, 2, str(directory))[0]


def test_fsdp1_checkpoint_loads_into_fsdp2_bitwise(loaded: dict) -> None:
    moments = [k for k in loaded["fsdp1"] if k.endswith(("exp_avg", "exp_avg_sq"))]
    assert len(moments) == 2 * len(build_model(CFG).state_dict())  # the optimizer is in it
    assert checks.assert_params_match("load", loaded["fsdp1"], loaded["everything"], 0.0,
                                      check="checkpoint load", against=checks.SINGLE_PROCESS) == 0.0


def test_a_forgotten_load_fails_the_bitwise_check(loaded: dict) -> None:
    with pytest.raises(checks.CheckFailed, match=r"\[checkpoint load\] forgot: \S+ differs from the "
                                                 r"single-process reference by"):
        checks.assert_params_match("forgot", loaded["fsdp1"], loaded["nothing"], 0.0,
                                   check="checkpoint load", against=checks.SINGLE_PROCESS)
    model_part = {k: v for k, v in loaded["fsdp1"].items() if k.startswith("model.")}
    with pytest.raises(checks.CheckFailed, match=r"forgot: model\.\S+ differs"):  # the weights too
        checks.assert_params_match("forgot", model_part,
                                   {k: loaded["nothing"][k] for k in model_part}, 0.0, against=checks.SINGLE_PROCESS)


def test_loading_the_model_without_the_optimizer_fails_on_the_moments(loaded: dict) -> None:
    model_part = {k: v for k, v in loaded["fsdp1"].items() if k.startswith("model.")}
    checks.assert_params_match("model", model_part,
                               {k: loaded["model only"][k] for k in model_part}, 0.0, against=checks.SINGLE_PROCESS)
    with pytest.raises(checks.CheckFailed, match=r"model only: optim\.state\.\S+ differs"):
        checks.assert_params_match("model only", loaded["fsdp1"], loaded["model only"], 0.0,
                                   check="checkpoint load", against=checks.SINGLE_PROCESS)


def test_one_float32_step_off_fails_the_bitwise_check(loaded: dict) -> None:
    off = dict(loaded["everything"])
    name = "optim.state.head.weight.exp_avg_sq"
    off[name] = off[name].clone()
    off[name].view(-1)[7] = torch.nextafter(off[name].view(-1)[7], torch.tensor(1.0))
    with pytest.raises(checks.CheckFailed, match=rf"{name} differs .* by \d\.\d\de-\d\d > tol 0e\+00"):
        checks.assert_params_match("ulp", loaded["fsdp1"], off, 0.0, check="checkpoint load", against=checks.SINGLE_PROCESS)
