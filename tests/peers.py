"""Rank 1 as a fresh Python process beside rank 0 in the test's own process, started so that no
rendezvous timeout runs while the peer is still importing torch.

A fresh ``python -c "import torch, guide"`` took 26-34 s on 2 cores at load 9 (measured), so a test
whose rank 0 gives its peer a 20-30 s rendezvous fails on a busy machine: in a busy run of the
suite, three two-rank tests of test_checkpoint and test_rank_main's two-rank test failed so. The
peer touches a file once its imports are done; the test waits for that file (failing at once if
the peer exits first), and only then starts the process group and its timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: How long a peer may take to import torch and guide: the measured 34 s at load 9, with room for
#: a machine twice as busy (a test that waits this long is slow, not failed).
IMPORT_LIMIT_S = 240.0


def start_peer(code: str, *args: str, ready: Path) -> subprocess.Popen:
    """Run ``code`` with ``args`` (``sys.argv[1:]``) in a fresh Python on this process's
    ``sys.path``; it touches ``ready`` once torch, torch.distributed and guide are imported."""
    prelude = ("import pathlib, torch, torch.distributed, guide\n"
               f"pathlib.Path({str(ready)!r}).touch()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", prelude + code, *args], env=env)


def wait_imported(peer: subprocess.Popen, ready: Path, limit_s: float = IMPORT_LIMIT_S) -> None:
    """Return once ``peer`` has touched ``ready``; fail if it exits first or takes over
    ``limit_s`` seconds (then it is killed)."""
    deadline = time.monotonic() + limit_s
    while not ready.exists():
        if peer.poll() is not None:
            raise AssertionError(f"the peer exited with code {peer.returncode} before its imports "
                                 "finished (its stderr is above)")
        if time.monotonic() > deadline:
            peer.kill()
            peer.wait()
            raise AssertionError(f"the peer did not import torch and guide within {limit_s:.0f} s")
        time.sleep(0.05)


@contextlib.contextmanager
def rank0_beside_peer(peer_code: str, tmp: Path, timeout_s: float,
                      peer_exit_s: float = 120) -> Iterator[None]:
    """This process as rank 0 of a two-rank gloo world (a file store in ``tmp``) for the ``with``
    block, rank 1 a fresh process running ``peer_code`` with the store's URL as ``sys.argv[1]``:
    the rendezvous (``timeout_s``) starts once the peer has imported torch; on an error the peer is
    killed; the world is torn down either way, and the peer must then exit with 0."""
    import torch.distributed as dist

    init = f"file://{tmp / 'store'}"
    ready = tmp / "peer.imported"
    peer = start_peer(peer_code, init, ready=ready)
    try:
        wait_imported(peer, ready)
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=timeout_s))
        yield
    except BaseException:
        peer.kill()
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        peer.wait(timeout=peer_exit_s)
    assert peer.returncode == 0, f"rank 1 failed (exit {peer.returncode}; its stderr is above)"


def reset_group_names() -> None:
    """Number this process's next default group 0 again, as a fresh peer numbers its own.

    torch names a process group by a counter that only the destruction of a world resets; an
    ``init_process_group`` that fails (test_rank_main's peer that never joins) has already counted
    its group and leaves the counter at 1. The next rank 0 in this process then names its world
    "1" while its fresh peer names it "0", and each waits for the other's gloo address until the
    timeout (measured: ``wait timeout after 20000ms, keys: /1//cpu//0/1`` here and
    ``/0//cpu//0/0`` in the peer). No-op while a world is up.
    """
    from torch.distributed import distributed_c10d

    if not distributed_c10d.is_initialized():
        distributed_c10d._world.group_count = 0
