import numpy as np
import pytest

from sim import Scenario, simulate
from sim.errors import SimError
from sim.failures import FailureModel, job_mtbf, read_failure_log


def test_exponential_and_weibull_means():
    for model in (FailureModel(), FailureModel(kind="weibull", shape=0.7)):
        times = model.failure_times(np.random.default_rng(0), mtbf_s=100.0, window_s=2e6)
        assert np.diff(times).mean() == pytest.approx(100.0, rel=0.03)
        assert times.max() < 2e6


def test_same_seed_same_times_scaled_by_mtbf():
    a = FailureModel().failure_times(np.random.default_rng(5), mtbf_s=10.0, window_s=1e4)
    b = FailureModel().failure_times(np.random.default_rng(5), mtbf_s=20.0, window_s=2e4)
    np.testing.assert_allclose(2 * a, b)


def test_common_random_numbers_across_strategies():
    df = simulate(Scenario.from_preset("llama-3.2-1b", window_s=86400.0), mtbf_s=600.0, seeds=3)
    assert df.failures.nunique() == 1


def test_log_replay(tmp_path):
    log = tmp_path / "f.csv"
    log.write_text("time\n1h\n3h\n3.5h\n")
    times = read_failure_log(log)
    assert times == (3600.0, 10800.0, 12600.0)
    model = FailureModel(kind="log", log_times=times)
    got = model.failure_times(np.random.default_rng(0), mtbf_s=None, window_s=12600.0 * 4)
    assert len(got) in (11, 12) and set(np.round(np.diff(got))) <= {3600.0, 7200.0, 1800.0}
    scaled = model.failure_times(np.random.default_rng(0), mtbf_s=420.0, window_s=1e6)
    assert np.diff(scaled).mean() == pytest.approx(420.0, rel=0.05)


@pytest.mark.parametrize("text,match", [("", "empty"), ("a,b\n1,2\n", "column"), ("time\nsoon\n", "duration")])
def test_bad_logs(tmp_path, text, match):
    log = tmp_path / "f.csv"
    log.write_text(text)
    with pytest.raises(SimError, match=match):
        read_failure_log(log)


def test_job_mtbf():
    assert job_mtbf(3600.0 * 1000, 1000) == 3600.0
    with pytest.raises(SimError):
        job_mtbf(1.0, 0)


def test_weibull_draws_are_numpys_weibull_taken_in_logs():
    """The log-space sampler is rng.weibull scaled to the MTBF, to rounding (same variates)."""
    model = FailureModel(kind="weibull", shape=0.7)
    got = model.failure_times(np.random.default_rng(3), mtbf_s=100.0, window_s=1e5)
    from scipy.special import gamma
    gaps = 100.0 / gamma(1 + 1 / 0.7) * np.random.default_rng(3).weibull(0.7, len(got) + 200)
    np.testing.assert_allclose(got, np.cumsum(gaps)[: len(got)], rtol=1e-11)


@pytest.mark.parametrize("shape", [0.1, 0.3, 5.0, 400.0])
def test_weibull_gaps_follow_the_distribution_at_extreme_accepted_shapes(shape):
    """The gaps themselves (a run's gaps before its window's end are not independent draws:
    at shape 0.1 one long gap ends the window, the inspection paradox)."""
    from scipy import stats
    gaps = FailureModel(kind="weibull", shape=shape)._sampler(np.random.default_rng(1), 3600.0)(20_000)
    scale = 3600.0 / stats.weibull_min(shape).mean()
    assert stats.kstest(gaps, stats.weibull_min(shape, scale=scale).cdf).pvalue > 0.01


def test_a_run_stops_drawing_at_its_limit():
    """The guarantee behind the estimate: Weibull 0.002 at 1 h drew 12 failures with a NaN
    warning (Gamma(501) overflowed); now its gaps are right (about 0) and the run stops
    at the limit instead of allocating."""
    model = FailureModel(kind="weibull", shape=0.002)
    with pytest.raises(SimError, match="drew more than 5,000 failures"):
        model.failure_times(np.random.default_rng(0), mtbf_s=3600.0, window_s=30 * 86400.0,
                            limit=5_000)
    with pytest.raises(SimError, match="drew more than 1,000 failures"):
        FailureModel().failure_times(np.random.default_rng(0), mtbf_s=1.0, window_s=1e4, limit=1000)
