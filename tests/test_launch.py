"""The launcher: results come home in rank order; failures end the job fast and name the rank."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import guide
from guide import launcher as launch_mod


@pytest.fixture(scope="module", autouse=True)
def warm_fork_server() -> None:
    """Start the fork server once (torch import, ≈2-5 s) so the time budgets below measure failure
    handling, not the server's cold start."""
    guide.launch(_sum_of_ranks, 2)


def _sum_of_ranks(rank: guide.Rank, scale: float = 1.0) -> dict:
    t = torch.tensor([float(rank.rank)])
    dist.all_reduce(t)
    return {"rank": rank.rank, "world": rank.world_size, "sum": t * scale, "device": str(rank.device)}


def test_results_come_back_in_rank_order() -> None:
    out = guide.launch(_sum_of_ranks, 3, scale=2.0)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"].item() == 6.0 and r["device"] == "cpu" for r in out)


def test_worker_defined_here_runs_by_value() -> None:
    """A closure over local state travels (cloudpickle); the ranks never import this file."""
    secret = 41

    def worker(rank: guide.Rank) -> int:
        return secret + rank.rank

    assert guide.launch(worker, 2) == [41, 42]


def test_dtensor_results_arrive_as_local_cpu_tensors() -> None:
    def worker(rank: guide.Rank) -> torch.Tensor:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (rank.world_size,))
        return distribute_tensor(torch.arange(6.0).reshape(6, 1), mesh, [Shard(0)])

    a, b = guide.launch(worker, 2)
    assert type(a) is torch.Tensor and a.flatten().tolist() == [0, 1, 2]
    assert b.flatten().tolist() == [3, 4, 5]


@pytest.mark.parametrize("ws", [0, -1, 1.5, "2", True, None])
def test_bad_world_size_is_refused(ws) -> None:
    with pytest.raises(guide.LaunchError, match="world_size must be a positive integer"):
        guide.launch(_sum_of_ranks, ws)


@pytest.mark.parametrize("option", ["deadline_s", "collective_timeout_s"])
def test_bad_timeouts_are_refused(option: str) -> None:
    with pytest.raises(guide.LaunchError, match=f"{option} must be a positive"):
        guide.launch(_sum_of_ranks, 2, **{option: 0})


def test_not_a_function_is_refused() -> None:
    with pytest.raises(guide.LaunchError, match="needs a function"):
        guide.launch("train", 2)


def test_unsupported_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    with pytest.raises(guide.LaunchError, match=r"torch 2.8.0\+cpu is not supported.*>=2.9"):
        guide.launch(_sum_of_ranks, 2)


def test_torchrun_world_size_mismatch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    assert guide.under_torchrun() and guide.world_size(2) == 4
    with pytest.raises(guide.LaunchError, match="--nproc-per-node=2"):
        guide.launch(_sum_of_ranks, 2)


def _raise_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        raise ValueError("root cause on rank 1")
    dist.barrier()  # rank 0 waits here for a peer that is gone


def test_raising_rank_fails_fast_with_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankRaised) as info:
        guide.launch(_raise_on_rank1, 2)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1 of 2 raised ValueError: root cause on rank 1" in str(err)
    assert "_raise_on_rank1" in err.remote_traceback


def _killed_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_killed_rank_fails_fast_and_is_named() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankDied, match="rank 1 of 2 was killed by SIGKILL") as info:
        guide.launch(_killed_on_rank1, 2)
    assert time.monotonic() - start < 10
    assert info.value.rank == 1


def _hang_on_rank1(rank: guide.Rank) -> None:
    dist.barrier()
    if rank.rank == 1:
        time.sleep(3600)  # stuck in Python, outside any collective
    dist.barrier()


def test_hung_rank_is_named_with_its_stack() -> None:
    start = time.monotonic()
    with pytest.raises(guide.RankHung) as info:
        guide.launch(_hang_on_rank1, 2, collective_timeout_s=5)
    elapsed = time.monotonic() - start
    assert elapsed < 20, elapsed
    msg = str(info.value)
    assert info.value.rank == 1
    assert "rank 1 of 2 hung: rank 0 waited collective_timeout_s=5 s" in msg
    assert "Python stack of rank 1" in msg and "_hang_on_rank1" in msg


def _deadlock(rank: guide.Rank) -> None:
    time.sleep(3600)


def test_job_past_its_deadline_is_killed() -> None:
    start = time.monotonic()
    with pytest.raises(guide.JobTimeout, match=r"deadline_s=3 s; ranks \[0, 1\]"):
        guide.launch(_deadlock, 2, deadline_s=3)
    assert time.monotonic() - start < 10


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


def test_gloo_avg_self_check_catches_a_summing_backend() -> None:
    """The launcher refuses a backend whose AVG reduce-scatter sums (pytorch#162338)."""

    def worker(rank: guide.Rank) -> None:
        real = dist.reduce_scatter_single

        def summing(out, inp, op=dist.ReduceOp.SUM, **kw):
            return real(out, inp, op=dist.ReduceOp.SUM, **kw)

        dist.reduce_scatter_single = summing
        launch_mod._check_gloo_avg(rank.rank, rank.world_size)

    with pytest.raises(guide.RankRaised, match=r"gloo AVG bug \(pytorch#162338\).*2x too large"):
        guide.launch(worker, 2)


def test_over_budget_allocation_is_reported_as_out_of_memory() -> None:
    def worker(rank: guide.Rank) -> int:
        return int(torch.ones(2 * 2**30, dtype=torch.uint8).sum())  # 2 GiB

    with pytest.raises(guide.RankOutOfMemory) as info:
        guide.launch(worker, 2, memory_limit_mib=800)
    err = info.value
    assert err.requested_bytes == 2 * 2**30 and err.limit_mib == 800
    assert "ran out of memory: it tried to allocate 2048.0 MiB with a budget of 800 MiB" in str(err)


def test_bad_memory_limit_is_refused() -> None:
    with pytest.raises(guide.LaunchError, match="memory_limit_mib must be a positive integer"):
        guide.launch(_sum_of_ranks, 2, memory_limit_mib=0)
