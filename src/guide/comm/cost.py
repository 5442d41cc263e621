"""Bytes to seconds: what a collective puts on the wire per rank, and how long that takes on a
cluster of nodes. Everything here is an **estimate** from link rates, never a measurement.

Two questions, two answers:

* **Bytes one rank sends** for a :class:`~guide.comm.expected.Collective`: :func:`ring_bytes` is the
  standard ring algorithm (``(N-1)/N`` of the buffer for an all-gather or reduce-scatter, twice that
  for an all-reduce), which nccl's collectives approach; :func:`gloo_bytes` is what gloo sends, which
  runs a reduce-scatter as a full all-reduce. The communication example measures the latter.
* **Seconds** on a :class:`Topology`: nodes of ``gpus_per_node`` GPUs joined by NVLink inside a
  node and by ``nics_per_node`` NICs between nodes (:func:`bus_bandwidth`,
  :func:`collective_seconds`, :func:`compute_seconds`).

The hierarchical model and its assumptions
------------------------------------------
Ranks are numbered node by node (rank = node × ``gpus_per_node`` + local rank, as ``torchrun``
does), so a group of ``n`` ranks ``stride`` apart has ``r`` ranks on each of ``q = n / r`` nodes, and
``gpus_per_node / r`` such groups run the same collective at the same time on every node (data
parallelism: every rank is in one group).

* **Ring** (all-gather, reduce-scatter, all-reduce). Inside one node a ring runs over NVLink through
  the NVSwitch at ``nvlink_bytes_per_s`` per GPU and direction. Across nodes NCCL runs one ring per
  NIC ("channels"): each ring passes the node's ``r`` GPUs over NVLink and leaves the node through
  its own NIC, so a node's inter-node traffic is shared by **all** its NICs, not funnelled through
  one. Every hop of a ring carries the same bytes, so the bus bandwidth is the slower of NVLink and
  the node's NICs divided among the groups that share them:
  ``busbw = min(nvlink, nics_per_node × nic / (gpus_per_node / r))``. The time is
  :func:`ring_bytes` / ``busbw`` (nccl-tests' definition of bus bandwidth, ``doc/PERFORMANCE.md``).
* **Hierarchical all-reduce** (what NCCL's tree and NVLS-tree algorithms approach on a few nodes):
  reduce-scatter inside the node, all-reduce between nodes of ``1/r`` of the buffer per GPU on the
  GPU's own share of the NICs, all-gather inside the node; the stages are pipelined, so the time is
  the slower stage's. On two nodes it sends half of what a ring sends between nodes, which is why
  nccl-tests reports all-reduce bus bandwidths above the NICs' rate there.
* **Latency**: NCCL's own tuning model (``src/graph/tuning.cc``, Simple protocol): a base latency
  plus a per-step latency for each of the ring's steps (``n-1`` for an all-gather or reduce-scatter,
  ``2(n-1)`` for an all-reduce), the steps that cross nodes priced at the network's latency.
* Not modelled: congestion and the fat tree's oversubscription, NVLink SHARP, message sizes too
  small to reach the bus bandwidth, the NICs' and NVLink's protocol overhead (real collectives reach
  80–96 % of link rate: the published figures in :data:`PUBLISHED_BUS_BANDWIDTH` say how far below),
  overlap with compute (a page that estimates a step says how it combines the two).

The model is checked (``tests/comm/test_cost.py``) against published nccl-tests bus bandwidths:
it must never predict less than was measured, and at most :data:`BUSBW_FACTOR` times more.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from guide.comm.expected import Collective
from guide.constants import value
from guide.validate import positive_int

__all__ = ["A100_NODE", "BUSBW_FACTOR", "H100_NODE", "PUBLISHED_BUS_BANDWIDTH", "PublishedBusBandwidth",
           "Topology", "bus_bandwidth", "collective_seconds", "compute_seconds", "gloo_bytes",
           "model_flops_per_token", "ranks_per_node", "ring_bytes", "step_seconds"]

_RING_FACTOR = {"all_gather": 1, "reduce_scatter": 1, "broadcast": 1, "all_reduce": 2,
                "all_to_all": 1, "reduce": 1}


def ring_bytes(c: Collective, world_size: int | None = None) -> float:
    """Bytes one rank sends for ``c`` under the ring algorithm: ``(N-1)/N`` of the buffer for an
    all-gather, reduce-scatter or broadcast (averaged over ranks), ``2(N-1)/N`` for an all-reduce.
    This is what a backend with native collectives (nccl) approaches."""
    n = positive_int("world_size", world_size or c.group_size, "the ranks the collective spans")
    return _RING_FACTOR[c.kind] * (n - 1) / n * c.bytes


def gloo_bytes(c: Collective, world_size: int | None = None) -> float:
    """Bytes one rank sends for ``c`` on gloo: as :func:`ring_bytes`, except that gloo runs a
    reduce-scatter as a full all-reduce (``c10d::_reduce_scatter_base_`` -> ``gloo:all_reduce``), which
    sends ``2(N-1)/N`` of the buffer instead of ``(N-1)/N``."""
    if c.kind == "reduce_scatter":
        c = dataclasses.replace(c, kind="all_reduce")
    return ring_bytes(c, world_size)


@dataclasses.dataclass(frozen=True)
class Topology:
    """A cluster of identical nodes: ``gpus_per_node`` GPUs on NVLink (a switch: every pair at full
    rate), ``nics_per_node`` NICs between nodes. Rates are bytes per second per direction.

    The latencies are NCCL's tuning model's (``src/graph/tuning.cc``, ring, Simple protocol): a base
    per collective, and one per ring step over NVLink or over the network (cited constants,
    :data:`guide.constants.CONSTANTS` ``nccl.tuning.*``).
    """

    name: str
    gpus_per_node: int
    nvlink_bytes_per_s: float
    nics_per_node: int
    nic_bytes_per_s: float
    base_latency_s: float = value("nccl.tuning.base_latency")
    nvlink_step_latency_s: float = value("nccl.tuning.nvlink_step_latency")
    network_step_latency_s: float = value("nccl.tuning.network_step_latency")

    def __post_init__(self) -> None:
        positive_int("gpus_per_node", self.gpus_per_node)
        positive_int("nics_per_node", self.nics_per_node)
        for name in ("nvlink_bytes_per_s", "nic_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Topology {self.name!r}: {name} must be positive, got "
                                 f"{getattr(self, name)!r}.")


def _dgx(gpu: str) -> Topology:
    """A DGX node of ``gpu`` ("H100" or "A100") from the cited constants
    ``<gpu>.nvlink_bandwidth``, ``dgx_<gpu>.gpus``, ``dgx_<gpu>.nics`` and its NIC's rate
    (``ndr`` for H100, ``hdr`` for A100); its name spells out the NICs' rate in Gb/s, as
    datasheets quote it."""
    key, nic = gpu.lower(), {"H100": "ndr", "A100": "hdr"}[gpu]
    gpus, nics, rate = (value(f"dgx_{key}.gpus"), value(f"dgx_{key}.nics"),
                        value(f"{nic}.nic_bandwidth"))
    return Topology(f"{gpus} × {gpu} SXM, {nics} × {rate * 8 / 1e9:.0f} Gb/s NICs", gpus,
                    value(f"{key}.nvlink_bandwidth"), nics, rate)


#: A DGX H100 node: 8 × H100 SXM on NVLink, one ConnectX-7 NDR NIC per GPU (cited constants
#: ``h100.nvlink_bandwidth``, ``dgx_h100.gpus``, ``dgx_h100.nics``, ``ndr.nic_bandwidth``).
H100_NODE = _dgx("H100")
#: A DGX A100 node: 8 × A100 SXM on NVLink, 8 ConnectX-6 HDR NICs for compute (cited constants
#: ``a100.nvlink_bandwidth``, ``dgx_a100.gpus``, ``dgx_a100.nics``, ``hdr.nic_bandwidth``).
A100_NODE = _dgx("A100")


def ranks_per_node(group_size: int, topology: Topology, stride: int = 1) -> int:
    """How many ranks of a group of ``group_size`` ranks, ``stride`` apart (1: consecutive ranks,
    e.g. an FSDP2 shard group; the shard size: an HSDP replicate group), share a node."""
    positive_int("group_size", group_size, "ranks in the group")
    positive_int("stride", stride, "distance between consecutive ranks of the group")
    g = topology.gpus_per_node
    if stride >= g:
        return 1
    per_node = min(group_size, g // stride)
    if g % stride or group_size % per_node:
        raise ValueError(f"a group of {group_size} ranks {stride} apart does not tile nodes of {g} "
                         "GPUs evenly; choose sizes that divide, or are multiples of, the node.")
    return per_node


def bus_bandwidth(topology: Topology, group_size: int, stride: int = 1,
                  algorithm: str = "ring") -> float:
    """Bus bandwidth (bytes/s, nccl-tests' definition) of a collective over ``group_size`` ranks
    ``stride`` apart, every GPU of every node taking part in one such group at the same time.

    ``"ring"``: ``min(nvlink, nics × nic / groups per node)``, or NVLink alone inside one node.
    ``"hierarchical"`` (all-reduce only): the slower of the node-local stage over NVLink and the
    inter-node stage on the GPU's share of the NICs, expressed as a bus bandwidth (so on two nodes
    it exceeds the NICs' rate, as nccl-tests reports for NCCL's tree algorithm).
    """
    r = ranks_per_node(group_size, topology, stride)
    q = group_size // r
    nvlink = topology.nvlink_bytes_per_s
    if q == 1:
        return nvlink
    share = topology.nics_per_node * topology.nic_bytes_per_s * r / topology.gpus_per_node
    if algorithm == "ring":
        return min(nvlink, share)
    if algorithm == "hierarchical":
        # per unit buffer: intra 2(r-1)/r over NVLink; inter 2(q-1)/q of 1/r over the share per GPU
        intra = 2 * (r - 1) / r / nvlink
        inter = 2 * (q - 1) / q / r / (share / r)
        return 2 * (group_size - 1) / group_size / max(intra, inter)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose 'ring' or 'hierarchical'.")


def _latency_s(c: Collective, topology: Topology, r: int, algorithm: str) -> float:
    n, q = c.group_size, c.group_size // r
    if algorithm == "hierarchical":  # tuning.cc, tree: 2 * ((ppn - 1) * intra + log2(nodes) * inter)
        return topology.base_latency_s + 2 * ((r - 1) * topology.nvlink_step_latency_s
                                              + math.log2(q) * topology.network_step_latency_s)
    steps = _RING_FACTOR[c.kind] * (n - 1)
    inter = _RING_FACTOR[c.kind] * (q - 1)
    return (topology.base_latency_s + (steps - inter) * topology.nvlink_step_latency_s
            + inter * topology.network_step_latency_s)


def collective_seconds(c: Collective, topology: Topology, stride: int = 1,
                       algorithm: str = "ring") -> float:
    """Estimated seconds for ``c`` (over ``c.group_size`` ranks ``stride`` apart) on ``topology``:
    latency plus :func:`ring_bytes` at :func:`bus_bandwidth`. A group of one rank costs nothing.
    ``algorithm="hierarchical"`` applies to all-reduces only."""
    if c.group_size == 1:
        return 0.0
    if algorithm == "hierarchical" and c.kind != "all_reduce":
        raise ValueError(f"the hierarchical algorithm prices all-reduces, not {c.kind}.")
    r = ranks_per_node(c.group_size, topology, stride)
    bandwidth = bus_bandwidth(topology, c.group_size, stride, algorithm)
    return _latency_s(c, topology, r, algorithm) + ring_bytes(c) / bandwidth


def step_seconds(step: Iterable[Collective], topology: Topology, all_reduce_stride: int = 1) -> float:
    """Estimated seconds for one step's collectives run one after another (no overlap with each
    other or with compute). Each runs over consecutive ranks on the ring algorithm, except
    all-reduces: over ranks ``all_reduce_stride`` apart (HSDP's replicate groups: pass the shard
    size; DDP: 1), priced at the faster of ring and hierarchical, as NCCL's tuner picks."""
    total = 0.0
    for c in step:
        if c.kind == "all_reduce":  # a group of one costs 0.0 either way
            total += min(collective_seconds(c, topology, all_reduce_stride, algorithm)
                         for algorithm in ("ring", "hierarchical"))
        else:
            total += collective_seconds(c, topology)
    return total


def model_flops_per_token(n_params: float, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token as torchtitan counts them for its MFU (``get_num_flop_per_token``):
    ``6 * n_params`` (pass the parameters without the input embedding, as torchtitan does) plus
    ``12 * layers * hidden * seq_len`` for attention's scores and weighted values (causal masking
    not halved). Recomputation is not counted: MFU is model FLOPs over time."""
    for name, v in (("n_params", n_params), ("layers", layers), ("hidden", hidden),
                    ("seq_len", seq_len)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}.")
    return 6 * n_params + 12 * layers * hidden * seq_len


def compute_seconds(n_params: float, tokens: float, peak_flops: float, fraction_of_peak: float,
                    recompute: bool = False, *, flops_per_token: float | None = None) -> float:
    """Training compute per step: ``6 * Ψ * tokens`` FLOPs (forward 2, backward 4 per parameter per
    token; attention's ``s²`` term not counted) or ``flops_per_token * tokens`` where given (e.g.
    :func:`model_flops_per_token`, the count torchtitan's MFU uses), times 4/3 with full activation
    checkpointing (the forward runs twice), at ``fraction_of_peak`` of ``peak_flops``."""
    for name, v in (("n_params", n_params), ("tokens", tokens), ("peak_flops", peak_flops)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}.")
    if not 0 < fraction_of_peak <= 1:
        raise ValueError(f"fraction_of_peak must be in (0, 1], got {fraction_of_peak!r}.")
    if flops_per_token is not None and not flops_per_token > 0:
        raise ValueError(f"flops_per_token must be positive, got {flops_per_token!r}.")
    per_token = 6 * n_params if flops_per_token is None else flops_per_token
    return per_token * (4 / 3 if recompute else 1) * tokens / (peak_flops * fraction_of_peak)


# -- what the model is checked against ----------------------------------------------------------------

#: How far above a published bus bandwidth the model may be: it prices links at their nominal rate,
#: and real collectives reach 80-96 % of it.
BUSBW_FACTOR = 1.25


@dataclasses.dataclass(frozen=True)
class PublishedBusBandwidth:
    """A published nccl-tests bus bandwidth for large messages: ``low``..``high`` bytes/s measured
    for ``kind`` over ``nodes`` nodes of ``topology`` with NCCL's ``algorithm``."""

    what: str
    topology: Topology
    nodes: int
    kind: str
    algorithm: str
    low: float
    high: float
    source: str


#: Published nccl-tests ``busbw`` of all-reduces at large message sizes: the cited constants
#: ``nccl_tests.*`` of :data:`guide.constants.CONSTANTS` (each with its source).
PUBLISHED_BUS_BANDWIDTH = (
    PublishedBusBandwidth(
        "8 × H100 SXM, one node, NCCL_ALGO=RING", H100_NODE, 1, "all_reduce", "ring",
        value("nccl_tests.h100_1node_ring.low"), value("nccl_tests.h100_1node_ring.high"),
        "https://github.com/NVIDIA/nccl/issues/1455"),
    PublishedBusBandwidth(
        "2 × DGX H100, NDR: per-NIC figure × 8 NICs (NVIDIA)", H100_NODE, 2, "all_reduce", "ring",
        value("dgx_h100.nics") * value("nccl_tests.ndr_per_nic.low"),
        value("dgx_h100.nics") * value("nccl_tests.ndr_per_nic.high"),
        "https://github.com/NVIDIA/nccl-tests/issues/290"),
    PublishedBusBandwidth(
        "DGX H100, multi-node (NVIDIA's figure, quoted)", H100_NODE, 2, "all_reduce", "ring",
        value("nccl_tests.dgx_h100_multinode"), value("nccl_tests.dgx_h100_multinode"),
        "https://github.com/NVIDIA/nccl-tests/issues/309"),
    PublishedBusBandwidth(
        "DGX A100, 8 × 200 Gb/s IB, multi-node (NVIDIA)", A100_NODE, 2, "all_reduce", "ring",
        value("nccl_tests.dgx_a100_multinode"), value("nccl_tests.dgx_a100_multinode"),
        "https://github.com/NVIDIA/nccl/issues/812"),
)
