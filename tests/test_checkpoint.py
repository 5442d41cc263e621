"""guide.checkpoint: a save is published whole or not at all, and a bad checkpoint fails by name.

Each guard is proven the way it is meant to work: the fault is injected into a real DCP checkpoint
and the guard must raise :class:`guide.checkpoint_verify.CheckpointError` naming the file or
parameter and what was expected. Where the module docstring claims plain DCP misses a fault (a
flipped byte, a model one layer smaller, a save that dies in place), a control test measures that
claim too, so the guard is known to be needed.

Single-process checkpoints (``no_dist=True``) keep most tests fast; the behaviours that need ranks
(a rank killed in the middle of ``dcp.save``, a bad checkpoint failing every rank without a hang)
run on 2 gloo ranks through :func:`guide.launch`.

``python tests/test_checkpoint.py FAULT`` runs one fault of :data:`FAULTS` as a script (exit code
and message), for ``benchmarks/fault_table.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh

import guide
from guide import checkpoint, checks, sharding
from guide.checkpoint import CheckpointError
from guide.data import synthetic_batches
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, train_steps

from peers import IMPORT_LIMIT_S, start_peer, wait_imported

pytestmark = [pytest.mark.timeout(120),  # measured: the slowest test 19 s on 2 cores at load 17
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]
warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # dcp's no_dist notice

CFG = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=2, d_mlp=32, max_seq=8)
BATCHES = synthetic_batches(steps=4, batch_size=4, seq_len=8, vocab=CFG.vocab, seed=0)


def trained(cfg: ModelConfig = CFG, steps: int = 2, rank=None):
    """A model and AdamW after ``steps`` steps (on ``rank``'s FSDP2 shards when given)."""
    model = build_model(cfg, seed=0)
    if rank is not None:
        model = sharding.apply_fsdp2(model, init_device_mesh("cpu", (rank.world_size,)))
    opt = make_optimizer("adamw", model.parameters())
    train_steps(model, opt, BATCHES[:steps], rank)
    return model, opt


def state_of(model, opt, with_optimizer: bool = True) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd} if with_optimizer else {"model": msd}


def save_single(path: Path, cfg: ModelConfig = CFG) -> dict:
    """Publish a one-process checkpoint at ``path``; return the state it holds (flat, full)."""
    model, opt = trained(cfg)
    with checkpoint.publishing(path) as partial:
        dcp.save(state_of(model, opt), checkpoint_id=partial, no_dist=True)
    return checkpoint.gathered_state(model, opt)


def load_single(path: Path, cfg: ModelConfig = CFG, with_optimizer: bool = True,
                manifest: bool = True) -> tuple:
    """Verify, then load ``path`` into a fresh one-process model (seed 1); return model, opt."""
    model = build_model(cfg, seed=1)
    opt = make_optimizer("adamw", model.parameters())
    state = state_of(model, opt, with_optimizer)
    checkpoint.verify(path, state, manifest=manifest)
    dcp.load(state, checkpoint_id=path, no_dist=True)
    if with_optimizer:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        set_model_state_dict(model, state["model"])
    return model, opt


def params_only(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.startswith("model.")}


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict]:
    path = checkpoint.step_dir(tmp_path, 2)
    return path, save_single(path)


# --------------------------------------------------------------------------------------------------
# The happy path, measured


def test_round_trip_is_bitwise_for_params_and_moments(saved) -> None:
    path, state = saved
    assert any("exp_avg_sq" in k and v.abs().max() > 0 for k, v in state.items())  # real moments
    model, opt = load_single(path)
    checks.assert_params_match("round trip", state, checkpoint.gathered_state(model, opt), 0.0, against=checks.SINGLE_PROCESS)


def test_publish_leaves_no_partial_and_a_complete_manifest(saved) -> None:
    path, _ = saved
    assert path.is_dir() and not path.with_name(path.name + checkpoint.PARTIAL).exists()
    listed = set(json.loads((path / checkpoint.MANIFEST).read_text())["files"])
    on_disk = {p.name for p in path.iterdir()} - {checkpoint.MANIFEST}
    assert listed == on_disk and ".metadata" in listed and "__0_0.distcp" in listed


def test_counting_reader_counts_every_record_of_a_full_load(saved) -> None:
    """A one-process load reads every record; the records are the .distcp files, byte for byte."""
    path, _ = saved
    model = build_model(CFG, seed=1)
    state = state_of(model, make_optimizer("adamw", model.parameters()))
    reader = checkpoint.CountingReader(path)
    dcp.load(state, storage_reader=reader, no_dist=True)
    assert reader.bytes_read == sum(checkpoint.disk_usage(path).file_bytes) > 0


def test_disk_usage_counts_exactly_the_tensor_bytes(saved) -> None:
    path, state = saved
    usage = checkpoint.disk_usage(path)
    assert usage.tensor_bytes == (sum(t.nbytes for t in state.values()),)
    assert usage.framing_bytes[0] == usage.file_bytes[0] - usage.tensor_bytes[0] > 0
    assert usage.entries[0] > len(state)  # every tensor, plus the param_groups' pickled values


def test_latest_skips_partial_and_unpublished_directories(tmp_path: Path) -> None:
    save_single(checkpoint.step_dir(tmp_path, 1))
    shutil.copytree(checkpoint.step_dir(tmp_path, 1), tmp_path / "step-000009.partial")
    (tmp_path / "step-000005").mkdir()  # no manifest: never published
    assert checkpoint.latest(tmp_path) == checkpoint.step_dir(tmp_path, 1)
    assert checkpoint.latest(tmp_path / "nothing-here") is None


def test_a_published_checkpoint_is_never_overwritten(saved) -> None:
    path, _ = saved
    with pytest.raises(CheckpointError, match=r"exists: a published checkpoint is never overwri"):
        checkpoint.begin_save(path)


def test_begin_save_clears_a_dead_saves_partial(tmp_path: Path) -> None:
    partial = tmp_path / "step-000001.partial"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"left by a crash")
    assert checkpoint.begin_save(tmp_path / "step-000001") == partial
    assert not partial.exists() or not any(partial.iterdir())


def test_publish_refuses_a_save_without_metadata(tmp_path: Path) -> None:
    partial = checkpoint.begin_save(tmp_path / "step-000001")
    partial.mkdir(parents=True, exist_ok=True)
    with pytest.raises(CheckpointError, match=r"no \.metadata: dcp\.save did not finish"):
        checkpoint.publish(partial)
    assert not (tmp_path / "step-000001").exists()


def test_begin_save_and_publish_refuse_the_wrong_names(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"give the published name, without '\.partial'"):
        checkpoint.begin_save(tmp_path / "step-000001.partial")
    with pytest.raises(CheckpointError, match=r"is not a '\.partial' directory from begin_save"):
        checkpoint.publish(tmp_path / "step-000001")


def test_verify_names_a_manifest_it_cannot_read(saved) -> None:
    path, _ = saved
    (path / checkpoint.MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest\.json is not a manifest written by"):
        checkpoint.verify(path)


def test_disk_usage_names_a_missing_rank_file(saved) -> None:
    path, _ = saved
    (path / "__0_0.distcp").rename(path / "__1_0.distcp")  # rank 0's file gone, rank 1's there
    with pytest.raises(CheckpointError, match=r"\.distcp files of ranks \[1\]; expected 0\.\.N-1"):
        checkpoint.disk_usage(path)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_step_dir_rejects_bad_steps(tmp_path: Path, bad) -> None:
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        checkpoint.step_dir(tmp_path, bad)


def test_step_dir_names_sort_in_step_order(tmp_path: Path) -> None:
    assert checkpoint.step_dir(tmp_path, 0) == tmp_path / "step-000000"
    assert checkpoint.step_dir(str(tmp_path), 42) == tmp_path / "step-000042"
    steps = [0, 9, 10, 99, 100, 123456]
    names = [checkpoint.step_dir(tmp_path, s).name for s in steps]
    assert sorted(names) == names


def _fake_published(path: Path) -> Path:
    """A directory ``latest`` takes for a published checkpoint: it has a manifest."""
    path.mkdir()
    (path / checkpoint.MANIFEST).write_text("{}")
    return path


def test_latest_is_the_newest_published_step(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None  # an empty root
    for step in (2, 10, 1, 9):
        _fake_published(checkpoint.step_dir(tmp_path, step))
    _fake_published(tmp_path / "step-000011.partial")
    (tmp_path / "step-000012").write_text("a file, not a checkpoint")
    assert checkpoint.latest(tmp_path) == checkpoint.step_dir(tmp_path, 10)
    assert checkpoint.latest(str(tmp_path)) == checkpoint.step_dir(tmp_path, 10)


def test_gathered_state_names_every_parameter_and_moment(saved) -> None:
    """The names the checkpoint uses: ``model.<param>`` and ``optim.state.<param>.<state>``."""
    model, opt = trained()
    params = [n for n, _ in model.named_parameters()]
    with_optim = checkpoint.gathered_state(model, opt)
    assert set(with_optim) == {f"model.{n}" for n in params} | {
        f"optim.state.{n}.{k}" for n in params for k in ("step", "exp_avg", "exp_avg_sq")}
    for n, p in model.named_parameters():
        assert torch.equal(with_optim[f"model.{n}"], p.detach())
        assert torch.equal(with_optim[f"optim.state.{n}.exp_avg"], opt.state[p]["exp_avg"])
    assert set(checkpoint.gathered_state(model)) == {f"model.{n}" for n in params}


def test_disk_usage_adds_up_every_file_of_a_rank_and_counts_each_record(tmp_path: Path) -> None:
    """Two writer threads: rank 0's data is in two files. Three records: two tensors and one
    pickled value."""
    path = checkpoint.step_dir(tmp_path, 1)
    with checkpoint.publishing(path) as partial:
        dcp.save({"a": torch.zeros(10), "b": torch.ones(3, 4), "n": 3}, no_dist=True,
                 storage_writer=dcp.FileSystemWriter(partial, thread_count=2))
    shards = [p for p in path.iterdir() if p.suffix == ".distcp"]
    assert sorted(p.name for p in shards) == ["__0_0.distcp", "__0_1.distcp"]
    usage = checkpoint.disk_usage(path)
    assert usage == checkpoint.DiskUsage(
        file_bytes=(sum(p.stat().st_size for p in shards),), tensor_bytes=((10 + 12) * 4,),
        entries=(3,), metadata_bytes=(path / ".metadata").stat().st_size)
    reader = checkpoint.CountingReader(path)
    for loads in (1, 2):  # a counter: a second load through the same reader adds its bytes
        state = {"a": torch.empty(10), "b": torch.empty(3, 4), "n": 0}
        dcp.load(state, storage_reader=reader, no_dist=True)
        assert reader.bytes_read == loads * usage.file_bytes[0]
    assert state["n"] == 3 and torch.equal(state["b"], torch.ones(3, 4))


def _clear_torchrun_env(monkeypatch) -> None:
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def test_job_dir_outside_torchrun_is_a_fresh_directory(monkeypatch, tmp_path: Path) -> None:
    _clear_torchrun_env(monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    a, b = checkpoint.job_dir("demo"), checkpoint.job_dir("demo")
    assert a != b and a.parent == b.parent == tmp_path
    for path in (a, b):
        assert path.is_dir() and not any(path.iterdir()) and path.name.startswith("demo-")


def test_job_dir_under_torchrun_is_one_path_that_rank_0_empties(monkeypatch,
                                                               tmp_path: Path) -> None:
    """Every rank names the same directory (the run id); rank 0 empties it (a rerun's files are
    gone), the other ranks leave it alone."""
    _clear_torchrun_env(monkeypatch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run7")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "1")
    assert checkpoint.job_dir("demo") == tmp_path / "demo-run7"
    assert not (tmp_path / "demo-run7").exists()  # rank 1 does not create it
    monkeypatch.setenv("RANK", "0")
    path = checkpoint.job_dir("demo")
    assert path == tmp_path / "demo-run7" and path.is_dir() and not any(path.iterdir())
    (path / "from-an-earlier-run").write_text("stale")
    monkeypatch.setenv("RANK", "1")
    assert checkpoint.job_dir("demo") == path and (path / "from-an-earlier-run").exists()
    monkeypatch.setenv("RANK", "0")
    assert checkpoint.job_dir("demo") == path and not any(path.iterdir())
    # torchrun without a run id (a static rendezvous): the master's address and port name the job
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert checkpoint.job_dir("demo") == tmp_path / "demo-127.0.0.1-29500"


def test_begin_save_and_publish_errors_read_in_full(saved, tmp_path: Path) -> None:
    """Each refusal, word for word: what is wrong and what to do instead."""
    path, _ = saved
    with pytest.raises(CheckpointError) as info:
        checkpoint.begin_save(path)
    assert str(info.value) == (
        f"{path} exists: a published checkpoint is never overwritten (a save that dies halfway "
        "through an old checkpoint's directory leaves a silent mix of both steps). Save each step "
        "into its own directory, e.g. guide.checkpoint.step_dir(root, step).")
    partial = tmp_path / "step-000007.partial"
    with pytest.raises(CheckpointError) as info:
        checkpoint.begin_save(partial)
    assert str(info.value) == (f"{partial}: give the published name, without '.partial'; "
                               "begin_save returns the partial directory to write into.")
    assert checkpoint.begin_save(tmp_path / "step-000007") == partial
    partial.mkdir()
    with pytest.raises(CheckpointError) as info:
        checkpoint.publish(partial)
    assert str(info.value) == (f"{partial} has no .metadata: dcp.save did not finish (seen by at "
                               "least one rank); nothing is published.")


def test_begin_save_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = checkpoint.step_dir(tmp_path / "runs" / "today", 1)
    partial = checkpoint.begin_save(path)
    assert partial == path.with_name("step-000001.partial") and partial.parent.is_dir()
    dcp.save({"w": torch.zeros(2)}, checkpoint_id=partial, no_dist=True)
    assert checkpoint.publish(partial) == path and checkpoint.latest(path.parent) == path


# --------------------------------------------------------------------------------------------------
# Resume: the optimizer state is part of the checkpoint, and the check can tell.


def _resume(path: Path, with_optimizer: bool) -> dict:
    model, opt = load_single(path, with_optimizer=with_optimizer)
    train_steps(model, opt, BATCHES[2:])
    return params_only(checkpoint.gathered_state(model, opt))


def test_resume_equals_uninterrupted_and_forgetting_the_optimizer_fails(saved) -> None:
    path, _ = saved
    model, opt = trained(steps=len(BATCHES))  # never stopped
    uninterrupted = params_only(checkpoint.gathered_state(model, opt))
    checks.assert_params_match("resume", uninterrupted, _resume(path, True), 0.0, against=checks.SINGLE_PROCESS)
    with pytest.raises(checks.CheckFailed, match=r"\[resume\] resume without optimizer: .* > tol"):
        checks.assert_params_match("resume without optimizer", uninterrupted,
                                   _resume(path, False), checks.PARAM_TOL["adamw"],
                                   check="resume", against=checks.SINGLE_PROCESS)


# --------------------------------------------------------------------------------------------------
# Faults: each injected into a good checkpoint; each must fail verify() by name.


def _truncate(path: Path) -> None:
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _flip_byte(path: Path) -> None:
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


#: fault -> (how to inject it into a published checkpoint, the model config that loads it, what the
#: error must say). The patterns name the file or the parameter and what was expected.
FAULTS: dict[str, tuple[Callable[[Path], None], ModelConfig, str]] = {
    "truncated_shard": (_truncate, CFG,
                        r"__0_0\.distcp has [\d,]+ bytes; the manifest written at save time says "
                        r"[\d,]+: the file was truncated"),
    "corrupted_shard": (_flip_byte, CFG,
                        r"__0_0\.distcp has the right size .* SHA-256 differs .* corrupted"),
    "missing_metadata": (lambda p: (p / ".metadata").unlink(), CFG,
                         r"\.metadata is missing: dcp\.save writes it last.*never finished"),
    "missing_shard": (lambda p: (p / "__0_0.distcp").unlink(), CFG,
                      r"__0_0\.distcp is missing; the manifest lists it with [\d,]+ bytes"),
    "missing_manifest": (lambda p: (p / checkpoint.MANIFEST).unlink(), CFG,
                         r"manifest\.json is missing: .* Pass manifest=False"),
    "one_layer_more": (lambda p: None, ModelConfig(**{**CFG.__dict__, "n_layers": 3}),
                       r"the state being loaded has model\.blocks\.2\.ln1\.weight of shape "
                       r"\(16,\); the checkpoint has no such entry .*another shape"),
    "one_layer_fewer": (lambda p: None, ModelConfig(**{**CFG.__dict__, "n_layers": 1}),
                        r"the checkpoint has model\.blocks\.1\.ln1\.weight of shape \(16,\) .* "
                        r"lacks .*silently skip them"),
    "other_hidden_size": (lambda p: None, ModelConfig(**{**CFG.__dict__, "d_model": 32}),
                          r"model\.tok_emb\.weight has shape \(32, 16\) in the checkpoint; the "
                          r"state being loaded expects \(32, 32\)"),
}


def run_fault(fault: str, root: Path) -> None:
    """Publish a good checkpoint under ``root``, inject ``fault``, load it (raises)."""
    inject, cfg, _ = FAULTS[fault]
    path = checkpoint.step_dir(root, 2)
    save_single(path)
    inject(path)
    load_single(path, cfg)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_fails_verify_by_name(fault: str, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=FAULTS[fault][2]):
        run_fault(fault, tmp_path)


def test_a_flipped_byte_deep_in_a_big_shard_fails_verify(tmp_path: Path) -> None:
    """Every byte is hashed, not the first block: a 4 MiB shard with a byte flipped at 3 MiB."""
    path = checkpoint.step_dir(tmp_path, 1)
    with checkpoint.publishing(path) as partial:
        dcp.save({"w": torch.zeros(1 << 20)}, checkpoint_id=partial, no_dist=True)
    shard = path / "__0_0.distcp"
    assert shard.stat().st_size > 4 << 20
    with shard.open("r+b") as f:
        f.seek(3 << 20)
        byte = f.read(1)
        f.seek(3 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has the right size .* corrupted"):
        checkpoint.verify(path)


def test_verify_names_a_missing_directory_and_a_partial_one(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        checkpoint.verify(tmp_path / "step-000001")
    (tmp_path / "step-000001.partial").mkdir()
    with pytest.raises(CheckpointError, match=r"is a save that did not finish .*never load it"):
        checkpoint.verify(tmp_path / "step-000001.partial")


def test_verify_without_content_still_checks_sizes(saved) -> None:
    path, _ = saved
    _flip_byte(path)
    checkpoint.verify(path, content=False)  # same size: only the hash would tell
    _truncate(path)
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.verify(path, content=False)


def test_model_only_load_ignores_the_optimizer_entries_but_not_extra_model_ones(saved) -> None:
    """A model-only state is checked against the checkpoint's "model" entries only."""
    path, state = saved
    model, _ = load_single(path, with_optimizer=False)
    checks.assert_params_match("model only", params_only(state), checkpoint.gathered_state(model),
                               0.0, against=checks.SINGLE_PROCESS)


# The controls: what plain DCP does with the same faults (guide.checkpoint's docstring claims).


def _plain_load(path: Path, cfg: ModelConfig = CFG) -> dict:
    model = build_model(cfg, seed=1)
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path, no_dist=True)
    return state


def test_control_plain_dcp_loads_a_flipped_byte_silently(saved) -> None:
    path, _ = saved
    (path / checkpoint.MANIFEST).unlink()
    shard = path / "__0_0.distcp"
    usage_before = checkpoint.disk_usage(path)
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    info = next(i for k, i in metadata.storage_data.items() if k.fqn == "model.head.weight")
    data = bytearray(shard.read_bytes())
    raw = saved[1]["model.head.weight"].numpy().tobytes()
    at = data.find(raw, info.offset, info.offset + info.length)
    assert at > 0, "head.weight's bytes not found in its record"
    data[at + len(raw) // 2] ^= 0x40  # one bit of one float of head.weight
    shard.write_bytes(bytes(data))
    loaded = _plain_load(path)["model"]["head.weight"]
    assert not torch.equal(loaded, saved[1]["model.head.weight"])  # no error, different weights
    assert checkpoint.disk_usage(path).file_bytes == usage_before.file_bytes


def test_control_plain_dcp_loads_into_a_smaller_model_silently(saved) -> None:
    path, _ = saved
    _plain_load(path, ModelConfig(**{**CFG.__dict__, "n_layers": 1}))  # no error


# --------------------------------------------------------------------------------------------------
# On ranks: a save that dies, and a bad checkpoint that must fail every rank without a hang.


class _KillRank1(dcp.DefaultSavePlanner):
    """A save planner that kills rank 1 once the save is planned, before it writes its file."""

    def finish_plan(self, new_plan):
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().finish_plan(new_plan)


def _save_then_die(rank: guide.Rank, root: Path, atomic: bool) -> None:
    """Save step 2, train to step 4 (rank 0 keeps both full states in ``expected.pt``), then save
    step 4, into its own directory through publishing() or over step 2's as plain DCP does, and
    kill rank 1 halfway through that save."""
    model, opt = trained(steps=2, rank=rank)
    if atomic:
        with checkpoint.publishing(checkpoint.step_dir(root, 2)) as partial:
            dcp.save(state_of(model, opt), checkpoint_id=partial)
    else:
        dcp.save(state_of(model, opt), checkpoint_id=root / "in-place")
    step2 = checkpoint.gathered_state(model, opt)
    train_steps(model, opt, BATCHES[2:], rank)
    step4 = checkpoint.gathered_state(model, opt)
    if rank.is_main:
        torch.save({"step2": step2, "step4": step4}, root / "expected.pt")
    if atomic:
        with checkpoint.publishing(checkpoint.step_dir(root, 4)) as partial:
            dcp.save(state_of(model, opt), checkpoint_id=partial, planner=_KillRank1())
    else:
        dcp.save(state_of(model, opt), checkpoint_id=root / "in-place", planner=_KillRank1())


def test_rank_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    with pytest.raises(guide.RankDied, match=r"rank 1 of 2 was killed by SIGKILL"):
        guide.launch(_save_then_die, 2, tmp_path, True, collective_timeout_s=20)
    assert (tmp_path / "step-000004.partial").is_dir()
    assert not checkpoint.step_dir(tmp_path, 4).exists()
    previous = checkpoint.latest(tmp_path)
    assert previous == checkpoint.step_dir(tmp_path, 2)
    model, opt = load_single(previous)
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)["step2"]
    checks.assert_params_match("after the crash", expected, checkpoint.gathered_state(model, opt),
                               0.0, against=checks.SINGLE_PROCESS)


def test_control_a_rank_killed_mid_save_in_place_leaves_a_silent_mix(tmp_path: Path) -> None:
    """Plain DCP, saving over the previous checkpoint's directory: the load mixes two steps."""
    with pytest.raises(guide.RankDied):
        guide.launch(_save_then_die, 2, tmp_path, False, collective_timeout_s=20)
    model, opt = load_single(tmp_path / "in-place", manifest=False)  # loads without an error
    got = checkpoint.gathered_state(model, opt)["model.head.weight"]
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    old, new = expected["step2"]["model.head.weight"], expected["step4"]["model.head.weight"]
    half = got.shape[0] // 2
    assert torch.equal(got[:half], new[:half]) and not torch.equal(got[:half], old[:half])
    assert torch.equal(got[half:], old[half:]) and not torch.equal(got[half:], new[half:])


def _load_on_ranks(rank: guide.Rank, path: Path, cfg: ModelConfig) -> None:
    model = sharding.apply_fsdp2(build_model(cfg, seed=1),
                                 init_device_mesh("cpu", (rank.world_size,)))
    state = state_of(model, make_optimizer("adamw", model.parameters()))
    checkpoint.verify(path, state)
    dcp.load(state, checkpoint_id=path)


@pytest.mark.parametrize("fault", ["truncated_shard", "other_hidden_size"])
def test_a_bad_checkpoint_fails_every_rank_by_name_without_a_hang(fault: str,
                                                                   tmp_path: Path) -> None:
    inject, cfg, pattern = FAULTS[fault]
    path = checkpoint.step_dir(tmp_path, 2)
    save_single(path)
    inject(path)
    with pytest.raises(guide.RankRaised) as info:  # a hang would be RankHung, after 20 s
        guide.launch(_load_on_ranks, 2, path, cfg, collective_timeout_s=20)
    assert info.value.exc_type == "CheckpointError"
    assert re.search(pattern, str(info.value)), str(info.value)
    assert "rank 0" in str(info.value) and "rank 1" in str(info.value)  # both ranks raised it


def _publish_with_a_slow_rank(rank: guide.Rank, root: Path) -> list[str]:
    """Save and publish on every rank, with rank 1 descheduled (a busy machine) for 1 s right after
    publish's first barrier: the window in which rank 0 used to rename ``.partial`` away before rank
    1 had looked for its ``.metadata``. Returns the names in the published directory."""
    barrier = checkpoint._barrier
    calls = []

    def slow_after_first(group: object) -> None:
        barrier(group)
        calls.append(group)
        if rank.rank == 1 and len(calls) == 2:  # begin_save's, then publish's first
            time.sleep(1.0)

    checkpoint._barrier = slow_after_first  # this rank's process only (ranks are fresh processes)
    mesh = init_device_mesh("cpu", (rank.world_size,))
    model = sharding.apply_fsdp2(build_model(CFG, seed=0), mesh)
    with checkpoint.publishing(checkpoint.step_dir(root, 1)) as partial:
        dcp.save(state_of(model, make_optimizer("adamw", model.parameters())),
                 checkpoint_id=partial)
    return sorted(p.name for p in checkpoint.step_dir(root, 1).iterdir())


def test_publish_waits_for_a_slow_rank_to_check_before_renaming(tmp_path: Path) -> None:
    """The checkpoint page's flake, made deterministic: a slow rank must still find ``.metadata``
    (before the fix: "step-000001.partial has no .metadata" on rank 1, every time)."""
    names = guide.launch(_publish_with_a_slow_rank, 2, tmp_path, collective_timeout_s=20)
    assert names[0] == names[1] and ".metadata" in names[0] and checkpoint.MANIFEST in names[0]
    assert checkpoint.latest(tmp_path) == checkpoint.step_dir(tmp_path, 1)


# --------------------------------------------------------------------------------------------------
# The same collectives with rank 0 in this process (rank 1 a real process): mutmut sees only what
# runs in the test's own process, so these are the tests that check the ranks' side of publish.


_PEER = """
import sys, datetime, cloudpickle, torch, torch.distributed as dist
import guide
port, path, timeout = int(sys.argv[1]), sys.argv[2], datetime.timedelta(seconds=float(sys.argv[3]))
fn, args = cloudpickle.loads(open(path, "rb").read())
store = dist.TCPStore("127.0.0.1", port, timeout=timeout)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timeout)
fn(guide.Rank(1, 2, torch.device("cpu"), "gloo"), *args)
dist.destroy_process_group()
"""


#: A test with rank 1 in a fresh process: its imports may take up to IMPORT_LIMIT_S first.
TWO_RANKS = pytest.mark.timeout(IMPORT_LIMIT_S + 120)


def in_two_ranks(tmp_path: Path, fn: Callable, *args, timeout_s: float = 20.0):
    """``fn(rank, *args)`` as rank 0 here and as rank 1 in a fresh process, one gloo group; returns
    rank 0's result, and fails if rank 1 failed. ``timeout_s`` bounds every wait once rank 1 has
    imported torch (tests/peers.py: its imports alone took 34 s under load)."""
    import cloudpickle
    from datetime import timedelta

    from guide.launcher.local import _loopback_listener

    listener = _loopback_listener()  # as guide.launch does: nothing listens beyond loopback
    port = listener.getsockname()[1]
    master = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout_s), master_listen_fd=listener.fileno(),
                           use_libuv=True)
    listener.detach()  # the store owns the socket now
    payload = tmp_path / "peer.pkl"
    payload.write_bytes(cloudpickle.dumps((fn, args)))
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's sockets too, in both ranks
    ready = tmp_path / "peer.imported"
    peer = start_peer(_PEER, str(port), str(payload), str(timeout_s), ready=ready)
    try:
        wait_imported(peer, ready)  # the rendezvous timeout starts once rank 1 can join
        dist.init_process_group("gloo", store=master, rank=0, world_size=2,
                                timeout=timedelta(seconds=timeout_s))
        out = fn(guide.Rank(0, 2, torch.device("cpu"), "gloo"), *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        del master
        if ifname is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
        try:
            peer.wait(timeout=3 * timeout_s)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
    assert peer.returncode == 0, f"rank 1 failed (exit {peer.returncode})"
    return out


def _publish_in_own_groups(rank: guide.Rank, root: Path) -> dict:
    """Each rank saves in a group of its own (a checkpoint per rank), rank 1 twice: publish must use
    the group it is given (its rank in that group, its barriers), never the world. Also returns the
    FSDP2-sharded model's gathered state."""
    groups = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group
    mine = groups[rank.rank]
    model = sharding.apply_fsdp2(build_model(CFG, seed=0),
                                 init_device_mesh("cpu", (rank.world_size,)))
    full = checkpoint.gathered_state(model)
    for step in range(rank.rank + 1):
        with checkpoint.publishing(checkpoint.step_dir(root / f"rank{rank.rank}", step),
                                   mine) as partial:
            dcp.save({"w": torch.full((4,), float(rank.rank))}, checkpoint_id=partial,
                     process_group=mine)
    dist.barrier()
    return full


@TWO_RANKS
def test_publish_uses_the_group_it_is_given(tmp_path: Path) -> None:
    stale = tmp_path / "ckpt" / "rank1" / "step-000000.partial"
    stale.mkdir(parents=True)
    (stale / "__1_0.distcp").write_bytes(b"left by a save that died")  # not overwritten
    full = in_two_ranks(tmp_path, _publish_in_own_groups, tmp_path / "ckpt")
    published = sorted(str(p.relative_to(tmp_path / "ckpt"))
                       for p in (tmp_path / "ckpt").glob("*/*"))
    assert published == ["rank0/step-000000", "rank1/step-000000", "rank1/step-000001"]
    for path in (tmp_path / "ckpt").glob("*/*"):
        assert sorted(p.name for p in path.iterdir()) == [
            ".metadata", "__0_0.distcp", checkpoint.MANIFEST]  # the stale file was cleared
        checkpoint.verify(path)
    reference = build_model(CFG, seed=0)
    assert set(full) == {f"model.{n}" for n, _ in reference.named_parameters()}
    for name, p in reference.named_parameters():  # gathered: full shapes, plain tensors
        assert type(full[f"model.{name}"]) is torch.Tensor
        assert torch.equal(full[f"model.{name}"], p.detach()), name


@TWO_RANKS
def test_publish_waits_for_a_slow_rank_here_too(tmp_path: Path, monkeypatch) -> None:
    """:func:`test_publish_waits_for_a_slow_rank_to_check_before_renaming`, rank 0 in this
    process."""
    monkeypatch.setattr(checkpoint, "_barrier", checkpoint._barrier)  # the worker replaces it
    names = in_two_ranks(tmp_path, _publish_with_a_slow_rank, tmp_path / "ckpt")
    assert ".metadata" in names and checkpoint.MANIFEST in names
    assert checkpoint.latest(tmp_path / "ckpt") == checkpoint.step_dir(tmp_path / "ckpt", 1)


def _publish_an_unfinished_save(rank: guide.Rank, root: Path) -> str:
    """A save that never wrote ``.metadata``: publish must fail on every rank (none waits)."""
    partial = checkpoint.begin_save(checkpoint.step_dir(root, 1))
    if rank.is_main:
        partial.mkdir()
    dist.barrier()
    try:
        checkpoint.publish(partial)
    except CheckpointError as e:
        return str(e)
    raise AssertionError(f"rank {rank.rank} published a save without .metadata")


@TWO_RANKS
def test_an_unfinished_save_fails_publish_on_every_rank(tmp_path: Path) -> None:
    message = in_two_ranks(tmp_path, _publish_an_unfinished_save, tmp_path / "ckpt")
    assert "has no .metadata: dcp.save did not finish" in message
    assert checkpoint.latest(tmp_path / "ckpt") is None


#: What ``python tests/test_checkpoint.py FAULT`` can run: the verify() faults, and a rank killed
#: in the middle of a published save (the job fails with RankDied; the test above proves the
#: previous checkpoint survives).
SCRIPT_FAULTS = [*sorted(FAULTS), "rank_killed_mid_save"]

if __name__ == "__main__":  # one fault, failing as a script does: exit code 1 and the error
    if len(sys.argv) != 2 or sys.argv[1] not in SCRIPT_FAULTS:
        sys.exit(f"usage: {sys.argv[0]} FAULT, one of {SCRIPT_FAULTS}")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # relative paths: the messages stay short
        if sys.argv[1] == "rank_killed_mid_save":
            guide.launch(_save_then_die, 2, Path("ckpt"), True, collective_timeout_s=20)
        else:
            run_fault(sys.argv[1], Path("ckpt"))
