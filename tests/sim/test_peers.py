"""GEMINI's peer copy: lost exactly when the event takes a node and its peer."""
import numpy as np
import pytest

from sim.placement import HOST_LOSS_SHARE
from sim import SimError
from sim.peers import ReplicaPlacement

RNG = np.random.default_rng(0)


def test_cross_rack_survives_a_rack_but_not_a_switch_over_two_racks():
    place = ReplicaPlacement(nodes=64, rack_nodes=8, kind="cross-rack")
    lost = place.lost(np.array([0, 8, 0, 16, 5]), np.array([8, 8, 16, 16, 1]), RNG)
    np.testing.assert_array_equal(lost, [False, False, True, True, False])


def test_group_placement_loses_a_rack_holding_both():
    place = ReplicaPlacement(nodes=64, rack_nodes=8, kind="group")
    lost = place.lost(np.array([0, 3, 4]), np.array([8, 1, 2]), RNG)
    np.testing.assert_array_equal(lost, [True, False, True])


def test_every_node_has_another_node_as_peer():
    for kind in ("cross-rack", "group"):
        for nodes in (2, 3, 9, 64):
            peers = ReplicaPlacement(nodes=nodes, rack_nodes=4, kind=kind).peers()
            assert (peers != np.arange(nodes)).all() and (peers < nodes).all()


def test_one_node_loses_the_copy_with_the_hosts_memory():
    lost = ReplicaPlacement(nodes=1).lost(np.zeros(40000, dtype=int), np.ones(40000, dtype=int),
                                          np.random.default_rng(1))
    assert abs(lost.mean() - HOST_LOSS_SHARE) < 0.005


def test_events_outside_the_job_are_refused():
    with pytest.raises(SimError, match="within the job"):
        ReplicaPlacement(nodes=8).lost(np.array([7]), np.array([2]), RNG)
    with pytest.raises(SimError, match="placement"):
        ReplicaPlacement(nodes=8, kind="random")
