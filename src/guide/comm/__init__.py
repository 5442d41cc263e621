"""Communication, counted and predicted: what ranks send, what they should send, what it costs.

Prediction and measurement side by side, as for memory:

* :mod:`guide.comm.log` -- **measured**: :class:`CollectiveLog` records every collective a rank
  issues (kind, dtype, elements, bytes, phase of the step) and the bytes it wrote to its sockets.
* :mod:`guide.comm.expected` -- **predicted**: the collectives one step of DDP, ZeRO-1, FSDP2 or
  HSDP should issue, from parameter shapes (:func:`ddp_step`, :func:`zero1_step`,
  :func:`fsdp2_step`, :func:`hsdp_step`), and ZeRO's 2Ψ-vs-3Ψ accounting (:func:`zero_volume`).
* :mod:`guide.comm.cost` -- **estimated**: bytes per rank under the ring algorithm and on gloo, and
  seconds on nodes of GPUs joined by NVLink and NICs (:class:`Topology`, :func:`collective_seconds`).

The build assertions that compare them (:func:`guide.checks.check_volume`,
:func:`guide.checks.check_wire`) live in :mod:`guide.comm.checks`, re-exported by
:mod:`guide.checks`.
"""

from guide.comm.cost import (
    A100_NODE,
    BUSBW_FACTOR,
    H100_NODE,
    PUBLISHED_BUS_BANDWIDTH,
    PublishedBusBandwidth,
    Topology,
    bus_bandwidth,
    collective_seconds,
    compute_seconds,
    gloo_bytes,
    model_flops_per_token,
    ranks_per_node,
    ring_bytes,
    step_seconds,
)
from guide.comm.log import CollectiveLog, count_ddp_allreduce, wire_bytes_written
from guide.comm.expected import (
    KINDS,
    Collective,
    FSDPGroup,
    collective,
    ddp_step,
    fsdp2_groups,
    fsdp2_padded_numel,
    fsdp2_step,
    fsdp2_unit_groups,
    hsdp_step,
    summarize,
    zero1_step,
    zero_bytes,
    zero_volume,
)

__all__ = [
    "A100_NODE", "BUSBW_FACTOR", "H100_NODE", "KINDS", "PUBLISHED_BUS_BANDWIDTH", "Collective",
    "CollectiveLog", "FSDPGroup", "PublishedBusBandwidth", "Topology", "bus_bandwidth", "collective",
    "collective_seconds", "compute_seconds", "count_ddp_allreduce", "ddp_step", "fsdp2_groups",
    "fsdp2_padded_numel", "fsdp2_step", "fsdp2_unit_groups", "gloo_bytes", "hsdp_step",
    "model_flops_per_token", "ranks_per_node", "ring_bytes", "step_seconds", "summarize", "wire_bytes_written", "zero1_step",
    "zero_bytes", "zero_volume",
]
