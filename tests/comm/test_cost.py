"""guide.comm.cost: bytes per rank, and the hierarchical time model checked against published
nccl-tests bus bandwidths (:data:`guide.comm.PUBLISHED_BUS_BANDWIDTH`)."""

from __future__ import annotations

import pytest

from guide import comm
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


@pytest.mark.parametrize("call", [
    lambda: Topology("x", 8, 0, 8, 1.0),
    lambda: Topology("x", 0, 1.0, 8, 1.0),
    lambda: comm.compute_seconds(1, 1, 1, 1.5),
    lambda: comm.compute_seconds(1, 1, 1, 0.5, flops_per_token=0),
    lambda: comm.model_flops_per_token(1, 0, 1, 1),
    lambda: comm.bus_bandwidth(H100_NODE, 16, algorithm="tree?"),
    lambda: comm.collective_seconds(Collective("all_gather", "float32", 4, 16, None, 16), H100_NODE,
                                    algorithm="hierarchical"),
    lambda: comm.ring_bytes(Collective("all_gather", "float32", 4, 16, None, 0)),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


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
