"""GEMINI's replicas and a failure: sim.placement."""
import pytest

from sim.placement import HOST_LOSS_SHARE, PeerPlacement, PlacementError


def test_gemini_peer_loss_follows_the_placement():
    one_server = PeerPlacement(same_host=True)
    assert one_server.loss_probability == HOST_LOSS_SHARE == pytest.approx(32 / 419)
    apart = PeerPlacement(same_host=False, window_s=60.0, node_mtbf_s=6.0e5)
    assert apart.loss_probability == pytest.approx(HOST_LOSS_SHARE * 1e-4)
    rack = PeerPlacement(same_host=False, window_s=60.0, node_mtbf_s=6.0e5, domain_share=0.5)
    assert rack.loss_probability == pytest.approx(HOST_LOSS_SHARE * (0.5 + 1e-4))
    assert PeerPlacement(same_host=False).loss_probability == 0
    with pytest.raises(PlacementError, match="share"):
        PeerPlacement(same_host=True, host_loss_share=1.5)
