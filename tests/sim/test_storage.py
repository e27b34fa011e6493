"""Shared storage: the slower of links and aggregate, contention over time, re-timed schedules."""
import numpy as np
import pytest

from sim import CostModel, Scenario, SimError
from sim.storage import SharedStorage, contended, drain, storage_writes
from sim.strategies import get_strategy


def test_slower_of_links_and_aggregate():
    small = SharedStorage(nodes=4, link_gbps=1.24, read_link_gbps=17.9)
    big = SharedStorage(nodes=4096, link_gbps=1.24, read_link_gbps=17.9)
    assert small.write_gbps() == pytest.approx(4 * 1.24)
    assert big.write_gbps() == 2000.0 and big.read_gbps() == 2000.0


def test_a_burst_alone_drains_at_the_job_rate():
    end = drain(np.array([5.0]), np.array([100e9]), np.array([0]), job_gbps=10.0, aggregate_gbps=50.0)
    assert end[0] == pytest.approx(15.0)


def test_two_bursts_of_one_job_share_its_links():
    # the second starts halfway through the first: both share 10 GB/s from t=5
    end = drain(np.array([0.0, 5.0]), np.array([100e9, 100e9]), np.array([0, 0]),
                job_gbps=10.0, aggregate_gbps=1e6)
    assert end[0] == pytest.approx(15.0) and end[1] == pytest.approx(20.0)


def test_two_jobs_share_the_aggregate_not_each_others_links():
    end = drain(np.array([0.0, 0.0]), np.array([100e9, 100e9]), np.array([0, 1]),
                job_gbps=10.0, aggregate_gbps=15.0)
    np.testing.assert_allclose(end, [100 / 7.5, 100 / 7.5])
    alone = drain(np.array([0.0, 0.0]), np.array([100e9, 100e9]), np.array([0, 1]),
                  job_gbps=10.0, aggregate_gbps=40.0)
    np.testing.assert_allclose(alone, [10.0, 10.0])


def test_a_trickle_slows_a_burst_less_than_a_burst_does():
    """The same bytes from another job: spread over steps they take less from the burst."""
    rate = dict(job_gbps=10.0, aggregate_gbps=10.0)
    burst = drain(np.array([0.0, 0.0]), np.array([100e9, 100e9]), np.array([0, 1]), **rate)[0]
    starts = np.concatenate(([0.0], np.arange(0.0, 100.0, 1.0)))
    sizes = np.concatenate(([100e9], np.full(100, 1e9)))
    trickle = drain(starts, sizes, np.concatenate(([0], np.ones(100, dtype=int))), **rate)[0]
    assert burst == pytest.approx(20.0)
    assert 10.0 < trickle < burst


def _schedule(name, **kw):
    scenario = Scenario.from_preset("llama-3.2-1b")
    strategy = get_strategy(name)
    cadence = strategy.cadence("matched", scenario.workload, scenario.costs, mtbf_s=3600.0)
    return scenario, strategy.schedule(scenario.workload, scenario.costs, cadence)


@pytest.mark.parametrize("name", ["deepspeed", "checkfreq", "gemini", "layercheck"])
def test_alone_on_its_storage_a_schedule_is_unchanged(name):
    scenario, schedule = _schedule(name)
    storage = SharedStorage(nodes=1, link_gbps=scenario.costs.save_gbps, read_link_gbps=17.9)
    out = contended(schedule, storage, full_bytes=float(scenario.workload.full_bytes),
                    rng=np.random.default_rng(0))
    for tier in ("snap", "persist"):
        np.testing.assert_allclose(getattr(out, tier), getattr(schedule, tier), rtol=1e-9)


def test_tenants_bursting_together_lengthen_a_synchronous_save():
    scenario, schedule = _schedule("deepspeed")
    storage = SharedStorage(nodes=1, link_gbps=scenario.costs.save_gbps, read_link_gbps=17.9,
                            aggregate_gbps=scenario.costs.save_gbps, tenants=3)
    out = contended(schedule, storage, full_bytes=float(scenario.workload.full_bytes),
                    rng=np.random.default_rng(0))
    at = schedule.commit
    assert (out.snap[at] >= schedule.snap[at] - 1e-9).all()
    assert out.snap[at].sum() > 1.2 * schedule.snap[at].sum()


def test_bad_storage_says_the_fix():
    with pytest.raises(SimError, match="positive bandwidth"):
        SharedStorage(nodes=2, link_gbps=0.0, read_link_gbps=1.0)
    with pytest.raises(SimError, match="tenants"):
        SharedStorage(nodes=2, link_gbps=1.0, read_link_gbps=1.0, tenants=-1)


def test_tenants_past_the_work_limit_are_refused_before_their_writes_are_drawn():
    """1e9 tenants asked numpy for 112 GiB (1e8: 11 GiB) of write times: refused with the
    most tenants this job's writes allow, before anything is drawn (a generator that
    would draw fails the test)."""
    from sim.workbound import MAX_DRAINED_WRITES, check_drained_writes
    scenario, schedule = _schedule("deepspeed")
    writes = storage_writes(schedule)
    most = MAX_DRAINED_WRITES // writes - 1

    class NoDraws:
        def random(self, *a, **k):
            raise AssertionError("drew the tenants' write times")
    for tenants in (most + 1, 10**8, 10**9):
        storage = SharedStorage(nodes=1, link_gbps=1.0, read_link_gbps=1.0, tenants=tenants)
        with pytest.raises(SimError, match=f"give at most --tenants {most:,} for this job"):
            contended(schedule, storage, full_bytes=float(scenario.workload.full_bytes),
                      rng=NoDraws())
    check_drained_writes(writes, most)                    # the most it names is accepted
    check_drained_writes(MAX_DRAINED_WRITES + 1, 0)       # a job alone is not bounded here


def test_a_write_of_no_finite_time_is_refused_not_drained_forever():
    """A NaN start (times that overflowed upstream) never drained: the loop did not end."""
    import signal

    def stop(*_):
        raise TimeoutError("drain did not end")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        for starts, sizes in (([0.0, np.nan], [1e9, 1e9]), ([0.0, 1.0], [1e9, np.inf])):
            with pytest.raises(SimError, match="finite start time and size"):
                drain(np.array(starts), np.array(sizes), np.array([0, 1]), job_gbps=1.0,
                      aggregate_gbps=1.0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
