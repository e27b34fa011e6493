"""Recovery at scale: detection per event, the spare pool over time, restart growth."""
import math

import numpy as np
import pytest

from sim import SimError
from sim.recovery import RECOVERY_FIGURES, RecoveryModel

RNG = np.random.default_rng


def test_every_default_has_a_source():
    model = RecoveryModel()
    for name, figure in RECOVERY_FIGURES.items():
        assert getattr(model, name) == figure.value
        assert figure.source in ("published", "derived") and len(figure.method) > 40


def test_detection_hangs_pay_the_timeout():
    model = RecoveryModel(hang_share=0.25)
    d = model.downtime(np.arange(1.0, 40001.0), np.ones(40000, dtype=int), 4, RNG(0))
    hangs = d.detection_s == model.hang_timeout_s
    assert set(np.unique(d.detection_s)) == {model.hang_timeout_s, model.crash_detect_s}
    assert abs(hangs.mean() - 0.25) < 0.01
    assert d.detection_s.mean() == pytest.approx(model.mean_detection_s, rel=0.02)


def test_unlimited_spares_cost_host_selection_only():
    d = RecoveryModel().downtime(np.array([1.0, 2.0]), np.array([1, 16]), 2048, RNG(0))
    np.testing.assert_array_equal(d.reschedule_s, [180.0, 180.0])


def test_no_spare_waits_for_repair_and_the_pool_refills():
    model = RecoveryModel(spares=2, repair_s=1000.0, host_selection_s=10.0)
    # t=0 takes both spares; t=100 finds none: waits until t=0's nodes are back (t=1000);
    # t=5000: the repaired nodes refilled the pool
    d = model.downtime(np.array([0.0, 100.0, 5000.0]), np.array([2, 1, 2]), 64, RNG(0))
    np.testing.assert_allclose(d.reschedule_s, [10.0, 10.0 + 900.0, 10.0])


def test_a_rack_takes_more_spares_than_the_pool_holds():
    model = RecoveryModel(spares=4, repair_s=1000.0, host_selection_s=10.0)
    d = model.downtime(np.array([0.0]), np.array([8]), 64, RNG(0))
    # 4 from the pool; the other 4 are the event's own nodes, back after repair
    np.testing.assert_allclose(d.reschedule_s, [1010.0])
    # the pool is empty at t=500 (t=0 took it): the rack's 8 nodes wait for t=0's 4 (back
    # at 1000) and 4 of its own (back at 1500)
    d = model.downtime(np.array([0.0, 500.0]), np.array([4, 8]), 64, RNG(0))
    np.testing.assert_allclose(d.reschedule_s, [10.0, 1010.0])


def test_shrink_charges_the_missing_capacity():
    model = RecoveryModel(spares=0, repair_s=1000.0, host_selection_s=10.0, no_spare="shrink")
    d = model.downtime(np.array([0.0]), np.array([2]), 100, RNG(0))
    np.testing.assert_allclose(d.reschedule_s, [10.0 + 2 * 1000.0 / 100])


def test_a_partial_pool_charges_only_the_nodes_it_could_not_replace():
    """The pool's spares go first; waiting or shrinking is charged only for the rest."""
    kw = dict(spares=1, repair_s=1000.0, host_selection_s=10.0)
    times, lost = np.array([0.0, 400.0]), np.array([3, 1])
    wait = RecoveryModel(**kw).downtime(times, lost, 100, RNG(0))
    # t=0: one spare, two nodes back at 1000; t=400: the pool is empty, waits for t=0's third
    np.testing.assert_array_equal(wait.reschedule_s, [10.0 + 1000.0, 10.0 + 600.0])
    shrink = RecoveryModel(**kw, no_spare="shrink").downtime(times, lost, 100, RNG(0))
    np.testing.assert_array_equal(shrink.reschedule_s, [10.0 + 2 * 1000.0 / 100, 10.0 + 600.0 / 100])


def test_restart_grows_with_log2_of_nodes():
    model = RecoveryModel()
    assert model.restart_s(30.0, 1) == 30.0
    assert model.restart_s(30.0, 2048) == pytest.approx(30.0 + 2.59 * 11)
    assert math.isclose(model.restart_s(30.0, 16) - model.restart_s(30.0, 1), 41.674 - 31.316,
                        rel_tol=1e-3)


@pytest.mark.parametrize("kwargs,match", [({"hang_share": 1.5}, "share"),
                                          ({"spares": -1}, "spares"),
                                          ({"no_spare": "pray"}, "no_spare"),
                                          ({"repair_s": -1.0}, "repair_s")])
def test_bad_figures_say_the_fix(kwargs, match):
    with pytest.raises(SimError, match=match):
        RecoveryModel(**kwargs)
