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
