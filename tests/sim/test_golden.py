"""Seeded scenarios have golden outputs (tests/sim/golden/*.json), and the goldens are
themselves checked against the event-by-event SimPy reference: a golden file only ever
records what the model's reference engine computes.

Regenerate after an intended model change with
``SIM_UPDATE_GOLDEN=1 python -m pytest tests/sim/test_golden.py`` and review the diff."""
import json
import os
from pathlib import Path

import pytest

from sim import CostModel, FailureModel, Scenario, simulate
from sim.report import rows

GOLDEN = Path(__file__).parent / "golden"
DAY = 86400.0

# The goldens were made when every stale update counted as lost work: each scenario pins
# that accounting (stale_cost=1), whatever the cost model's stale cost factor becomes.
PINNED = {"stale_cost": 1.0}
SCENARIOS = {
    "qwen2.5-7b_30m": lambda: (Scenario.from_preset("qwen2.5-7b", window_s=1.5 * DAY, **PINNED), 1800.0),
    "llama-3.2-1b_weibull_10m": lambda: (Scenario.from_preset(
        "llama-3.2-1b", window_s=0.5 * DAY, failures=FailureModel(kind="weibull", shape=0.7), seed=7,
        **PINNED), 600.0),
    "custom_daly_2h": lambda: (Scenario.custom(iteration_s=6.0, iterations=5000, checkpoint_s=60.0,
                                               costs=CostModel(restart_s=120.0), interval="daly",
                                               window_s=2 * DAY, **PINNED), 7200.0),
    "qwen2.5-3b_log": lambda: (Scenario.from_preset("qwen2.5-3b", window_s=1 * DAY, failures=FailureModel(
        kind="log", log_times=(1800.0, 2000.0, 9000.0, 20000.0, 20100.0, 40000.0)), **PINNED), None),
}


def _expected(name, got):
    path = GOLDEN / f"{name}.json"
    if os.environ.get("SIM_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name):
    scenario, mtbf = SCENARIOS[name]()
    got = rows(simulate(scenario, mtbf_s=mtbf, seeds=3))
    _compare(got, _expected(name, got))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_phi_1_reproduces_the_goldens_byte_for_byte(name):
    """stale_cost=1 is the accounting the goldens were made under, exactly: their columns,
    written as the golden was, are the file's bytes (columns added since are left out)."""
    scenario, mtbf = SCENARIOS[name]()
    text = (GOLDEN / f"{name}.json").read_text()
    keys = list(json.loads(text)[0])
    got = [{k: row[k] for k in keys} for row in rows(simulate(scenario, mtbf_s=mtbf, seeds=3))]
    assert json.dumps(got, indent=2) + "\n" == text


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_is_what_the_simpy_reference_computes(name):
    """Not the fast engine checked against itself: each golden file equals what the
    event-by-event SimPy reference computes on the same seeds."""
    scenario, mtbf = SCENARIOS[name]()
    reference = rows(simulate(scenario, mtbf_s=mtbf, seeds=3, engine="simpy"))
    _compare(reference, json.loads((GOLDEN / f"{name}.json").read_text()))


def _compare(got, expected):
    assert [r["strategy"] for r in got] == [r["strategy"] for r in expected]
    for g, e in zip(got, expected):
        for key, value in e.items():
            if isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (g["strategy"], key)
            else:
                assert g[key] == value
