import numpy as np
import pytest

from sim.costs import CostModel
from sim.errors import SimError
from sim.strategies import STRATEGIES, get_strategy
from sim.workload import Workload

from .conftest import small_workload

COSTS = CostModel()


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_no_charge_at_the_jobs_end(name):
    plan = get_strategy(name).plan(small_workload(), COSTS, interval=5)
    n = plan.steps
    assert plan.snap[n] == plan.persist[n] == plan.bytes[n] == 0 and not plan.commit[n]
    assert plan.recover.shape == (n + 1,) and (plan.recover >= COSTS.restart_s).all()


def test_deepspeed_stalls_for_the_write_checkfreq_for_the_snapshot():
    w = small_workload()
    ds = get_strategy("deepspeed").plan(w, COSTS, interval=10)
    cf = get_strategy("checkfreq").plan(w, COSTS, interval=10)
    assert list(np.flatnonzero(ds.commit)) == [10, 20, 30]
    assert ds.snap[10] == pytest.approx(20e9 / 1.12e9) and ds.persist[10] == 0
    assert cf.snap[10] == pytest.approx(20e9 / 100e9) and cf.persist[10] == pytest.approx(20e9 / 1.12e9)


def test_lowdiff_replays_diffs_since_the_full_checkpoint():
    plan = get_strategy("lowdiff").plan(small_workload(), COSTS, interval=10)
    replay = plan.recover - plan.recover[0]
    assert replay[10] == 0 and replay[14] == pytest.approx(4 * 0.1 * 20e9 / 22.9e9)
    assert list(np.flatnonzero(plan.commit)) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                                 30, 32, 34, 36, 38]


def test_gemini_has_a_storage_tier():
    plan = get_strategy("gemini").plan(small_workload(), COSTS, interval=10)
    assert list(np.flatnonzero(np.isfinite(plan.backup))) == [10, 20, 30]
    assert plan.backup_probability == COSTS.peer_loss_probability
    assert plan.commit[1:-1].all()


def test_layercheck_needs_a_trace_and_commits_every_step():
    custom = Workload.custom(iteration_s=1.0, iterations=10, full_bytes=10**9)
    with pytest.raises(SimError, match="needs a trace"):
        get_strategy("layercheck").plan(custom, COSTS)
    plan = get_strategy("layercheck").plan(small_workload(), COSTS)
    assert plan.commit_on_completion and plan.commit[1:-1].all()


def test_unknown_strategy_and_bad_interval():
    with pytest.raises(SimError, match="choose from"):
        get_strategy("gemeni")
    with pytest.raises(SimError, match="interval"):
        get_strategy("deepspeed").plan(small_workload(), COSTS, interval=0)
