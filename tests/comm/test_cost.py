"""guide.comm.cost: bytes per rank, and the hierarchical time model checked against published
nccl-tests bus bandwidths (:data:`guide.comm.PUBLISHED_BUS_BANDWIDTH`)."""

from __future__ import annotations

import math

import pytest

from guide import comm
from guide.comm import cost
from guide.comm import H100_NODE, Collective, Topology


def test_ring_and_gloo_bytes():
    ag = Collective("all_gather", "float32", 100, 400, None, 4)
    rs = Collective("reduce_scatter", "float32", 100, 400, None, 4)
    ar = Collective("all_reduce", "float32", 100, 400, None, 4)
    assert comm.ring_bytes(ag) == comm.ring_bytes(rs) == 300
    assert comm.ring_bytes(ar) == 600
    assert comm.gloo_bytes(rs) == 600  # gloo: reduce-scatter runs as a full all-reduce
    assert comm.gloo_bytes(ag) == 300
    assert comm.ring_bytes(ar, world_size=2) == 400


@pytest.mark.parametrize("row", comm.PUBLISHED_BUS_BANDWIDTH, ids=lambda r: r.source.rsplit("/", 3)[-3]
                         + "#" + r.source.rsplit("/", 1)[-1])
def test_bus_bandwidth_is_within_the_stated_factor_of_published_nccl_tests(row):
    """The model prices links at their nominal rate: never below what nccl-tests measured, and at
    most BUSBW_FACTOR above it."""
    n = row.nodes * row.topology.gpus_per_node
    predicted = comm.bus_bandwidth(row.topology, n, algorithm=row.algorithm)
    assert row.low <= predicted <= comm.BUSBW_FACTOR * row.high, (predicted / 1e9, row.what)


def test_inter_node_traffic_is_shared_by_all_nics_not_one():
    """The fault issue 12 found: pricing every ring hop at one NIC's rate. Across 2 nodes of 8 H100
    the ring runs at the NICs' combined rate (8 x 50 GB/s), not at 50 GB/s; one NIC per node would
    be the per-NIC rate, and a published 2-node figure rejects it."""
    assert comm.bus_bandwidth(H100_NODE, 16) == 400e9
    assert comm.bus_bandwidth(H100_NODE, 8) == 450e9  # one node: NVLink
    one_nic = Topology("one NIC", 8, 450e9, 1, 50e9)
    assert comm.bus_bandwidth(one_nic, 16) == 50e9
    published = next(r for r in comm.PUBLISHED_BUS_BANDWIDTH if r.nodes == 2 and r.topology is H100_NODE)
    assert not published.low <= comm.bus_bandwidth(one_nic, 16) <= comm.BUSBW_FACTOR * published.high


def test_groups_that_share_a_node_share_its_nics():
    # HSDP's replicate groups: one rank per node, 8 groups per node -> each gets one NIC's rate
    assert comm.ranks_per_node(4, H100_NODE, stride=8) == 1
    assert comm.bus_bandwidth(H100_NODE, 4, stride=8) == 50e9
    # groups of 2 ranks, 4 apart: within a node (2 per node), over NVLink
    assert comm.ranks_per_node(2, H100_NODE, stride=4) == 2
    assert comm.bus_bandwidth(H100_NODE, 2, stride=4) == 450e9
    with pytest.raises(ValueError, match="tile nodes"):
        comm.ranks_per_node(12, H100_NODE)


def test_a_strided_group_has_fewer_ranks_per_node():
    """4 ranks, 4 apart, on 8-GPU nodes: 2 per node (ranks 0 and 4), not 4."""
    assert comm.ranks_per_node(4, H100_NODE, stride=4) == 2
    assert comm.ranks_per_node(16, H100_NODE, stride=2) == 4
    # 16 ranks, 2 apart: 4 per node over 4 nodes, each group's share of a node's NICs is 4/8
    node = H100_NODE
    share = node.nics_per_node * node.nic_bytes_per_s * 4 / node.gpus_per_node
    assert comm.bus_bandwidth(node, 16, stride=2) == min(node.nvlink_bytes_per_s, share)
    assert comm.bus_bandwidth(node, 16, stride=2) == comm.bus_bandwidth(node, 16) / 2


def test_hierarchical_all_reduce_beats_the_ring_on_two_nodes_only():
    ring = comm.bus_bandwidth(H100_NODE, 16)
    two = comm.bus_bandwidth(H100_NODE, 16, algorithm="hierarchical")
    many = comm.bus_bandwidth(H100_NODE, 8 * 64, algorithm="hierarchical")
    assert two > ring  # half the inter-node bytes on two nodes: busbw above the NICs' rate
    assert many == pytest.approx(ring, rel=0.02)  # the advantage vanishes with many nodes


def test_collective_seconds_is_latency_plus_bytes_over_bus_bandwidth():
    ag = Collective("all_gather", "bfloat16", 10**9, 2 * 10**9, None, 16)
    seconds = comm.collective_seconds(ag, H100_NODE)
    bandwidth = 15 / 16 * 2e9 / 400e9
    latency = 8.4e-6 + 14 * 3.4e-6 + 1 * 14e-6  # 15 ring steps, one of them between the nodes
    assert seconds == pytest.approx(bandwidth + latency)
    assert comm.collective_seconds(Collective("all_gather", "bfloat16", 8, 16, None, 1), H100_NODE) == 0
    ar = Collective("all_reduce", "float32", 10**9, 4 * 10**9, None, 16)
    assert comm.step_seconds([ar], H100_NODE) == pytest.approx(
        comm.collective_seconds(ar, H100_NODE, algorithm="hierarchical"))  # the faster one


def test_compute_seconds():
    assert comm.compute_seconds(10, 5, 300, 0.5) == pytest.approx(2.0)
    assert comm.compute_seconds(10, 5, 300, 0.5, recompute=True) == pytest.approx(8 / 3)
    # torchtitan's count: 6 per parameter + 12 * layers * hidden * seq_len per token.
    flops = comm.model_flops_per_token(10, 2, 3, 4)
    assert flops == 6 * 10 + 12 * 2 * 3 * 4
    assert comm.compute_seconds(10, 5, 300, 0.5, flops_per_token=flops) == pytest.approx(
        flops * 5 / 150)
    assert comm.compute_seconds(10, 5, 300, 0.5, True, flops_per_token=flops) == pytest.approx(
        flops * 5 / 150 * 4 / 3)


_AG = Collective("all_gather", "float32", 4, 16, None, 16)


@pytest.mark.parametrize("call, message", [
    (lambda: Topology("x", 8, 0, 8, 1.0),
     r"Topology 'x': nvlink_bytes_per_s must be positive, got 0"),
    (lambda: Topology("x", 8, 1.0, 8, 0.0),
     r"Topology 'x': nic_bytes_per_s must be positive, got 0.0"),
    (lambda: Topology("x", 0, 1.0, 8, 1.0), r"gpus_per_node must be a positive integer, got 0"),
    (lambda: Topology("x", 8, 1.0, 0, 1.0), r"nics_per_node must be a positive integer, got 0"),
    (lambda: comm.compute_seconds(1, 1, 1, 1.5), r"fraction_of_peak must be in \(0, 1\], got 1.5"),
    (lambda: comm.compute_seconds(1, 1, 1, 0), r"fraction_of_peak must be in \(0, 1\], got 0"),
    (lambda: comm.compute_seconds(1, 1, 1, 0.5, flops_per_token=0),
     r"flops_per_token must be positive, got 0"),
    (lambda: comm.compute_seconds(0, 1, 1, 0.5), r"n_params must be positive, got 0"),
    (lambda: comm.compute_seconds(1, 0, 1, 0.5), r"tokens must be positive, got 0"),
    (lambda: comm.compute_seconds(1, 1, 0, 0.5), r"peak_flops must be positive, got 0"),
    (lambda: comm.model_flops_per_token(0, 1, 1, 1), r"n_params must be positive, got 0"),
    (lambda: comm.model_flops_per_token(1, 0, 1, 1), r"layers must be positive, got 0"),
    (lambda: comm.model_flops_per_token(1, 1, 0, 1), r"hidden must be positive, got 0"),
    (lambda: comm.model_flops_per_token(1, 1, 1, 0), r"seq_len must be positive, got 0"),
    (lambda: comm.bus_bandwidth(H100_NODE, 16, algorithm="tree?"),
     r"unknown algorithm 'tree\?'; choose 'ring' or 'hierarchical'"),
    (lambda: comm.collective_seconds(_AG, H100_NODE, algorithm="hierarchical"),
     r"the hierarchical algorithm prices all-reduces, not all_gather"),
    (lambda: comm.ring_bytes(Collective("all_gather", "float32", 4, 16, None, 0)),
     r"world_size must be a positive integer \(the ranks the collective spans\), got 0"),
    (lambda: comm.ranks_per_node(0, H100_NODE),
     r"group_size must be a positive integer \(ranks in the group\), got 0"),
    (lambda: comm.ranks_per_node(4, H100_NODE, stride=0),
     r"stride must be a positive integer \(distance between consecutive ranks of the group\)"),
    (lambda: comm.ranks_per_node(12, H100_NODE), r"a group of 12 ranks 1 apart does not tile nodes "
     r"of 8 GPUs evenly; choose sizes that divide, or are multiples of, the node\."),
    # 3 does not divide 8: the group of ranks 6 and 9 straddles two nodes
    (lambda: comm.ranks_per_node(2, H100_NODE, stride=3), r"2 ranks 3 apart does not tile nodes"),
])
def test_bad_input_is_a_value_error(call, message):
    """The error names the argument, the value and the fix."""
    with pytest.raises(ValueError, match=message):
        call()


def test_smallest_valid_inputs_are_accepted():
    """1 is a valid count and rate everywhere (the checks are > 0, not > 1)."""
    tiny = Topology("tiny", 1, 1.0, 1, 1.0)
    assert (tiny.gpus_per_node, tiny.nvlink_bytes_per_s, tiny.nic_bytes_per_s) == (1, 1.0, 1.0)
    assert comm.model_flops_per_token(1, 1, 1, 1) == 6 + 12
    assert comm.compute_seconds(1, 1, 1, 1.0) == 6  # all of the peak is allowed
    assert comm.compute_seconds(1, 1, 1, 1.0, flops_per_token=1) == 1


def test_dgx_nodes_are_the_datasheets():
    """H100_NODE and A100_NODE are built once, at import: build them again here (so a bug in the
    builder shows) and compare with the datasheets: 8 GPUs, NVLink 900 / 600 GB/s bidirectional,
    8 NICs of 400 / 200 Gb/s, named as datasheets quote them."""
    h100, a100 = cost._dgx("H100"), cost._dgx("A100")
    assert h100 == Topology("8 × H100 SXM, 8 × 400 Gb/s NICs", 8, 450e9, 8, 50e9)
    assert a100 == Topology("8 × A100 SXM, 8 × 200 Gb/s NICs", 8, 300e9, 8, 25e9)
    assert (h100, a100) == (H100_NODE, comm.A100_NODE)


def test_ranks_per_node_is_an_int():
    """A count of ranks: usable as one (a range, a list size), not 2.0."""
    assert list(range(comm.ranks_per_node(4, H100_NODE, stride=4))) == [0, 1]
    assert list(range(comm.ranks_per_node(16, H100_NODE, stride=2))) == [0, 1, 2, 3]


def test_gloo_bytes_honours_world_size():
    rs = Collective("reduce_scatter", "float32", 100, 400, None, 4)
    assert comm.gloo_bytes(rs, world_size=2) == 2 * (2 - 1) / 2 * 400  # as an all-reduce over 2


def test_hierarchical_bus_bandwidth_is_the_slower_stage():
    """Reduce-scatter and all-gather inside the node (2(r-1)/r of the buffer over NVLink),
    all-reduce between nodes of 1/r of it (2(q-1)/q of that at the GPU's share of the NICs): the
    slower stage sets the time; bus bandwidth is 2(N-1)/N of the buffer over that time."""
    # 2 DGX H100 nodes (r = 8, q = 2): NVLink is the slower stage
    intra = 2 * 7 / 8 / 450e9
    inter = 2 * 1 / 2 / 8 / 50e9
    assert intra > inter
    assert comm.bus_bandwidth(H100_NODE, 16, algorithm="hierarchical") == pytest.approx(
        2 * 15 / 16 / intra)  # 482 GB/s: above the NICs' 400, as nccl-tests reports for NCCL's tree
    # one slow NIC for 4 GPUs: the inter-node stage is the slower, on 2 and on 4 nodes
    slow = Topology("slow NIC", 4, 1000e9, 1, 10e9)
    per_gpu = 10e9 / 4
    for nodes in (2, 4):
        n = 4 * nodes
        inter = 2 * (nodes - 1) / nodes / 4 / per_gpu
        assert inter > 2 * 3 / 4 / 1000e9
        assert comm.bus_bandwidth(slow, n, algorithm="hierarchical") == pytest.approx(
            2 * (n - 1) / n / inter)
    assert comm.bus_bandwidth(slow, 8, algorithm="hierarchical") == pytest.approx(17.5e9)
    assert comm.bus_bandwidth(slow, 8) == 10e9  # the ring: the node's one NIC


def test_latency_is_nccls_tuning_model():
    """NCCL's tuning.cc (Simple protocol): ring: base + one step per ring hop, the hops between
    nodes at the network's latency; tree: base + 2 ((ppn - 1) NVLink steps + log2(nodes) network
    steps). 8.4 us base, 3.4 us per NVLink step, 14 us per network step. The message (4 MB) is
    sized so that latency and bandwidth terms are comparable: both must be right."""
    base, nvlink, network = 8.4e-6, 3.4e-6, 14e-6
    size = 4 * 10**6
    # ring all-reduce over 4 nodes: 2 x 31 steps, 2 x 3 of them between nodes
    ar = Collective("all_reduce", "float32", size // 4, size, None, 32)
    assert comm.collective_seconds(ar, H100_NODE) == pytest.approx(
        base + 56 * nvlink + 6 * network + 2 * 31 / 32 * size / 400e9, rel=1e-9)
    # HSDP's replicate group: 4 ranks 16 apart, one per node: every step crosses nodes, and the
    # node's 8 groups share its 8 NICs
    ar = Collective("all_reduce", "float32", size // 4, size, None, 4)
    assert comm.collective_seconds(ar, H100_NODE, stride=16) == pytest.approx(
        base + 6 * network + 2 * 3 / 4 * size / 50e9, rel=1e-9)
    # the tree on 2 and 4 nodes: log2(nodes) network steps each way, at the tree's bus bandwidth
    for nodes in (2, 4):
        n = 8 * nodes
        ar = Collective("all_reduce", "float32", size // 4, size, None, n)
        busbw = comm.bus_bandwidth(H100_NODE, n, algorithm="hierarchical")
        assert busbw > 480e9  # not the ring's 400 GB/s
        assert comm.collective_seconds(ar, H100_NODE, algorithm="hierarchical") == pytest.approx(
            base + 2 * (7 * nvlink + math.log2(nodes) * network) + 2 * (n - 1) / n * size / busbw,
            rel=1e-9)
    # two ranks of one node: one NVLink step, not free
    ag = Collective("all_gather", "float32", size // 4, size, None, 2)
    assert comm.collective_seconds(ag, H100_NODE) == pytest.approx(
        base + nvlink + size / 2 / 450e9, rel=1e-9)


def test_step_seconds_adds_each_collective_at_its_own_price():
    """All-gathers and reduce-scatters on the ring; all-reduces at the faster of ring and tree; a
    group of one costs nothing."""
    ag = Collective("all_gather", "bfloat16", 10**8, 2 * 10**8, None, 16)
    ar = Collective("all_reduce", "float32", 10**8, 4 * 10**8, None, 16)
    rs = Collective("reduce_scatter", "float32", 10**8, 4 * 10**8, None, 16)
    alone = Collective("all_reduce", "float32", 10**8, 4 * 10**8, None, 1)
    ar_best = min(comm.collective_seconds(ar, H100_NODE, algorithm=a)
                  for a in ("ring", "hierarchical"))
    assert comm.step_seconds([ag, ar, rs, alone], H100_NODE) == pytest.approx(
        comm.collective_seconds(ag, H100_NODE) + ar_best + comm.collective_seconds(rs, H100_NODE))
    assert comm.step_seconds([alone], H100_NODE) == 0


def test_hsdp_all_reduce_is_priced_on_the_replicate_groups():
    """HSDP's cross-replica all-reduce spans one rank per shard group: with shard groups of a node
    or more, every rank of it is on another node, and the node's 8 groups share its 8 NICs."""
    groups = [comm.FSDPGroup(((16384, 4096),))]  # 256 MiB in fp32: bandwidth, not latency
    step = comm.hsdp_step(groups, shard_size=16, replicas=4)
    reduce = [c for c in step if c.kind == "all_reduce"]
    assert [c.group_size for c in reduce] == [4]
    strided = comm.step_seconds(reduce, H100_NODE, all_reduce_stride=16)
    assert strided == pytest.approx(min(
        comm.collective_seconds(reduce[0], H100_NODE, 16, algorithm)
        for algorithm in ("ring", "hierarchical")))
    assert comm.bus_bandwidth(H100_NODE, 4, stride=16) == 50e9
    # priced as if the 4 ranks were consecutive (one node, NVLink) it would be far cheaper: wrong
    assert comm.step_seconds(reduce, H100_NODE) < strided / 5
