"""Is a checkpoint whole, and does it fit the state about to be loaded? Checked before any read.

DCP leaves two gaps that :mod:`guide.checkpoint` closes here, each measured with torch 2.13 on gloo
(``tests/test_checkpoint.py`` keeps measuring them):

* **No checksums.** A flipped byte in a ``.distcp`` file loads silently; a truncated one fails deep
  in ``torch.load`` ("failed finding central directory") without naming the file.
  :func:`guide.checkpoint.publish` writes :data:`MANIFEST` (size and SHA-256 of every file, see
  :func:`sha256`); :func:`verify` checks them.
* **Loose key matching.** Loading into a model with one layer *fewer* than the checkpoint's
  succeeds and ignores the extra layer; one layer more or another hidden size raises a
  ``CheckpointException`` with the cause buried in every rank's traceback. :func:`verify` compares
  every tensor's name and global shape, both ways, before ``dcp.load`` reads anything, and raises
  :class:`CheckpointError` naming the first offender and what was expected.

:func:`verify` runs on every rank without collectives (each rank reads the same files and reaches
the same verdict), so a bad checkpoint fails every rank at once and never leaves one waiting in a
collective. This module holds the names both saving and verifying need (:data:`MANIFEST`,
:data:`PARTIAL`, :class:`CheckpointError`, :func:`flat_tensors`); :mod:`guide.checkpoint` imports
them from here, so ``guide.checkpoint.verify`` and ``guide.checkpoint.CheckpointError`` still work.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

__all__ = ["CheckpointError", "MANIFEST", "METADATA", "PARTIAL", "flat_tensors", "sha256", "verify"]

#: The file :func:`publish` writes into a checkpoint: ``{"files": {name: {"bytes", "sha256"}}}``.
MANIFEST = "manifest.json"
#: Suffix of a checkpoint still being written (or abandoned by a crash): never loaded.
PARTIAL = ".partial"
#: DCP's index of a checkpoint, written last, by rank 0, once every rank's files are written.
METADATA = ".metadata"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded as asked. The message names the file or the parameter
    and says what was expected."""


def verify(directory: str | os.PathLike, state: Mapping[str, Any] | None = None,
           manifest: bool = True, content: bool = True) -> None:
    """Raise :class:`CheckpointError` unless ``directory`` holds a whole checkpoint that fits
    ``state`` (the dict about to be given to ``dcp.load``). No collectives: call it on every rank.

    Checks, in order: ``.metadata`` exists (DCP writes it last: without it the save never
    finished); with ``manifest`` (a checkpoint made by :func:`publish`), every file listed exists
    with its recorded size and, with ``content``, its SHA-256 (``content=False`` skips reading every
    byte of a big checkpoint); then, for each top-level key of ``state`` (``"model"``, ``"optim"``),
    every tensor's dotted name and global shape against the checkpoint's, both ways.
    """
    path = Path(directory)
    if path.name.endswith(PARTIAL):
        raise CheckpointError(f"{path} is a save that did not finish (or is still being written): "
                              "never load it; guide.checkpoint.latest(root) names the newest "
                              "published checkpoint.")
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory.")
    if not (path / METADATA).is_file():
        raise CheckpointError(
            f"{path / METADATA} is missing: dcp.save writes it last, on rank 0, after every "
            "rank's files, so this save never finished (or the file was deleted). Load the "
            "previous checkpoint (guide.checkpoint.latest).")
    if manifest:
        _check_manifest(path, content)
    if state is not None:
        _check_entries(path, state)


def flat_tensors(state: Any) -> dict[str, torch.Tensor]:
    """Every tensor of a nested state dict (dicts, lists) by the dotted name DCP gives it:
    ``{"optim": {"state": {"head.weight": {"exp_avg": t}}}}`` becomes
    ``{"optim.state.head.weight.exp_avg": t}``."""
    return dict(_walk(state, ""))



# --------------------------------------------------------------------------------------------------


def _walk(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{prefix}.{i}" if prefix else str(i))


def _check_manifest(path: Path, content: bool) -> None:
    listing = path / MANIFEST
    if not listing.is_file():
        raise CheckpointError(
            f"{listing} is missing: this checkpoint was not published by guide.checkpoint.publish, "
            "so its files cannot be checked. Pass manifest=False to check keys and shapes only.")
    try:
        files = json.loads(listing.read_text())["files"]
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{listing} is not a manifest written by publish(): {exc}.") from None
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing; the manifest lists it with "
                                  f"{expected['bytes']:,} bytes.")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"{file} has {size:,} bytes; the manifest written at save time says "
                f"{expected['bytes']:,}: the file was truncated or replaced after the save.")
        if content and sha256(file) != expected["sha256"]:
            raise CheckpointError(
                f"{file} has the right size ({size:,} bytes) but not the content saved: its "
                f"SHA-256 differs from the manifest's ({expected['sha256'][:12]}...): the file is "
                "corrupted.")


def _check_entries(path: Path, state: Mapping[str, Any]) -> None:
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    saved = {name: tuple(md.size) for name, md in metadata.state_dict_metadata.items()
             if isinstance(md, TensorStorageMetadata)}
    wanted = {name: tuple(t.shape) for name, t in flat_tensors(state).items()}
    tops = {str(key) for key in state}
    saved = {name: shape for name, shape in saved.items() if name.split(".", 1)[0] in tops}
    counts = ", ".join(f"{top!r}: {_under(saved, top)} tensors in the checkpoint, "
                       f"{_under(wanted, top)} in the state being loaded" for top in sorted(tops))
    for name, shape in wanted.items():
        if name not in saved:
            raise CheckpointError(
                f"{path}: the state being loaded has {name} of shape {shape}; the checkpoint has "
                f"no such entry ({counts}): it was saved from a model of another shape.")
        if saved[name] != shape:
            raise CheckpointError(
                f"{path}: {name} has shape {saved[name]} in the checkpoint; the state being loaded "
                f"expects {shape}: it was saved from a model of another shape.")
    extra = [name for name in saved if name not in wanted]
    if extra:
        raise CheckpointError(
            f"{path}: the checkpoint has {extra[0]} of shape {saved[extra[0]]} (and "
            f"{len(extra) - 1} more entries) that the state being loaded lacks ({counts}): it was "
            "saved from a bigger model, and dcp.load would silently skip them.")


def _under(entries: Mapping[str, Any], top: str) -> int:
    return sum(name.split(".", 1)[0] == top for name in entries)


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (the manifest's ``sha256``)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
