"""tests/peers.py: a peer that dies while importing fails the wait at once, naming its exit code."""

import subprocess
import sys
import time

import pytest

from peers import start_peer, wait_imported


def test_a_peer_that_exits_before_its_imports_fails_the_wait_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    start = time.monotonic()
    with pytest.raises(AssertionError, match="exited with code 3 before its imports finished"):
        wait_imported(dead, tmp_path / "never")
    assert time.monotonic() - start < 30


def test_a_peer_runs_its_code_after_touching_ready(tmp_path):
    ready, out = tmp_path / "ready", tmp_path / "out"
    peer = start_peer("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])",
                      str(out), "argument", ready=ready)
    wait_imported(peer, ready)
    assert peer.wait(timeout=120) == 0 and out.read_text() == "argument"


def test_a_peer_too_slow_to_import_is_killed(tmp_path):
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(AssertionError, match="did not import torch and guide within 0 s"):
        wait_imported(slow, tmp_path / "never", limit_s=0.2)
    assert slow.returncode is not None


def test_a_failed_init_does_not_rename_the_next_world(tmp_path):
    """The leak reset_group_names undoes: a world of 2 whose peer never comes leaves torch's group
    counter at 1 (the next world here would be "1", a fresh peer's "0")."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from peers import reset_group_names

    store = dist.FileStore(str(tmp_path / "store"), 2)
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        dist.init_process_group("gloo", store=store, rank=0, world_size=2,
                                timeout=timedelta(seconds=1))
    assert not dist.is_initialized() and distributed_c10d._world.group_count == 1
    reset_group_names()
    assert distributed_c10d._world.group_count == 0
