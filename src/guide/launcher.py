"""Run one function on N ranks of a ``torch.distributed`` process group and bring the results home.

An example calls :func:`launch` with a worker it defines itself::

    def worker(rank: guide.Rank, steps: int) -> dict: ...
    results = guide.launch(worker, 2, steps=20)   # one result per rank, in rank order

Three ways to run, one call:

* **Local** (docs build, ``python example.py``, Jupyter): the ranks are processes forked from a
  ``forkserver`` that has ``torch`` preloaded (≈0.1 s a job once the server is up, against 8–12 s for
  ``spawn`` on two cores). The worker travels *by value* (cloudpickle), so it may be defined in a
  script, a notebook cell or sphinx-gallery's fake ``__main__``. The ranks form a CPU **gloo** group
  whose rendezvous store is opened by the parent on an already-bound loopback socket: no port race
  between two builds, nothing listening beyond ``127.0.0.1``.
* **torchrun**: when the script itself was started by ``torchrun``, the process group torchrun set up is
  used (``nccl`` and one GPU per rank when CUDA is available), the worker runs in this process, and
  every rank gets every rank's result.

Failure is loud and fast: a rank that raises or dies ends the job within seconds with *that* rank's
traceback; a rank stuck in Python is named, with its Python stack, once its peers time out in the next
collective (``collective_timeout_s``); and a job that outlives ``deadline_s`` is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import gc
import json
import os
import pickle
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing import connection
from pathlib import Path
from typing import Any

__all__ = [
    "LaunchError",
    "Rank",
    "RankDied",
    "RankError",
    "RankHung",
    "RankOutOfMemory",
    "RankRaised",
    "JobTimeout",
    "launch",
    "under_torchrun",
    "world_size",
]

#: Modules the fork server imports once, so every rank starts with them warm. ``torch._dynamo`` is the
#: one the first optimizer construction would otherwise import lazily (≈2 s per fresh process).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.nn.parallel",
    "torch._dynamo",
    "cloudpickle",
    "guide.launcher",
]

#: Seconds the launcher waits, after the first rank fails, for the others to report their own errors.
_GRACE_S = 2.0

_GLOO_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crashing")
_OOM = re.compile(r"can't allocate memory|out of memory|Cannot allocate memory|MemoryError")
_OOM_BYTES = re.compile(r"tried to allocate (\d+) bytes")


@dataclasses.dataclass(frozen=True)
class Rank:
    """Who this process is in the job: passed as the first argument to every worker."""

    rank: int
    world_size: int
    device: Any  # torch.device; kept untyped so importing this module does not import torch
    backend: str

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that speaks for the job."""
        return self.rank == 0


class LaunchError(RuntimeError):
    """The job could not be started as asked (bad world size, mismatched torchrun, ...)."""


class RankError(RuntimeError):
    """A rank failed. ``rank`` is the root cause; ``details`` has every rank's story."""

    def __init__(self, message: str, rank: int, details: str = "") -> None:
        super().__init__(message + (f"\n\n{details}" if details else ""))
        self.rank = rank
        self.details = details


class RankRaised(RankError):
    """A rank raised an exception; ``exc_type`` is its class name, ``remote_traceback`` its traceback."""

    def __init__(self, message: str, rank: int, exc_type: str, remote_traceback: str,
                 details: str = "") -> None:
        super().__init__(message, rank, details)
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


class RankOutOfMemory(RankRaised):
    """A rank could not allocate memory. ``requested_bytes`` is what it asked for (when the
    allocator said), ``limit_mib`` the per-rank budget it ran under (``None`` without one)."""

    def __init__(self, message: str, rank: int, exc_type: str, remote_traceback: str,
                 requested_bytes: int | None, limit_mib: int | None, details: str = "") -> None:
        super().__init__(message, rank, exc_type, remote_traceback, details)
        self.requested_bytes = requested_bytes
        self.limit_mib = limit_mib


class RankDied(RankError):
    """A rank exited without raising: killed by a signal or ``os._exit``."""


class RankHung(RankError):
    """A rank stopped taking part: its peers timed out waiting for it in a collective."""


class JobTimeout(RankError):
    """The whole job outlived its deadline."""


def under_torchrun() -> bool:
    """True when this process was started by ``torchrun`` (or another launcher that sets its env)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    )


def world_size(default: int) -> int:
    """The number of ranks an example should use: torchrun's ``WORLD_SIZE`` if set, else ``default``.

    Examples call this once so that ``torchrun --nproc-per-node=4 example.py`` and
    ``python example.py`` run the same code at their own scale.
    """
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else default


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    deadline_s: float = 600.0,
    collective_timeout_s: float = 30.0,
    threads_per_rank: int | None = None,
    memory_limit_mib: int | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, *args, **kwargs)`` on ``world_size`` ranks; return the results in rank order.

    ``fn`` gets a :class:`Rank` first. Its return value must be picklable; tensors are moved to the
    CPU before they travel. ``collective_timeout_s`` is the process group's timeout: how long a rank
    waits in a collective for a peer that does not come. ``deadline_s`` bounds the whole job.
    ``threads_per_rank`` defaults to ``cores // world_size`` (at least 1): oversubscribing two cores
    made DDP 2.7–4.2× slower. ``memory_limit_mib`` caps each local rank's data segment
    (``RLIMIT_DATA``) before the worker runs, so over-use becomes a real allocation failure,
    reported as :class:`RankOutOfMemory`; it also sets glibc's mmap threshold to 64 KiB in the rank,
    without which heap fragmentation, not the model, decides who fits.

    Raises :class:`RankRaised`, :class:`RankDied`, :class:`RankHung` or :class:`JobTimeout` naming the
    rank at fault, and :class:`LaunchError` for a request that cannot run.
    """
    if not callable(fn):
        raise LaunchError(f"launch() needs a function to run on each rank, got {type(fn).__name__}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise LaunchError(
            f"world_size must be a positive integer (the number of ranks), got {world_size!r}."
        )
    for name, value in (("deadline_s", deadline_s), ("collective_timeout_s", collective_timeout_s)):
        if not value > 0:
            raise LaunchError(f"{name} must be a positive number of seconds, got {value!r}.")
    _check_torch()
    if under_torchrun():
        return _launch_in_torchrun(fn, world_size, args, kwargs, collective_timeout_s)
    if memory_limit_mib is not None and (isinstance(memory_limit_mib, bool) or
                                         not isinstance(memory_limit_mib, int) or memory_limit_mib < 1):
        raise LaunchError(f"memory_limit_mib must be a positive integer, got {memory_limit_mib!r}.")
    cores = os.cpu_count() or 1
    threads = threads_per_rank or max(1, cores // world_size)
    return _launch_local(fn, world_size, args, kwargs, deadline_s, collective_timeout_s, threads,
                         memory_limit_mib)


# --------------------------------------------------------------------------------------------------
# torchrun: the process group is torchrun's; the worker runs here.


def _launch_in_torchrun(fn, world_size, args, kwargs, collective_timeout_s):
    import torch
    import torch.distributed as dist

    env_ws = int(os.environ["WORLD_SIZE"])
    if env_ws != world_size:
        raise LaunchError(
            f"this script runs under torchrun with WORLD_SIZE={env_ws}, but the job asks for "
            f"{world_size} ranks. Start it with `torchrun --nproc-per-node={world_size}` or pass "
            f"guide.world_size({world_size}) to launch()."
        )
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout_s),
                                device_id=device if device.type == "cuda" else None)
        atexit.register(_teardown)
    result = _to_cpu(fn(Rank(rank, world_size, device, backend), *args, **kwargs))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, result)
    return gathered


# --------------------------------------------------------------------------------------------------
# Local: forkserver ranks, a loopback store opened by the parent.


def _check_torch() -> None:
    import torch

    from guide import SUPPORTED_TORCH, torch_version_ok

    if not torch_version_ok(torch.__version__):
        raise LaunchError(
            f"torch {torch.__version__} is not supported: this guide needs torch {SUPPORTED_TORCH} "
            f"(fully_shard and a correct gloo AVG reduction). `pip install 'torch{SUPPORTED_TORCH}'`."
        )


def _loopback_listener() -> socket.socket:
    """A socket bound and listening on 127.0.0.1 at a port the kernel picks: handed to the store."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _loopback_ifname() -> str | None:
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Hide ``__main__`` while ranks start, so they never re-run the calling script.

    multiprocessing makes a forkserver child import the parent's ``__main__`` file; for a gallery
    script (no ``if __name__ == "__main__"`` guard) that would run the whole example again inside
    every rank. The worker travels by value, so the ranks need nothing from ``__main__``.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _context():
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _launch_local(fn, world_size, args, kwargs, deadline_s, collective_timeout_s, threads,
                  memory_limit_mib=None):
    import cloudpickle
    import torch.distributed as dist

    payload = cloudpickle.dumps((fn, args, kwargs))
    listener = _loopback_listener()
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True,
                          timeout=timedelta(seconds=collective_timeout_s), wait_for_workers=False,
                          master_listen_fd=listener.fileno(), use_libuv=True)
    listener.detach()  # the store owns the socket now and closes it
    workdir = Path(tempfile.mkdtemp(prefix="guide-launch-"))
    ctx = _context()
    spec = _Spec(world_size, port, payload, str(workdir), collective_timeout_s, threads, os.getpid(),
                 _loopback_ifname(), memory_limit_mib)
    procs = []
    try:
        with _main_hidden():
            for rank in range(world_size):
                proc = ctx.Process(target=_rank_main, args=(rank, spec), name=f"guide-rank{rank}",
                                   daemon=True)
                proc.start()
                procs.append(proc)
        _supervise(procs, workdir, deadline_s, collective_timeout_s, memory_limit_mib)
        return [_read_result(workdir, rank) for rank in range(world_size)]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
        del store
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()


@dataclasses.dataclass(frozen=True)
class _Spec:
    world_size: int
    port: int
    payload: bytes
    workdir: str
    collective_timeout_s: float
    threads: int
    parent_pid: int
    loopback: str | None
    memory_limit_mib: int | None


def _supervise(procs, workdir: Path, deadline_s: float, collective_timeout_s: float,
               memory_limit_mib: int | None = None) -> None:
    """Wait for the ranks; on the first failure or at the deadline, kill the rest and raise."""
    start = time.monotonic()
    seen_dead: dict[int, float] = {}
    first_failure: float | None = None
    while True:
        now = time.time()
        for rank, proc in enumerate(procs):
            if proc.exitcode is not None and rank not in seen_dead:
                seen_dead[rank] = now
                if proc.exitcode != 0 and first_failure is None:
                    first_failure = time.monotonic()
        alive = [p for p in procs if p.exitcode is None]
        if first_failure is not None and (not alive or time.monotonic() - first_failure > _GRACE_S):
            _raise_failure(procs, workdir, seen_dead, collective_timeout_s, memory_limit_mib)
        if not alive:
            return
        if time.monotonic() - start > deadline_s:
            stacks = _dump_stacks(procs, workdir)
            ranks = [r for r, p in enumerate(procs) if p.exitcode is None]
            raise JobTimeout(
                f"the job did not finish within deadline_s={deadline_s:g} s; ranks {ranks} were still "
                "running and were killed. Raise deadline_s if the work is really this long.",
                ranks[0], stacks)
        connection.wait([p.sentinel for p in alive], timeout=0.2)


def _dump_stacks(procs, workdir: Path) -> str:
    """Ask each live rank for its Python stack (faulthandler on SIGUSR1) and return the text."""
    alive = [(r, p) for r, p in enumerate(procs) if p.exitcode is None]
    for _, proc in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(0.5)
    parts = []
    for rank, _ in alive:
        path = workdir / f"rank{rank}.stack"
        text = path.read_text() if path.exists() else "(no stack: the rank did not answer SIGUSR1)"
        parts.append(f"--- Python stack of rank {rank} ---\n{text.strip()}")
    return "\n".join(parts)


def _read_error(workdir: Path, rank: int) -> dict | None:
    path = workdir / f"rank{rank}.error"
    return json.loads(path.read_text()) if path.exists() else None


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without raising"


def _raise_failure(procs, workdir: Path, seen_dead: dict[int, float], collective_timeout_s,
                   memory_limit_mib: int | None) -> None:
    ws = len(procs)
    hung = [r for r, p in enumerate(procs) if p.exitcode is None]
    stacks = _dump_stacks(procs, workdir) if hung else ""
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0)}
    errors = {r: _read_error(workdir, r) for r in failed}
    # The root cause is the earliest failure that is not merely a peer noticing it ("connection
    # closed by peer"): a raising rank records when it raised; a rank that died without a word is
    # dated by when the launcher saw it go.
    when = {r: (errors[r]["time"] if errors[r] else seen_dead.get(r, time.time())) for r in failed}
    primary = [r for r in failed if not (errors[r] and _PEER_GONE.search(errors[r]["message"]))]
    root = min(primary or failed, key=lambda r: when[r])
    story = []
    for r in range(ws):
        if r in failed:
            err = errors[r]
            story.append(f"rank {r}: raised {err['type']}" if err else
                         f"rank {r}: {_describe_exit(failed[r])}")
        elif r in hung:
            story.append(f"rank {r}: still running (killed by the launcher)")
        else:
            story.append(f"rank {r}: finished")
    details = "Ranks:\n  " + "\n  ".join(story)
    err = errors[root]
    if err and _GLOO_TIMEOUT.search(err["message"]) and hung:
        raise RankHung(
            f"rank {hung[0]} of {ws} hung: rank {root} waited collective_timeout_s="
            f"{collective_timeout_s:g} s for it in a collective. Rank {root}'s error: "
            f"{err['type']}: {err['message'].strip().splitlines()[0] if err['message'].strip() else ''}",
            hung[0], details + "\n\n" + stacks)
    if err and _OOM.search(err["message"]):
        match = _OOM_BYTES.search(err["message"])
        requested = int(match[1]) if match else None
        limit = memory_limit_mib
        raise RankOutOfMemory(
            f"rank {root} of {ws} ran out of memory: it tried to allocate "
            f"{'an unknown amount' if requested is None else f'{requested / 2**20:.1f} MiB'}"
            f"{'' if limit is None else f' with a budget of {limit} MiB per rank'}.\n\n"
            f"Traceback from rank {root}:\n{err['traceback']}",
            root, err["type"], err["traceback"], requested, limit, details)
    if err:
        first_line = err["message"].strip().splitlines()[0] if err["message"].strip() else ""
        raise RankRaised(
            f"rank {root} of {ws} raised {err['type']}: {first_line}\n\n"
            f"Traceback from rank {root}:\n{err['traceback']}",
            root, err["type"], err["traceback"], details + (f"\n\n{stacks}" if stacks else ""))
    raise RankDied(f"rank {root} of {ws} {_describe_exit(failed[root])}.", root,
                   details + (f"\n\n{stacks}" if stacks else ""))


def _read_result(workdir: Path, rank: int) -> Any:
    path = workdir / f"rank{rank}.result"
    if not path.exists():
        raise RankDied(f"rank {rank} exited cleanly but left no result.", rank)
    with path.open("rb") as f:
        return pickle.load(f)


# --------------------------------------------------------------------------------------------------
# Inside a rank.


def _rank_main(rank: int, spec: _Spec) -> None:
    """Entry point of a rank process: join the group, run the worker, write its result, tear down."""
    workdir = Path(spec.workdir)
    stack_file = open(workdir / f"rank{rank}.stack", "w")  # noqa: SIM115 (lives as long as the rank)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    _watch_parent(spec.parent_pid)
    if spec.loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = spec.loopback  # gloo's own sockets stay on loopback too
    try:
        import cloudpickle
        import torch
        import torch.distributed as dist

        torch.set_num_threads(spec.threads)
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        timeout = timedelta(seconds=spec.collective_timeout_s)
        store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=False,
                              timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=spec.world_size,
                                timeout=timeout)
        _check_gloo_avg(rank, spec.world_size)
        if spec.memory_limit_mib is not None:
            _limit_memory(spec.memory_limit_mib)
        result = fn(Rank(rank, spec.world_size, torch.device("cpu"), "gloo"), *args, **kwargs)
        tmp = workdir / f"rank{rank}.result.tmp"
        with tmp.open("wb") as f:
            cloudpickle.dump(_to_cpu(result), f)
        tmp.rename(workdir / f"rank{rank}.result")
        del result, fn, args, kwargs
        _teardown()
    except BaseException as exc:  # noqa: BLE001 (everything a rank raises goes back to the parent)
        record = {"time": time.time(), "type": type(exc).__name__, "message": str(exc),
                  "traceback": traceback.format_exc()}
        (workdir / f"rank{rank}.error").write_text(json.dumps(record))  # the parent raises it
        os._exit(1)
    os._exit(0)


def _check_gloo_avg(rank: int, world_size: int) -> None:
    """Refuse to train where gloo's AVG reduce-scatter sums (pytorch#162338, torch <= 2.8): FSDP2
    reduces fp32 gradients with it, and the bug silently scales every gradient by world_size."""
    import torch
    import torch.distributed as dist

    if world_size == 1:
        return
    out = torch.empty(1)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, torch.full((world_size,), float(rank)), op=dist.ReduceOp.AVG)
    expected = (world_size - 1) / 2
    if abs(out.item() - expected) > 1e-6:
        raise LaunchError(
            f"gloo reduce_scatter_tensor(op=AVG) returned {out.item()} instead of the mean "
            f"{expected}: this torch ({torch.__version__}) has the gloo AVG bug (pytorch#162338) and "
            f"FSDP2 gradients would be {world_size}x too large. Upgrade torch (>= 2.9).")


def _limit_memory(limit_mib: int) -> None:
    """Cap this rank's data segment and make big allocations use mmap, so that freed memory really
    returns to the system (the default heap fragments: both DDP and FSDP2 then fail a tight cap)."""
    import resource

    from guide.peak_memory import prepare

    prepare()
    limit = limit_mib * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _teardown() -> None:
    """Free, sync, destroy: the order that never hung (0 of 165 launches; destroy-then-free did)."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _watch_parent(parent_pid: int) -> None:
    """End this rank if the launching process disappears (ranks are children of the fork server)."""

    def watch() -> None:
        while True:
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, name="guide-parent-watch", daemon=True).start()


def _to_cpu(obj: Any) -> Any:
    """Results travel to the parent: tensors (and DTensors) become plain CPU tensors."""
    import torch

    if isinstance(obj, torch.Tensor):
        from torch.distributed.tensor import DTensor

        if isinstance(obj, DTensor):
            obj = obj.to_local()
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
