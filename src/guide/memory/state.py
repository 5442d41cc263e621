"""What one rank holds between two training steps, in bytes: :class:`~guide.memory.StateBytes`.

Both halves of :mod:`guide.memory` speak it: :mod:`guide.memory.predicted` computes a
``StateBytes`` from parameter shapes (the ZeRO model) and :mod:`guide.memory.measured` reads one off
the tensors a live rank holds, so the two compare with ``==``.

*Model state* is ZeRO's (arXiv 1910.02054 §3.1): parameters, gradients, optimizer state. DDP's
gradient buckets are kept apart in :attr:`~guide.memory.StateBytes.buckets`: they are not model
state, but with DDP's default ``gradient_as_bucket_view=False`` its reducer holds them between
steps, a second copy of every gradient. :attr:`~guide.memory.StateBytes.model_state` leaves them
out, :attr:`~guide.memory.StateBytes.total` counts them; every table says which it shows.

Units: ``GB`` is 10**9 bytes (the ZeRO paper's unit), ``GiB`` is 2**30 bytes.
"""

from __future__ import annotations

import dataclasses

__all__ = ["GB", "GiB", "StateBytes"]

GB = 10**9
GiB = 2**30


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes one rank holds between steps: parameters, gradients, optimizer state (the model
    state) and DDP's gradient buckets (0 where there is no DDP, or where the buckets are the
    gradients themselves: ``gradient_as_bucket_view=True``)."""

    params: int
    grads: int
    optimizer: int
    buckets: int

    @property
    def model_state(self) -> int:
        """Parameters + gradients + optimizer state: ZeRO's model state, without DDP's buckets."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        """Everything counted here: the model state plus DDP's gradient buckets."""
        return self.model_state + self.buckets

    def __add__(self, other: StateBytes) -> StateBytes:
        return StateBytes(self.params + other.params, self.grads + other.grads,
                          self.optimizer + other.optimizer, self.buckets + other.buckets)

    def gib(self) -> dict[str, float]:
        """Each part, the model state and the total, in GiB, keyed by name."""
        parts = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        parts |= {"model_state": self.model_state, "total": self.total}
        return {k: v / GiB for k, v in parts.items()}
