"""guide.launcher.rank_main, run in this process: what one rank does around its worker.

``guide.launch`` runs :func:`rank_main` in fresh rank processes (``test_local.py`` and the failure
tests check the job from outside). Here it runs in the test's own process, as rank 0 of a job whose
parent (the test) holds the store, so that the rank's side of the contract is checked where it is
written: the result and error files the supervisor reads, the exit code, the stack file that
``SIGUSR1`` and a crash fill, the process group's timeout, the memory cap, the parent watch.
rank_main's ``os._exit`` is replaced by an exception that carries the exit code; everything it
changes in the process (faulthandler, threads, environment, process group) is put back afterwards.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from guide.launcher import rank_main as rank_main_module
from guide.launcher.local import _loopback_listener
from guide.launcher.rank import Rank
from guide.launcher.rank_main import Spec, _watch_parent, rank_main

from peers import IMPORT_LIMIT_S, start_peer, wait_imported

# A rank blocked in a C++ wait (the store, gloo) ignores pytest-timeout's default signal: the
# thread method ends the session (exit 1) if a test here hangs; measured under load: at most 12 s.
pytestmark = pytest.mark.timeout(45, method="thread")

WATCH = "guide-parent-watch"  # the parent watch's thread name (what a stack dump shows)


class Exited(BaseException):  # noqa: N818 (os._exit's stand-in: it carries the exit code)
    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


class _OsWithoutExit:
    """``os`` for rank_main's module: ``os._exit`` raises :class:`Exited` (the real one stays, so
    that pytest-timeout's thread method can still end a hung session)."""

    def __init__(self, exit_: Callable[[object], None]) -> None:
        self._exit = exit_

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


def _fake_exit(code: object) -> None:
    raise Exited(code)


@dataclasses.dataclass
class Ran:
    """What one in-process run of rank_main left: its exit code, its files, how long it took."""

    code: object
    workdir: Path
    seconds: float

    def result(self) -> object:
        with (self.workdir / "rank0.result").open("rb") as f:
            return cloudpickle.load(f)

    def error(self) -> dict:
        return json.loads((self.workdir / "rank0.error").read_text())

    def stack(self) -> str:
        return (self.workdir / "rank0.stack").read_text()


@pytest.fixture
def run_rank0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``run_rank0(fn, *args, world_size=1, store=True, **spec_fields, kwargs={})`` runs
    ``rank_main(0, spec)`` here (the test is the parent: it holds the store unless ``store`` is
    false) and returns a :class:`Ran`."""
    threads_before = torch.get_num_threads()
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)  # put back whatever was there
    monkeypatch.setattr(rank_main_module, "os", _OsWithoutExit(_fake_exit))
    runs = []

    def run(fn, *args, world_size: int = 1, store: bool = True, kwargs: dict | None = None,
            peers: bool = False, **fields) -> Ran:
        workdir = tmp_path / f"job{len(runs)}"
        workdir.mkdir()
        listener = _loopback_listener()  # as guide.launch does: nothing listens beyond loopback
        port = listener.getsockname()[1]
        if store:
            master = dist.TCPStore("127.0.0.1", port, world_size, is_master=True,  # noqa: F841
                                   wait_for_workers=False, timeout=timedelta(seconds=30),
                                   master_listen_fd=listener.fileno(), use_libuv=True)
            listener.detach()  # the store owns the socket now
        else:  # a port where nothing listens: the parent's store is gone
            listener.close()
        spec = Spec(**{"world_size": world_size, "port": port,
                       "payload": cloudpickle.dumps((fn, args, kwargs or {})),
                       "workdir": str(workdir), "collective_timeout_s": 20.0, "threads": 1,
                       "parent_pid": os.getpid(), "loopback": "lo", "memory_limit_mib": None,
                       **fields})
        others = [_peer(rank, spec) for rank in range(1, world_size)] if peers else []
        start = time.monotonic()
        try:
            rank_main(0, spec)
            code = "returned"  # rank_main never returns: it always ends the process
        except Exited as e:
            code = e.code
        finally:
            for peer in others:
                try:
                    peer.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    peer.kill()
                    peer.wait()
        runs.append(Ran(code, workdir, time.monotonic() - start))
        return runs[-1]

    yield run
    if dist.is_initialized():
        dist.destroy_process_group()
    faulthandler.unregister(signal.SIGUSR1)
    faulthandler.enable(file=sys.__stderr__, all_threads=True)  # pytest's, as it was
    torch.set_num_threads(threads_before)


def _peer(rank: int, spec: Spec) -> subprocess.Popen:
    """Rank ``rank`` of the job as a real process, running rank_main as guide.launch's ranks do;
    returns once it has imported torch (its rendezvous timeout starts after that, as rank 0's)."""
    path = Path(spec.workdir) / f"spec{rank}.pkl"
    path.write_bytes(cloudpickle.dumps(spec))
    code = ("import sys, cloudpickle; from guide.launcher.rank_main import rank_main; "
            "rank_main(int(sys.argv[1]), cloudpickle.loads(open(sys.argv[2], 'rb').read()))")
    ready = Path(spec.workdir) / f"rank{rank}.imported"
    peer = start_peer(code, str(rank), str(path), ready=ready)
    wait_imported(peer, ready)
    return peer


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WATCH and t.is_alive()]


class Pair(NamedTuple):
    rank: int
    value: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Record:
    shard: torch.Tensor
    label: str
    numel: int = dataclasses.field(init=False, default=0)  # derived: not an __init__ argument

    def __post_init__(self) -> None:
        object.__setattr__(self, "numel", self.shard.numel())


def test_a_rank_runs_its_worker_and_sends_cpu_results_home(run_rank0) -> None:
    """Exit 0, a result file (no error file, no temporary left), every tensor a plain CPU tensor
    in the container it was returned in; the worker saw its Rank, its arguments, the thread count
    and gloo on loopback; the group is torn down and the parent watch runs."""
    watchers = len(_watchers())

    def worker(rank: Rank, a: int, *, b: int) -> dict:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (rank.world_size,))
        shard = distribute_tensor(torch.arange(4.0, requires_grad=True), mesh, [Shard(0)])
        return {"rank": rank, "args": (a, b), "threads": torch.get_num_threads(),
                "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "world": dist.get_world_size(),
                "shard": shard, "nested": [shard, (shard, "text")], "pair": Pair(7, shard),
                "record": Record(shard, "r0"), "plain": 1.5}

    ran = run_rank0(worker, 3, kwargs={"b": 4}, threads=2)
    assert ran.code == 0, ran.error() if (ran.workdir / "rank0.error").exists() else ran.code
    assert sorted(p.name for p in ran.workdir.iterdir()) == ["rank0.result", "rank0.stack"]
    out = ran.result()
    assert out["rank"] == Rank(0, 1, torch.device("cpu"), "gloo")
    assert out["args"] == (3, 4) and out["threads"] == 2 and out["ifname"] == "lo"
    assert out["world"] == 1 and out["plain"] == 1.5
    tensors = [out["shard"], out["nested"][0], out["nested"][1][0], out["pair"].value,
               out["record"].shard]
    for t in tensors:
        assert type(t) is torch.Tensor and t.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert not t.requires_grad
    assert type(out["nested"]) is list and type(out["nested"][1]) is tuple
    assert out["nested"][1][1] == "text"
    assert type(out["pair"]) is Pair and out["pair"].rank == 7
    assert type(out["record"]) is Record and out["record"].label == "r0"
    assert out["record"].numel == 4
    assert not dist.is_initialized()  # torn down
    time.sleep(0.2)
    assert len(_watchers()) == watchers + 1  # the parent watch is running (and stays)


def test_a_raising_worker_leaves_its_error_record_and_exits_1(run_rank0) -> None:
    def worker(rank: Rank) -> None:
        raise ValueError("the words that name the fix")

    before = time.time()
    ran = run_rank0(worker)
    assert ran.code == 1
    assert not (ran.workdir / "rank0.result").exists()
    record = ran.error()
    assert set(record) == {"time", "type", "message", "traceback"}
    assert record["type"] == "ValueError" and record["message"] == "the words that name the fix"
    assert "in worker" in record["traceback"]
    assert record["traceback"].rstrip().endswith("ValueError: the words that name the fix")
    assert before <= record["time"] <= time.time()


@pytest.mark.timeout(IMPORT_LIMIT_S + 45, method="thread")  # rank 1 imports torch first
def test_two_ranks_form_one_group_and_each_writes_its_own_result(run_rank0) -> None:
    """Rank 0 here, rank 1 a real process: one group (gloo's AVG check passes, an all-reduce
    sums both ranks), each result in its own file."""

    def worker(rank: Rank) -> tuple[int, int, float]:
        t = torch.tensor([float(rank.rank + 1)])
        dist.all_reduce(t)
        return rank.rank, rank.world_size, t.item()

    ran = run_rank0(worker, world_size=2, peers=True)
    assert ran.code == 0
    assert ran.result() == (0, 2, 3.0)
    with (ran.workdir / "rank1.result").open("rb") as f:
        assert cloudpickle.load(f) == (1, 2, 3.0)


def test_a_peer_that_never_joins_fails_the_rank_within_the_collective_timeout(run_rank0) -> None:
    """World size 2, rank 1 never comes: rank 0 gives up after collective_timeout_s (2 s), not
    after torch's default (30 min), with an error record that says it timed out."""
    ran = run_rank0(lambda rank: None, world_size=2, collective_timeout_s=2.0)
    assert ran.code == 1 and "timeout" in ran.error()["message"].lower()
    assert ran.seconds < 20, ran.seconds


def test_a_rank_whose_parent_store_is_gone_fails_within_the_collective_timeout(run_rank0) -> None:
    ran = run_rank0(lambda rank: None, store=False, collective_timeout_s=2.0)
    assert ran.code == 1 and "timed out" in ran.error()["message"]
    assert ran.seconds < 20, ran.seconds


def _parked_in_a_thread(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait()


def test_sigusr1_writes_every_threads_stack_to_the_stack_file(run_rank0, tmp_path) -> None:
    """What the supervisor asks a hung rank for: the stacks of all its threads, not only the
    thread that took the signal."""

    def worker(rank: Rank, stack: Path) -> str:
        started, release = threading.Event(), threading.Event()
        t = threading.Thread(target=_parked_in_a_thread, args=(started, release))
        t.start()
        started.wait()
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while "_parked_in_a_thread" not in stack.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = stack.read_text()
        release.set()
        t.join()
        return text

    ran = run_rank0(worker, tmp_path / "job0" / "rank0.stack")
    assert ran.code == 0
    text = ran.result()
    assert "_parked_in_a_thread" in text and "in worker" in text, text


def test_a_crash_leaves_every_threads_stack_in_the_stack_file(run_rank0, tmp_path) -> None:
    """A rank killed by SIGSEGV: the supervisor reports where it died from the stack file, with
    every thread (here a forked copy of the rank crashes, so that the test survives it)."""

    def worker(rank: Rank, stack: Path) -> tuple[int, str]:
        pid = os.fork()
        if pid == 0:  # the copy: park a thread, then crash; it never returns into pytest
            try:
                started, release = threading.Event(), threading.Event()
                threading.Thread(target=_parked_in_a_thread, args=(started, release)).start()
                started.wait()
                os.kill(os.getpid(), signal.SIGSEGV)  # faulthandler writes, then re-raises it
                time.sleep(10)
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return status, stack.read_text()

    ran = run_rank0(worker, tmp_path / "job0" / "rank0.stack")
    assert ran.code == 0
    status, text = ran.result()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    assert "Segmentation fault" in text and "_parked_in_a_thread" in text, text


def test_the_parent_watch_ends_the_rank_once_the_parent_is_gone(monkeypatch) -> None:
    """A rank is a child of the fork server, not of the launching process: if the launcher dies,
    the rank must end by itself (an exit code that says it failed), and not before."""
    exits: list[object] = []

    def record_exit(code: object) -> None:
        exits.append(code)
        sys.exit()  # ends the watch thread, as os._exit would end the rank

    monkeypatch.setattr(rank_main_module, "os", _OsWithoutExit(record_exit))
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = set(_watchers())
        _watch_parent(parent.pid)
        time.sleep(0.2)
        (watch,) = [t for t in _watchers() if t not in before]
        assert watch.daemon  # it never keeps a process alive
        time.sleep(2.5)  # two polls and more: a live parent is left alone
        assert exits == [] and parent.poll() is None
    finally:
        parent.kill()
        parent.wait()
    watch.join(timeout=10)
    assert len(exits) == 1 and isinstance(exits[0], int) and 0 < exits[0] < 256, exits


def test_a_memory_limit_caps_the_rank_before_the_worker_runs(run_rank0, monkeypatch) -> None:
    """The cap the rank sets (``setrlimit`` recorded, not applied: a lowered hard limit could not
    be raised again in this process), after making big allocations use mmap."""
    calls = []
    monkeypatch.delenv("RANK0_CALLS", raising=False)

    def record(call: object) -> None:
        calls.append(call)
        os.environ["RANK0_CALLS"] = repr(calls)  # what the worker sees (it travels by value)

    monkeypatch.setattr(rank_main_module, "prepare", lambda: record("prepare"))
    monkeypatch.setattr(resource, "setrlimit", lambda *a: record(a))

    def worker(rank: Rank) -> str | None:
        return os.environ.get("RANK0_CALLS")

    ran = run_rank0(worker, memory_limit_mib=64)
    assert ran.code == 0
    assert calls == ["prepare", (resource.RLIMIT_DATA, (64 * 2**20, 64 * 2**20))]
    assert ran.result() == repr(calls)  # set before the worker ran
    assert run_rank0(worker).result() == repr(calls)  # no limit asked: none set
    assert len(calls) == 2
