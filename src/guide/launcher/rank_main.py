"""Inside a local rank: the entry point of each rank process, and what every rank does around the
worker (join the group, cap memory, send the result home as CPU tensors, tear the group down).

A rank reports back through files in the job's working directory, which the supervising parent
reads (see ``guide.launcher.supervise``):

* ``rank{r}.result``: the worker's return value (cloudpickle), written atomically on success;
* ``rank{r}.error``: JSON ``{time, type, message, traceback}`` when the rank raised;
* ``rank{r}.stack``: the rank's Python stack, written by faulthandler when the parent sends SIGUSR1,
  or when a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) kills the rank: then the parent
  reports where it died.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import json
import os
import resource
import signal
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from guide.launcher.heap import prepare
from guide.launcher.rank import Rank
from guide.launcher.torch_support import check_gloo_avg

__all__ = ["Spec", "limit_memory", "rank_main", "teardown", "to_cpu"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything a local rank needs from the parent; travels (pickled) to each rank process."""

    world_size: int
    port: int  # the parent's TCPStore on 127.0.0.1
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    workdir: str
    collective_timeout_s: float
    threads: int
    parent_pid: int
    loopback: str | None  # the loopback interface name for gloo's own sockets
    memory_limit_mib: int | None


def rank_main(rank: int, spec: Spec) -> None:
    """Entry point of a rank process: join the group, run the worker, write its result, tear down."""
    workdir = Path(spec.workdir)
    stack_file = open(workdir / f"rank{rank}.stack", "w")  # noqa: SIM115 (lives as long as the rank)
    # every thread's stack (faulthandler's default), on SIGUSR1 and when a fatal signal kills it:
    faulthandler.register(signal.SIGUSR1, file=stack_file)
    faulthandler.enable(file=stack_file)
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
        store = dist.TCPStore("127.0.0.1", spec.port, timeout=timeout)  # the parent's, as client
        dist.init_process_group("gloo", store=store, rank=rank, world_size=spec.world_size,
                                timeout=timeout)
        check_gloo_avg(rank, spec.world_size)
        if spec.memory_limit_mib is not None:
            limit_memory(spec.memory_limit_mib)
        result = fn(Rank(rank, spec.world_size, torch.device("cpu"), "gloo"), *args, **kwargs)
        tmp = workdir / f"rank{rank}.result.tmp"
        with tmp.open("wb") as f:
            cloudpickle.dump(to_cpu(result), f)
        tmp.rename(workdir / f"rank{rank}.result")
        del result, fn, args, kwargs
        teardown()
    except BaseException as exc:  # noqa: BLE001 (everything a rank raises goes back to the parent)
        record = {"time": time.time(), "type": type(exc).__name__, "message": str(exc),
                  "traceback": traceback.format_exc()}
        (workdir / f"rank{rank}.error").write_text(json.dumps(record))  # the parent raises it
        os._exit(1)
    os._exit(0)


def limit_memory(limit_mib: int) -> None:
    """Cap this rank's data segment and make big allocations use mmap, so that freed memory really
    returns to the system (the default heap fragments: both DDP and FSDP2 then fail a tight cap)."""
    prepare()
    limit = limit_mib * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def teardown() -> None:
    """Free, sync, destroy: the order that never hung (0 of 165 launches; destroy-then-free did)."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def to_cpu(obj: Any) -> Any:
    """Results travel to the parent: tensors (and DTensors) become plain CPU tensors, detached,
    inside dicts, lists, tuples, namedtuples (which keep their type) and dataclasses (a worker's
    result record)."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(obj, torch.Tensor):
        if isinstance(obj, DTensor):
            obj = obj.to_local()
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a worker's result record
        return dataclasses.replace(obj, **{f.name: to_cpu(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple: fields by position
        return type(obj)(*(to_cpu(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


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
