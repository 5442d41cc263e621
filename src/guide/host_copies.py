"""What FSDP2's ``CPUOffloadPolicy`` copies between the host and the compute device, counted.

With ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` every sharded parameter, its gradient
and the optimizer state live in host memory. FSDP2 then asks for two copies per unit:

* **parameters in** (host to device): before each all-gather, FSDP2 copies the unit's sharded
  parameters to the compute device (``FSDPParam.all_gather_inputs`` calls
  ``sharded_param_data.to(device, non_blocking=True)``), once per all-gather: a unit that reshards
  after forward is copied again for its backward;
* **gradients out** (device to host): after each reduce-scatter, FSDP2 copies the unit's reduced
  gradient shards to the host (``foreach_reduce`` calls ``grad.to("cpu")``), where the optimizer
  steps them.

:class:`HostDeviceCopies` records those calls while it is active by wrapping ``torch.Tensor.to``
and keeping only the calls made *from* those two FSDP2 functions (the caller's name, read from the
stack). On a CPU rank the compute device is the host, so each copy returns its input: the calls and
their bytes are what a GPU rank would move over PCIe or NVLink-C2C; how long they take, and how
much overlaps the compute, only a GPU shows.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any

import torch

__all__ = ["CALLERS", "HostCopy", "HostDeviceCopies"]

#: The FSDP2 functions whose ``Tensor.to`` calls are the offload copies, and the direction of each.
CALLERS = {"all_gather_inputs": "to_device", "foreach_reduce": "to_host"}


@dataclasses.dataclass(frozen=True)
class HostCopy:
    """One copy FSDP2 asked for: ``direction`` is ``"to_device"`` (a parameter shard before an
    all-gather) or ``"to_host"`` (a gradient shard after a reduce-scatter); ``bytes`` is the
    copied tensor's size."""

    direction: str
    bytes: int

    def __post_init__(self) -> None:
        if self.direction not in CALLERS.values():
            raise ValueError(f"HostCopy direction {self.direction!r}: use one of "
                             f"{sorted(CALLERS.values())}.")


class HostDeviceCopies:
    """Record the host-device copies FSDP2's CPU offload asks for inside
    ``with HostDeviceCopies() as c:``; ``c.copies`` lists them in call order,
    :meth:`count` and :meth:`bytes` add them up per direction. Only one may be active at a time."""

    _active: HostDeviceCopies | None = None

    def __init__(self) -> None:
        self.copies: list[HostCopy] = []
        self._original: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> HostDeviceCopies:
        if HostDeviceCopies._active is not None:
            raise ValueError("a HostDeviceCopies is already active; close it first (they do not "
                             "nest: both would wrap Tensor.to).")
        HostDeviceCopies._active = self
        self._original = original = torch.Tensor.to

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            direction = CALLERS.get(sys._getframe(1).f_code.co_name)
            if direction is not None:
                with self._lock:
                    self.copies.append(HostCopy(direction, tensor.numel() * tensor.element_size()))
            return original(tensor, *args, **kwargs)

        torch.Tensor.to = to  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.to = self._original  # type: ignore[method-assign]
        HostDeviceCopies._active = None

    def _select(self, direction: str | None) -> list[HostCopy]:
        if direction is not None and direction not in CALLERS.values():
            raise ValueError(f"direction {direction!r}: use one of {sorted(CALLERS.values())}.")
        return [c for c in self.copies if direction is None or c.direction == direction]

    def count(self, direction: str | None = None) -> int:
        """Copies in ``direction`` (``"to_device"``, ``"to_host"``; both if ``None``)."""
        return len(self._select(direction))

    def bytes(self, direction: str | None = None) -> int:
        """Bytes copied in ``direction`` (both if ``None``)."""
        return sum(c.bytes for c in self._select(direction))
