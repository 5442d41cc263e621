"""The optimizers the site knows: how each is built, and what state it keeps per parameter.

Its own module, below both users: the training loop builds them (:func:`guide.training.make_optimizer`)
and the memory arithmetic prices their state (:mod:`guide.memory.predicted`), which must not load
the training loop to do so. Nothing here imports torch until an optimizer is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["OPTIMIZERS", "Optimizer"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """One optimizer of the site: how to build it, and what state it keeps per parameter.

    ``moments`` counts the per-element state tensors (SGD 0, momentum 1, AdamW 2: ``exp_avg`` and
    ``exp_avg_sq``); ``step_bytes`` is the per-parameter ``step`` counter AdamW keeps (a 0-d fp32
    tensor). The memory model reads these; the training loop calls :attr:`factory`.
    """

    key: str
    label: str
    factory: Callable[[list[Any]], Any]  # parameters -> torch.optim.Optimizer
    moments: int
    step_bytes: int


def _sgd(params: list[Any], **options: float) -> Any:
    import torch

    return torch.optim.SGD(params, **options)


def _adamw(params: list[Any]) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


#: The optimizers the site knows, by key. SGD is the sharp instrument (update = lr * grad: a 2x
#: gradient is a 2x step); AdamW normalises the gradient scale away.
OPTIMIZERS: dict[str, Optimizer] = {o.key: o for o in (
    Optimizer("sgd", "SGD", lambda params: _sgd(params, lr=0.1), 0, 0),
    Optimizer("sgd_momentum", "SGD + momentum",
              lambda params: _sgd(params, lr=0.1, momentum=0.9), 1, 0),
    Optimizer("adamw", "AdamW", _adamw, 2, 4),
)}
