"""Local ranks: results come home in rank order, workers travel by value, nothing listens beyond
loopback."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import guide

from guide.launcher.rank_main import to_cpu

from .workers import Pair, named_result, sum_of_ranks

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)


def test_results_come_back_in_rank_order() -> None:
    out = guide.launch(sum_of_ranks, 3, scale=2.0)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"].item() == 6.0 and r["device"] == "cpu" for r in out)


def test_one_rank_job_runs() -> None:
    assert guide.launch(sum_of_ranks, 1)[0]["sum"].item() == 0.0


def test_worker_defined_here_runs_by_value() -> None:
    """A closure over local state travels (cloudpickle); the ranks never import this file."""
    secret = 41

    def worker(rank: guide.Rank) -> int:
        return secret + rank.rank

    assert guide.launch(worker, 2) == [41, 42]


def test_dtensor_results_arrive_as_local_cpu_tensors() -> None:
    def worker(rank: guide.Rank) -> dict:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (rank.world_size,))
        shard = distribute_tensor(torch.arange(6.0).reshape(6, 1), mesh, [Shard(0)])
        return {"shard": shard, "nested": [shard, (shard,)]}

    a, b = guide.launch(worker, 2)
    assert type(a["shard"]) is torch.Tensor and a["shard"].flatten().tolist() == [0, 1, 2]
    assert b["shard"].flatten().tolist() == [3, 4, 5]
    assert type(a["nested"][1][0]) is torch.Tensor and not a["shard"].requires_grad


@dataclasses.dataclass(frozen=True)
class _Held:
    """A worker's result record, as pages return them."""

    shard: torch.Tensor
    label: str


def test_dataclass_results_arrive_with_local_cpu_tensors() -> None:
    def worker(rank: guide.Rank) -> _Held:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (rank.world_size,))
        return _Held(distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]), f"rank {rank.rank}")

    a, b = guide.launch(worker, 2)
    assert type(a.shard) is torch.Tensor and a.shard.tolist() == [0, 1] and a.label == "rank 0"
    assert b.shard.tolist() == [2, 3] and b.label == "rank 1"


def test_a_namedtuple_result_comes_back_as_one_with_cpu_tensors() -> None:
    a, b = guide.launch(named_result, 2)
    assert type(a) is Pair and (a.rank, b.rank) == (0, 1)
    assert b.value.tolist() == [1.0, 1.0] and not b.value.requires_grad


def test_to_cpu_rebuilds_namedtuples_field_by_field() -> None:
    out = to_cpu(Pair(3, torch.ones(1, requires_grad=True)))
    assert type(out) is Pair and out.rank == 3 and not out.value.requires_grad
    nested = to_cpu({"p": [Pair(1, torch.zeros(1, requires_grad=True))]})
    assert type(nested["p"][0]) is Pair and not nested["p"][0].value.requires_grad


def _listening_sockets(pids: list[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state owned by ``pids`` (from /proc)."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                    found.append(fields[1])
    return found


def test_rendezvous_and_gloo_listen_on_loopback_only() -> None:
    parent = os.getpid()

    def worker(rank: guide.Rank) -> list[str]:
        dist.barrier()
        addrs = _listening_sockets([parent, os.getpid()])
        dist.barrier()
        return addrs

    results = guide.launch(worker, 2)
    addrs = {a for r in results for a in r}
    assert addrs, "found no listening socket at all: the check cannot see the rendezvous"
    loopback = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1 and ::1
    assert all(a.startswith(loopback) for a in addrs), addrs


def test_no_files_are_left_behind(monkeypatch) -> None:
    """Each job's working directory (results, errors, stacks) is removed, even when a rank fails."""
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)

    def fails(rank: guide.Rank) -> None:
        raise ValueError("boom")

    guide.launch(sum_of_ranks, 2)
    with pytest.raises(guide.RankRaised):
        guide.launch(fails, 2)
    jobs = [p for p in made if Path(p).name.startswith("guide-launch-")]
    assert len(jobs) == 2 and not any(Path(p).exists() for p in jobs), jobs
