"""Checkpoints that survive a crash and a change of world size: publish atomically, measure.

``torch.distributed.checkpoint`` (DCP) saves a state dict as one file per rank
(``__<rank>_0.distcp``, that rank's chunks of every tensor) plus ``.metadata`` (which chunk of
which tensor lies where), written last, by rank 0, once every rank's files are written.
``dcp.load`` reads the chunks that overlap what each rank of the *loading* job holds, at any world
size. This module adds what DCP leaves to the user on the saving side, measured with torch 2.13 on
gloo (``tests/test_checkpoint.py`` keeps measuring it); :mod:`guide.checkpoint_verify` holds the
loading side (checksums, key and shape matching: :func:`guide.checkpoint_verify.verify`).

* **No atomic publish.** ``dcp.save`` into an existing checkpoint's directory overwrites the files
  in place; a rank killed halfway leaves the *old* ``.metadata`` next to new and old files, and
  ``dcp.load`` then loads rank 0's rows from the new step and rank 1's from the old one, silently.
  :func:`publishing` (or :func:`begin_save` + :func:`publish`) writes into ``<dir>.partial`` and
  renames it to ``<dir>`` only after every rank has finished: a directory without the suffix is
  always a whole checkpoint, and a crash leaves the previous one untouched. :func:`publish` also
  writes the manifest (size and SHA-256 of every file) that ``verify`` checks.

:func:`gathered_state` is the full training state (parameters and optimizer state, gathered with
``full_tensor()``) that the checks compare bit for bit; :class:`CountingReader` counts the bytes a
rank reads; :func:`disk_usage` splits a checkpoint's bytes into tensor data and framing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
from torch.distributed.tensor import DTensor

from guide.checkpoint_verify import (  # re-exported: guide.checkpoint.verify etc. keep working
    MANIFEST, METADATA, PARTIAL, CheckpointError, flat_tensors, sha256, verify)
from guide.launcher import under_torchrun

# Only this module's own names: the ones imported from guide.checkpoint_verify are documented there.
__all__ = ["CountingReader", "DiskUsage", "begin_save", "disk_usage", "gathered_state", "job_dir",
           "latest", "publish", "publishing", "step_dir"]

_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


# --------------------------------------------------------------------------------------------------
# Saving: into <dir>.partial, published by one rename.


def job_dir(name: str) -> Path:
    """A fresh scratch directory that every rank of this job names the same.

    Under ``torchrun`` every rank runs the script: the path is ``<tmp>/<name>-<run id>``
    (``TORCHELASTIC_RUN_ID``), emptied by rank 0 here, before the ranks first meet in a collective;
    it is left behind afterwards (other ranks may still read it). Otherwise a new temporary
    directory, which the script passes to the ranks :func:`guide.launch` starts.
    """
    if not under_torchrun():
        return Path(tempfile.mkdtemp(prefix=f"{name}-"))
    run_id = (os.environ.get("TORCHELASTIC_RUN_ID")
              or "{MASTER_ADDR}-{MASTER_PORT}".format(**os.environ))
    path = Path(tempfile.gettempdir()) / f"{name}-{run_id}"
    if os.environ.get("RANK") == "0":
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()  # in gettempdir(), which exists
    return path


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/step-000042``: names that sort in step order, which :func:`latest` relies on."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}.")
    return Path(root) / f"step-{step:06d}"


def begin_save(directory: str | os.PathLike, process_group: Any = None) -> Path:
    """Prepare to save into ``directory``: return ``<directory>.partial``, the path to give
    ``dcp.save`` (or ``dcp.async_save``). Collective: every rank calls it.

    Raises :class:`CheckpointError` on every rank if ``directory`` exists: a published checkpoint is
    never overwritten. A ``.partial`` left by a save that died is removed (by rank 0) first.
    """
    final = Path(directory)
    if final.name.endswith(PARTIAL):
        raise CheckpointError(f"{final}: give the published name, without {PARTIAL!r}; "
                              "begin_save returns the partial directory to write into.")
    if final.exists():
        raise CheckpointError(
            f"{final} exists: a published checkpoint is never overwritten (a save that dies "
            "halfway through an old checkpoint's directory leaves a silent mix of both steps). "
            "Save each step into its own directory, e.g. guide.checkpoint.step_dir(root, step).")
    partial = final.with_name(final.name + PARTIAL)
    if _rank(process_group) == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
    _barrier(process_group)
    return partial


def publish(partial: str | os.PathLike, process_group: Any = None) -> Path:
    """Publish a finished save: rank 0 writes :data:`MANIFEST` and renames ``<dir>.partial`` to
    ``<dir>`` (atomic on one filesystem). Collective: call it on every rank after ``dcp.save``
    returned there (after ``future.result()`` for ``dcp.async_save``). Returns ``<dir>``.

    Every rank checks that ``.metadata`` is there, and the ranks agree on the verdict (one
    all-reduce) before rank 0 renames anything: no rank looks for ``<dir>.partial`` after it is
    gone, and a save missing it fails every rank, none left waiting."""
    partial = Path(partial)
    if not partial.name.endswith(PARTIAL):
        raise CheckpointError(f"{partial} is not a {PARTIAL!r} directory from begin_save().")
    final = partial.with_name(partial.name.removesuffix(PARTIAL))
    _barrier(process_group)  # every rank's files are written and closed
    # Every rank looks, then the ranks agree before rank 0 renames: a rank that looked only after
    # the rename (descheduled on a busy machine) would find no .partial and fail a good save.
    missing = _any_rank(not (partial / METADATA).is_file(), process_group)
    if missing:  # every rank has the same verdict: all raise, none waits
        raise CheckpointError(f"{partial} has no {METADATA}: dcp.save did not finish (seen by "
                              "at least one rank); nothing is published.")
    if _rank(process_group) == 0:
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
                 for p in sorted(partial.iterdir()) if p.is_file()}
        _write_synced(partial / MANIFEST, json.dumps({"files": files}, indent=1))
        os.rename(partial, final)
        _fsync_dir(final.parent)
    _barrier(process_group)
    return final


@contextlib.contextmanager
def publishing(directory: str | os.PathLike, process_group: Any = None) -> Iterator[Path]:
    """``with publishing(dir) as partial: dcp.save(state, checkpoint_id=partial)``: the save is
    published as ``dir`` only if the block finished on every rank (:func:`begin_save`,
    :func:`publish`). A rank that raises or dies leaves ``dir.partial``, never ``dir``."""
    partial = begin_save(directory, process_group)
    yield partial
    publish(partial, process_group)


def latest(root: str | os.PathLike) -> Path | None:
    """The newest published checkpoint under ``root`` (by name, see :func:`step_dir`); ``None`` if
    there is none. Partial directories (a save in progress or killed) are never returned."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir()
            if p.is_dir() and not p.name.endswith(PARTIAL) and (p / MANIFEST).is_file()]
    return max(done, default=None)  # siblings: paths compare by name


# --------------------------------------------------------------------------------------------------
# Loading and measuring (verify, in guide.checkpoint_verify, runs before any load).


class CountingReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` that counts what this rank reads: ``bytes_read`` is the sum of
    the stored records ``dcp.load`` fetched (``.metadata`` not included)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        self.bytes_read = 0

    def read_data(self, plan, planner):  # noqa: ANN001, ANN201 (StorageReader's signature)
        """Add the lengths of the records in ``plan`` to ``bytes_read``, then read them."""
        self.bytes_read += sum(self.storage_data[item.storage_index].length for item in plan.items)
        return super().read_data(plan, planner)


def gathered_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None
                   ) -> dict[str, torch.Tensor]:
    """The full training state as flat CPU tensors named as in the checkpoint: ``model.<param>``,
    ``optim.state.<param>.exp_avg``, ... DTensors are gathered with ``full_tensor()`` (a collective:
    every rank calls it); DDP's ``module.`` prefix is already gone (``get_state_dict`` drops it)."""
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": {"state": osd["state"]}}
    out = {}
    for name, t in flat_tensors(state).items():
        full = t.full_tensor() if isinstance(t, DTensor) else t
        out[name] = full.detach().cpu().clone()
    return out


@dataclasses.dataclass(frozen=True)
class DiskUsage:
    """A checkpoint's bytes on disk, per saving rank (index = rank).

    ``file_bytes``: the rank's ``.distcp`` files; ``tensor_bytes``: the tensor data in them
    (elements x element size, from ``.metadata``); ``entries``: how many records they hold (one
    ``torch.save`` record per tensor chunk or pickled value: the rest of the file is their
    framing); ``metadata_bytes``: ``.metadata``.
    """

    file_bytes: tuple[int, ...]
    tensor_bytes: tuple[int, ...]
    entries: tuple[int, ...]
    metadata_bytes: int

    @property
    def framing_bytes(self) -> tuple[int, ...]:
        """Per rank: file bytes that are not tensor data (record framing, pickled values)."""
        return tuple(f - t for f, t in zip(self.file_bytes, self.tensor_bytes))


def disk_usage(directory: str | os.PathLike) -> DiskUsage:
    """Measure a DCP checkpoint on disk (see :class:`DiskUsage`)."""
    path = Path(directory)
    verify(path, manifest=False)
    files: dict[int, int] = {}
    for p in path.iterdir():
        match = _RANK_FILE.match(p.name)
        if match:
            files[int(match[1])] = files.get(int(match[1]), 0) + p.stat().st_size
    if sorted(files) != list(range(len(files))):
        raise CheckpointError(f"{path}: .distcp files of ranks {sorted(files)}; expected 0..N-1.")
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    tensors, entries = [0] * len(files), [0] * len(files)
    for index, info in metadata.storage_data.items():
        rank = int(_RANK_FILE.match(info.relative_path)[1])
        entries[rank] += 1
        entry = metadata.state_dict_metadata[index.fqn]
        if isinstance(entry, TensorStorageMetadata):
            chunk = next(c for c in entry.chunks if c.offsets == index.offset)
            numel = 1
            for n in chunk.sizes:
                numel *= n
            tensors[rank] += numel * entry.properties.dtype.itemsize
    return DiskUsage(tuple(files[r] for r in range(len(files))), tuple(tensors), tuple(entries),
                     (path / METADATA).stat().st_size)


# --------------------------------------------------------------------------------------------------


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rank(process_group: Any) -> int:
    return dist.get_rank(process_group) if dist.is_initialized() else 0


def _any_rank(flag: bool, process_group: Any) -> bool:
    """True on every rank if ``flag`` is true on any rank (a collective, and so a barrier too)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=process_group)
    return bool(t.item())


def _barrier(process_group: Any) -> None:
    if dist.is_initialized():
        dist.barrier(group=process_group)
