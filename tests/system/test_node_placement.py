"""Multi-node placement: the workers of one replica (tensor-parallel ranks, pipeline stages) are
packed on one node by a Ray placement group, and gloo / NCCL open their sockets on the interface
that carries the address the peers reach."""

from __future__ import annotations

import pytest

from realrl.api.core.layout import Layout, Placement, node_groups
from realrl.base.network import interface_of
from realrl.system.launcher import RayLauncher


def test_a_replicas_ranks_and_stages_share_a_node_in_every_layout_they_meet():
    tp = Placement(Layout(1, 2, 1), (0, 1))  # actor home: one replica over workers 0 and 1
    dp = Placement(Layout(2, 1, 1), (2, 3))  # critic: two replicas, apart
    pp = Placement(Layout(1, 1, 2), (3, 4))  # a copy in two stages joins 3 and 4
    assert node_groups([tp, dp, pp], 6) == [[0, 1], [2], [3, 4], [5]]
    chained = Placement(Layout(1, 2, 1), (1, 2))  # shares worker 1 with tp: one node for 0, 1, 2
    assert node_groups([tp, chained], 3) == [[0, 1, 2]]
    assert node_groups([Placement(Layout(2, 2, 1), (0, 1, 2, 3))], 4) == [[0, 1], [2, 3]]


def test_the_interface_is_the_one_carrying_the_peers_address():
    addresses = {"docker0": "172.17.0.1", "eth0": "10.0.0.7", "lo": "127.0.0.1"}
    assert interface_of("10.0.0.7", addresses) == "eth0"
    assert interface_of("10.0.0.8", addresses) is None  # not this node's: the libraries choose
    assert interface_of("127.0.0.1") == "lo"  # read from this machine's interfaces


def test_ray_packs_each_group_in_a_placement_group_and_names_one_that_cannot_fit(tmp_path, ray_cluster):
    ray = ray_cluster
    launcher = RayLauncher(str(tmp_path), b"s", cpus_per_worker=1.0, node_groups=[[0, 1], [2]], timeout=30)
    try:
        where = launcher._place()
        assert sorted(where) == [0, 1, 2] and len(launcher.placement_groups) == 2
        assert where[0].placement_group == where[1].placement_group != where[2].placement_group
        assert [where[w].placement_group_bundle_index for w in (0, 1, 2)] == [0, 1, 0]
    finally:
        launcher.stop()
    assert launcher.placement_groups == []
    cluster_cpus = int(ray.cluster_resources()["CPU"])
    too_big = RayLauncher(str(tmp_path), b"s", node_groups=[list(range(cluster_cpus + 1))], timeout=1)
    with pytest.raises(RuntimeError, match=r"must share a node .* no node of the Ray cluster had room"):
        too_big.start([])
    assert too_big.placement_groups == []  # removed again
