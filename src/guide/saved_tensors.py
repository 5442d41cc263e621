"""What autograd keeps for the backward pass, counted: :class:`SavedTensors`.

*Activation memory* is the tensors the forward pass saves for the backward pass. Every one of them
goes through :func:`torch.autograd.graph.saved_tensors_hooks`' ``pack`` hook, so counting them
there is a *measurement* of what the graph holds, not an estimate. Three rules make the count mean
"bytes held":

* **storages, each once.** Tensors that share memory are one cost: SDPA saves ``q``, ``k`` and
  ``v``, three views of the one ``qkv`` projection output, and a linear layer saves the same tensor
  the previous operation saved as its output. The count is the distinct storages' ``nbytes``.
* **parameters are not activations.** A linear layer saves its weight (``weight.t()``, a view) and a
  LayerNorm its ``weight``; those are model state, counted by :mod:`guide.memory.measured`. A saved
  tensor that is an ``nn.Parameter`` or a view of one is left out. (Under FSDP2 the unsharded
  parameters a block computes with are ``nn.Parameter`` too, and are left out the same way.)
* **the innermost hooks win.** Activation checkpointing (``torch.utils.checkpoint``, non-reentrant,
  and ``checkpoint_wrapper`` on top of it) installs its own hooks inside the checkpointed region, so
  what is counted there is what the checkpoint keeps: its inputs. That is the point of counting
  this way, and it is why ``modules=`` must name the *outermost* module of each region (the
  checkpoint wrapper, not the block inside it).

The storages are told apart by address, so the graph must stay alive while the count runs: count
the forward pass, then run the backward outside the ``with`` block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.hooks import RemovableHandle

from guide.layout import dtype_name

__all__ = ["SavedStorage", "SavedTensors", "is_parameter"]


@dataclasses.dataclass(frozen=True)
class SavedStorage:
    """One storage autograd saved: the shape and dtype of the first tensor seen on it, and the
    storage's size in bytes (which a view's shape may understate: ``q`` is a third of ``qkv``)."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def is_parameter(t: torch.Tensor) -> bool:
    """True if ``t`` is an ``nn.Parameter`` or a view of one (``weight.t()``): model state."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)


class SavedTensors:
    """Context manager: the bytes autograd saves for backward while the ``with`` body runs.

    ``modules=None`` counts everything saved inside the block; ``modules=[...]`` counts only what is
    saved while one of those modules' ``forward`` runs (forward pre/post hooks push and pop the
    counting hooks), e.g. ``SavedTensors(model.blocks)`` for the transformer blocks alone. After
    the block: :attr:`nbytes` (distinct non-parameter storages) and :attr:`storages` (each once, in
    the order first saved). Counters do not add up when nested: the innermost hooks win, so an
    inner counter hides what it counts from an outer one.
    """

    def __init__(self, modules: nn.Module | Iterable[nn.Module] | None = None) -> None:
        if isinstance(modules, nn.Module) and not isinstance(modules, nn.ModuleList):
            modules = [modules]  # a ModuleList (``model.blocks``) has no forward: its items do
        self.modules = None if modules is None else list(modules)
        if self.modules is not None and not self.modules:
            raise ValueError("SavedTensors(modules=[]) would count nothing; pass the modules whose "
                             "forward to count, or None for everything inside the with block.")
        self.storages: list[SavedStorage] = []
        self._seen: set[tuple[str, int]] = set()
        self._handles: list[RemovableHandle] = []
        self._hooks: list[Any] = []

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct storages saved for backward, parameters excluded."""
        return sum(s.nbytes for s in self.storages)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not is_parameter(t):
            storage = t.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
            if storage.nbytes() and key not in self._seen:
                self._seen.add(key)
                self.storages.append(SavedStorage(tuple(t.shape), dtype_name(t.dtype),
                                                  storage.nbytes()))
        return t

    def _push(self, *_: Any) -> None:
        hooks = saved_tensors_hooks(self._pack, _unpack)
        hooks.__enter__()
        self._hooks.append(hooks)

    def _pop(self, *_: Any) -> None:
        self._hooks.pop().__exit__(None, None, None)

    def __enter__(self) -> SavedTensors:
        if self.modules is None:
            self._push()
        else:
            for module in self.modules:
                self._handles.append(module.register_forward_pre_hook(self._push))
                self._handles.append(module.register_forward_hook(self._pop))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        while self._hooks:  # the whole-block hooks, or a module's left open by an exception
            self._pop()

    def __repr__(self) -> str:
        return f"SavedTensors({len(self.storages)} storages, {self.nbytes:,} bytes)"


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
