"""fit-failures recovers known laws from synthetic data and the README's figures from the
shipped records."""
import math

import numpy as np
import pytest

from sim.errors import SimError
from sim.failures import FailureModel
from sim.fitting import cofailures, fit_gaps, fit_record
from sim.nodes import NodeFailures
from sim.records import NodeRecord, read_lanl, read_philly

HOUR = 3600.0


def test_weibull_shape_and_scale_are_recovered_within_their_interval():
    rng = np.random.default_rng(0)
    gaps = 5000.0 * rng.weibull(0.6, 4000)
    fit = fit_gaps(gaps)
    assert fit.weibull_shape_low < 0.6 < fit.weibull_shape_high
    assert fit.weibull_shape == pytest.approx(0.6, abs=0.02)
    assert fit.weibull_scale_s == pytest.approx(5000.0, rel=0.05)
    rate = HOUR / (5000.0 * math.gamma(1 + 1 / 0.6))
    assert fit.rate_per_h_low < rate < fit.rate_per_h_high
    assert fit.better == "weibull" and fit.lr_p < 1e-6
    assert fit.ks_weibull < fit.ks_exponential and fit.ks_weibull_p > 0.01


def test_exponential_gaps_are_not_called_weibull():
    fit = fit_gaps(np.random.default_rng(1).exponential(100.0, 3000))
    assert fit.weibull_shape_low < 1.0 < fit.weibull_shape_high
    assert fit.better == "exponential" and fit.lr_p > 0.05 and fit.ks_exponential_p > 0.05


def test_the_shape_interval_covers_the_true_shape_about_95_percent_of_the_time():
    """400 samples of 300 gaps at shape 0.7: coverage within 91.7-98.3% (binomial, 3 standard
    errors of 95% at 400 samples is +-3.3%); an interval 1.28 times too wide covers 98.8%."""
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(400):
        fit = fit_gaps(rng.weibull(0.7, 300))
        hits += fit.weibull_shape_low < 0.7 < fit.weibull_shape_high
    assert 367 <= hits <= 393, hits


def test_a_synthetic_record_gives_back_its_node_law():
    """200 Weibull-0.7 nodes of 1,000 h over 50,000 h (about 10,000 failures): fit-failures
    finds the node MTBF and shape it was drawn with, and a system whose gaps are near
    exponential (the superposition)."""
    model = NodeFailures(nodes=200, node_law=FailureModel(kind="weibull", shape=0.7),
                         node_mtbf_s=1000 * HOUR)
    events = model.draw(np.random.default_rng(4), 50_000 * HOUR)
    record = NodeRecord(name="synthetic", nodes=200, times_s=events.times_s,
                        node=events.first_node, span_s=50_000 * HOUR, attribution="drawn here")
    fit = fit_record(record)
    low, high = fit.summary["node_rate_per_h_low"], fit.summary["node_rate_per_h_high"]
    assert low < 1 / 1000 < high
    node = fit.fits["node gaps"]
    assert node.weibull_shape_low < 0.7 < node.weibull_shape_high
    assert fit.fits["system"].weibull_shape > 0.9
    assert fit.extra["cofailures"]["shared_failures"] == 0


def test_cofailures_count_failures_within_the_window():
    record = NodeRecord(name="r", nodes=8, times_s=[0.0, 120.0, 120.0, 120.0, 300.0, 360.0, 900.0],
                        node=[0, 1, 2, 3, 4, 5, 6], span_s=1000.0, attribution="test")
    same = cofailures(record)
    assert same["resolution_s"] == 60.0 and same["shared_failures"] == 3
    assert same["largest"] == 3 and same["events_by_size"] == {1: 4, 3: 1}
    assert same["expected_share"] == pytest.approx(-math.expm1(-7 / 1000 * 60))
    wide = cofailures(record, 60.0)
    assert wide["shared_failures"] == 5 and wide["events"] == 4
    with pytest.raises(SimError, match="zero or more"):
        cofailures(record, -1.0)


def test_lanl_system_18_fit_matches_the_readme():
    """README: Weibull shape 0.5-0.9 of a system's gaps; 2.7-5.8% of a big system's failures
    share their start minute with another node's, at most 6 nodes."""
    fit = fit_record(read_lanl(system=18))
    assert 0.5 < fit.fits["system"].weibull_shape < 0.9
    co = fit.extra["cofailures"]
    assert co["share"] == pytest.approx(147 / 3997) and co["largest"] == 6
    assert co["share"] > 10 * co["expected_share"]          # not chance: correlated
    assert fit.summary["system_mtbf_h"] == pytest.approx(7.335, abs=0.001)
    out = fit.to_dict()
    assert "Los Alamos" in out["attribution"] and "Los Alamos" in fit.text().splitlines()[-1]


def test_philly_fit_by_job_size():
    fit = fit_record(read_philly())
    assert {"gpus=4", "gpus=8", "gpus=16", "gpus=32"} == set(fit.fits)
    assert fit.fits["gpus=4"].gaps == 667
    assert fit.extra["restart_gap"]["median_s"] == 186 and fit.extra["restart_gap"]["p90_s"] == 1575
    assert "CC-BY-4.0" in fit.to_dict()["attribution"]


@pytest.mark.parametrize("gaps,match", [(np.ones(5), "too few"), (np.r_[np.ones(20), 0.0], "positive"),
                                        (np.ones(20), "same length")])
def test_bad_gaps(gaps, match):
    with pytest.raises(SimError, match=match):
        fit_gaps(gaps)


def test_a_small_record_fits_what_it_can(tmp_path):
    """12 failures on 12 nodes: the system's 11 gaps fit, no node failed twice."""
    record = NodeRecord(name="small", nodes=12, times_s=np.cumsum(np.arange(1.0, 13.0)) * 60,
                        node=np.arange(12), span_s=1e5, attribution="test")
    assert set(fit_record(record).fits) == {"system"}
    few = NodeRecord(name="few", nodes=3, times_s=[0.0, 60.0, 300.0], node=[0, 1, 2], span_s=1e3,
                     attribution="test")
    with pytest.raises(SimError, match="too few"):
        fit_record(few)
