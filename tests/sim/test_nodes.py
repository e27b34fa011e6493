"""A job of N nodes: superposed node processes, failure domains, common random numbers.

Statistical tests use fixed seeds; each states its tolerance in standard errors."""
import math

import numpy as np
import pytest
from scipy import stats

from sim import Scenario, simulate
from sim.errors import SimError
from sim.failures import FailureModel
from sim.nodes import DOMAINS, Domain, FailureEvents, NodeFailures
from sim.records import NodeRecord

HOUR = 3600.0
WEIBULL = FailureModel(kind="weibull", shape=0.7)


def _gaps(model: NodeFailures, horizon: float, seeds: int = 1) -> np.ndarray:
    return np.concatenate([np.diff(model.draw(np.random.default_rng(s), horizon).times_s)
                           for s in range(seeds)])


def test_superposed_exponential_nodes_have_job_mtbf_node_over_n():
    """100 nodes of 1,000 h over 20 seeds of 2,000 h: about 4,000 failures, Poisson, so the
    count's relative standard error is 1.6%; the tolerance, 5%, is three of them."""
    model = NodeFailures(nodes=100, node_mtbf_s=1000 * HOUR)
    assert model.job_mtbf_s() == pytest.approx(10 * HOUR)
    counts = [len(model.draw(np.random.default_rng(s), 2000 * HOUR)) for s in range(20)]
    assert 2000 * HOUR * 20 / sum(counts) == pytest.approx(10 * HOUR, rel=0.05)
    # the gaps of a superposition of exponentials are exponential (mean node / N)
    gaps = _gaps(model, 2000 * HOUR, seeds=5)
    assert stats.kstest(gaps, stats.expon(scale=10 * HOUR).cdf).pvalue > 0.01


def test_weibull_nodes_are_stationary_no_burst_at_the_start():
    """Nodes in service (forward recurrence first): a Weibull-0.7 job's first tenth fails at
    the same rate as the whole (nodes all new at 0 would fail about twice as often there).
    1,000 nodes x 30 seeds: about 3,000 failures in the first tenth, 5% is 2.7 errors."""
    model = NodeFailures(nodes=1000, node_law=WEIBULL, node_mtbf_s=1000 * HOUR)
    early = sum(int((model.draw(np.random.default_rng(s), 100 * HOUR).times_s < 100 * HOUR).sum())
                for s in range(30))
    assert early / 30 == pytest.approx(100 * HOUR / model.job_mtbf_s(), rel=0.05)


def test_superposed_weibull_nodes_are_not_a_weibull_job():
    """One Weibull-0.7 node's gaps have CV 1.46 and fit shape 0.7; 1,024 such nodes give a
    job whose gaps tend to exponential (Palm-Khintchine): CV near 1, fitted shape near 1,
    and the node's shape rejected."""
    shapes, cvs = [], []
    for n in (1, 16, 1024):
        model = NodeFailures(nodes=n, node_law=WEIBULL, node_mtbf_s=1000 * HOUR)
        gaps = _gaps(model, 20_000 * model.job_mtbf_s())         # about 20,000 gaps
        cvs.append(gaps.std() / gaps.mean())
        shapes.append(stats.weibull_min.fit(gaps, floc=0)[0])
    print("fitted shapes", shapes, "CVs", cvs)
    assert shapes[0] == pytest.approx(0.7, abs=0.03)
    assert cvs[0] == pytest.approx(WEIBULL.coefficient_of_variation, rel=0.1)
    assert shapes[0] < shapes[1] < shapes[2] and cvs[0] > cvs[1] > cvs[2]
    assert shapes[2] > 0.9 and cvs[2] < 1.1
    scale = gaps.mean() / math.gamma(1 + 1 / 0.7)       # the node's shape, at the job's mean
    assert stats.kstest(gaps, stats.weibull_min(0.7, scale=scale).cdf).pvalue < 1e-6


def test_domains_add_their_rate_and_nodes_lost():
    """100 nodes span 4 racks of 32 (the last holds 4 nodes); each rack fails every 500 h."""
    rack = Domain(name="rack", size=32, mtbf_s=500 * HOUR, source="test")
    model = NodeFailures(nodes=100, node_mtbf_s=1000 * HOUR, domains=(rack,))
    assert model.job_mtbf_s() == pytest.approx(1 / (100 / (1000 * HOUR) + 4 / (500 * HOUR)))
    events = [model.draw(np.random.default_rng(s), 5000 * HOUR) for s in range(10)]
    racks = np.concatenate([e.domain for e in events]) == DOMAINS.index("rack")
    lost = np.concatenate([e.nodes_lost for e in events])
    first = np.concatenate([e.first_node for e in events])
    # 40 expected rack events a seed x 10 = 400, standard error 5%: within 15%
    assert racks.sum() == pytest.approx(400, rel=0.15)
    assert set(lost[racks]) == {32, 4} and set(first[racks]) <= {0, 32, 64, 96}
    assert set(lost[~racks]) == {1} and (lost[first == 96] <= 4).all()
    assert len(events[0]) == pytest.approx(5000 * HOUR / model.job_mtbf_s(), rel=0.15)
    # without the domain: the same node failures (their own streams), minus the racks'
    bare = NodeFailures(nodes=100, node_mtbf_s=1000 * HOUR).draw(np.random.default_rng(0), 5000 * HOUR)
    np.testing.assert_array_equal(bare.times_s, events[0].times_s[~racks[: len(events[0])]])


def test_same_seed_same_events_and_a_bigger_job_contains_a_smaller():
    """Common random numbers: node i's failures depend on the seed and i only, not on the
    job's size or the horizon; and an MTBF rescales the same events."""
    small = NodeFailures(nodes=100, node_law=WEIBULL, node_mtbf_s=100 * HOUR)
    big = NodeFailures(nodes=1000, node_law=WEIBULL, node_mtbf_s=100 * HOUR)
    a = small.draw(np.random.default_rng(3), 500 * HOUR)
    b = big.draw(np.random.default_rng(3), 2000 * HOUR)
    mine = b.first_node < 100
    np.testing.assert_array_equal(a.times_s, b.times_s[mine & (b.times_s < 500 * HOUR)])
    c = small.events(np.random.default_rng(3), mtbf_s=2 * small.job_mtbf_s(), window_s=1000 * HOUR)
    np.testing.assert_allclose(c.times_s, 2 * a.times_s)
    np.testing.assert_array_equal(c.first_node, a.first_node)


def test_events_at_one_instant_are_one_event_taking_their_nodes():
    merged = FailureEvents.merge([3.0, 1.0, 3.0, 2.0], [1, 1, 32, 1], [0, 0, 1, 0], [7, 2, 32, 5])
    np.testing.assert_array_equal(merged.times_s, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(merged.nodes_lost, [1, 1, 33])
    assert DOMAINS[merged.domain[2]] == "simultaneous" and merged.first_node[2] == 7


def test_a_record_replays_onto_a_job_keeping_its_cofailures():
    """A 4-node record: node 1 and 3 fail together at 50 s; every seed keeps them together."""
    record = NodeRecord(name="tiny", nodes=4, times_s=[10.0, 50.0, 50.0, 70.0], node=[0, 1, 3, 2],
                        span_s=100.0, attribution="test")
    model = NodeFailures(nodes=4, node_law=record)
    assert model.job_mtbf_s() == pytest.approx(25.0)
    for s in range(5):
        ev = model.draw(np.random.default_rng(s), 300.0)
        assert len(ev) == 9 and ev.nodes_lost.sum() == 12
        assert (ev.nodes_lost[ev.domain == DOMAINS.index("simultaneous")] == 2).all()
    # a job of 6 nodes on a 4-node record: a second copy from another start
    ev = NodeFailures(nodes=6, node_law=record).draw(np.random.default_rng(0), 100.0)
    assert ev.nodes_lost.sum() in (5, 6) and ev.first_node.max() >= 4


def test_scenario_runs_a_job_of_nodes_with_common_random_numbers():
    model = NodeFailures(nodes=64, node_law=WEIBULL, node_mtbf_s=64 * HOUR,
                         domains=(Domain(name="rack", size=16, mtbf_s=200 * HOUR),))
    scenario = Scenario.from_preset("llama-3.2-1b", failures=model, window_s=2 * 86400.0)
    df = simulate(scenario, mtbf_s=None, seeds=3)
    assert df.failures.nunique() == 1 and df.failures.iloc[0] > 0
    assert scenario.to_dict()["failures"]["nodes"] == 64


@pytest.mark.parametrize("kwargs,match", [
    ({"nodes": 0, "node_mtbf_s": 1.0}, "nodes=0"),
    ({"nodes": 4}, "node MTBF"),
    ({"nodes": 4, "node_mtbf_s": -1.0}, "node MTBF"),
    ({"nodes": 4, "node_law": FailureModel.exact_log([1.0]), "node_mtbf_s": 1.0}, "drop --nodes"),
])
def test_bad_node_failures(kwargs, match):
    with pytest.raises(SimError, match=match):
        NodeFailures(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"name": "pdu", "size": 4, "mtbf_s": 1.0}, "rack, switch"),
    ({"name": "rack", "size": 1, "mtbf_s": 1.0}, "at least 2"),
    ({"name": "rack", "size": 4, "mtbf_s": 0.0}, "positive"),
])
def test_bad_domains(kwargs, match):
    with pytest.raises(SimError, match=match):
        Domain(**kwargs)


def test_a_draw_stops_at_its_limit():
    model = NodeFailures(nodes=1000, node_mtbf_s=HOUR)
    with pytest.raises(SimError, match="more than 5,000 failures"):
        model.draw(np.random.default_rng(0), 100 * HOUR, limit=5_000)


def test_a_domain_from_the_command_line():
    rack = Domain.parse("rack:32:3000d")
    assert (rack.name, rack.size, rack.mtbf_s) == ("rack", 32, 3000 * 86400.0)
    assert rack.source == "given: --domain rack:32:3000d" and rack.instances(100) == 4
    for text, match in (("rack:x:1d", "KIND:SIZE:MTBF"), ("rack:4", "KIND:SIZE:MTBF"),
                        ("pdu:4:1d", "rack, switch"), ("switch:4:soon", "MTBF")):
        with pytest.raises(SimError, match=f"--domain '{text}': .*{match}"):
            Domain.parse(text)


def test_rescaled_events_stay_inside_the_window(monkeypatch):
    """Scaling to an MTBF can round a time up to the window's end: a failure drawn at the
    last float before horizon 864,000 s, scaled by 0.1, lands on 86,400 s exactly; the
    engine needs every time before the window's end."""
    model = NodeFailures(nodes=10, node_mtbf_s=10 * HOUR)          # job MTBF 1 h
    last = np.nextafter(864_000.0, 0.0)
    assert last * 0.1 == 86_400.0
    one = FailureEvents(np.array([5.0, last]), np.ones(2, np.int64), np.zeros(2, np.int8),
                        np.zeros(2, np.int64))
    monkeypatch.setattr(NodeFailures, "draw", lambda self, rng, horizon_s, limit: one)
    times = model.failure_times(np.random.default_rng(0), mtbf_s=0.1 * HOUR, window_s=86_400.0)
    np.testing.assert_array_equal(times, [0.5])
