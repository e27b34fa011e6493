"""The rules that turn a staleness study's replicates into phi (profiler.replicates),
against hand calculations."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from profiler.replicates import IQR_PER_SD, estimate, ratio_estimate, run_phi, summarize


def _reading(delta: float, draws=None) -> dict:
    return {"delta": delta, "draws": np.full(4, delta) if draws is None else np.asarray(draws),
            "censored": None}


def _row(kind: str, f: int, steps: tuple[float, float], lr: tuple[float, float]) -> dict:
    """A run of replicate (1e-3, f, 0): (Delta, S) in steps and on the lr clock."""
    return {"kind": kind, "threshold": 1e-3, "failure_step": f, "draw": 0,
            "staleness": steps[1], "staleness_lr": lr[1],
            "readings": {"10": _reading(steps[0])}, "readings_lr": {"10": _reading(lr[0])}}


ROWS = [  # replicate A at step 40, B at step 80
    _row("composite", 40, (6.0, 3.0), (2.0, 2.5)), _row("control", 40, (4.0, 2.0), (1.5, 1.5)),
    _row("composite", 80, (9.0, 3.0), (3.0, 2.5)), _row("control", 80, (4.2, 2.0), (1.35, 1.5)),
]


def test_each_rule_reads_a_run_as_written():
    composite, control = ROWS[0], ROWS[1]
    assert run_phi(composite, control, "10", "steps")[0] == 6.0 / 3.0
    assert run_phi(composite, control, "10", "lr")[0] == 2.0 / 2.5
    assert run_phi(composite, control, "10", "relative")[0] == (6.0 / 3.0) / (4.0 / 2.0)
    assert run_phi(control, control, "10", "relative")[0] == 1.0  # its own yardstick
    assert run_phi({**composite, "staleness_lr": 0.0}, control, "10", "lr") is None  # nothing stale
    assert run_phi(composite, None, "10", "relative") is None  # no control to divide by
    with pytest.raises(ValueError, match="rule"):
        run_phi(composite, control, "10", "ratio")


def _iqr_sd(x) -> float:
    return float(np.subtract(*np.quantile(x, [0.75, 0.25])) / 1.3489795)


def test_the_interval_is_t_over_the_replicates_with_the_evaluations_noise_added():
    # values 0.8 and 1.2: mean 1.0, sd 0.2 sqrt 2; each replicate's resamples 0.1 either side
    est = estimate([0.8, 1.2], [np.array([0.7, 0.9]), np.array([1.1, 1.3])])
    sd = math.sqrt(0.08)
    se_eval = _iqr_sd([0.9, 1.1])  # the replicates' mean on each resample, its robust spread
    half = stats.t.ppf(0.975, 1) * math.sqrt(sd ** 2 / 2 + se_eval ** 2)
    assert (est.n, est.value) == (2, pytest.approx(1.0))
    assert est.sd == pytest.approx(sd) and est.se_eval == pytest.approx(se_eval)
    assert (est.low, est.high) == (pytest.approx(1.0 - half), pytest.approx(1.0 + half))
    one = estimate([0.5], [np.array([0.4, 0.6])])  # no spread to take: the evaluation's alone
    assert one.sd is None and one.high - 0.5 == pytest.approx(stats.norm.ppf(0.975) * _iqr_sd([0.4, 0.6]))
    assert IQR_PER_SD == pytest.approx(1.3489795)


def test_the_relative_rule_is_a_ratio_of_means_with_its_first_order_error():
    # composites 2.0 and 3.0 per step of staleness, their controls 2.0 and 2.1
    a, b = [2.0, 3.0], [2.0, 2.1]
    est = ratio_estimate(a, b, [np.full(3, 2.0), np.full(3, 3.0)], [np.full(3, 2.0), np.full(3, 2.1)])
    ratio = 2.5 / 2.05
    spread = np.std(np.array(a) - ratio * np.array(b), ddof=1) / 2.05
    assert est.value == pytest.approx(ratio) and est.sd == pytest.approx(spread)
    assert est.se_eval == 0.0  # every resample reads the same
    assert est.high - ratio == pytest.approx(stats.t.ppf(0.975, 1) * spread / math.sqrt(2))
    # a resample whose divisor is 0 is left out of the evaluation's spread, not infinite
    wild = ratio_estimate(a, b, [np.array([2.0, 2.0, 2.1, 1.9]), np.array([3.0, 3.0, 3.1, 2.9])],
                          [np.array([2.0, 0.0, 2.0, 2.0]), np.array([2.1, 0.0, 2.1, 2.1])])
    assert math.isfinite(wild.high)


def test_the_summary_gives_each_part_the_control_and_the_figure_with_n():
    summary = summarize(ROWS, rule="lr", main=1e-3, figure_horizon="10")
    composite = summary["phi"]["0.001"]["composite"]["10"]
    assert (composite["value"], composite["n"]) == (pytest.approx(1.0), 2)
    assert composite["rules"]["steps"]["value"] == pytest.approx(2.5)
    assert composite["rules"]["relative"]["value"] == pytest.approx((2.0 + 3.0) / (2.0 + 2.1))
    assert composite["staleness"] == 3.0 and composite["failure_steps"] == [40, 80]
    control = summary["control"]["lr"]["0.001"]["10"]  # 1.0 and 0.9
    assert control["value"] == pytest.approx(0.95) and control["n"] == 2 and control["reads_one"]
    assert not summary["control"]["steps"]["0.001"]["10"]["reads_one"]  # 2.0 and 2.1
    assert summary["well_conditioned"] == {"rule": "lr", "holds": True, "criterion": (
        "the control reads 1 within its interval on the lr clock at every horizon")}
    figure = summary["figure"]
    assert figure == summary["figures"]["stale_cost"]
    assert (figure["part"], figure["rule"], figure["n"]) == ("composite", "lr", 2)
    assert figure["value"] == composite["value"]
    relative = summarize(ROWS, rule="relative", main=1e-3, figure_horizon="10")
    assert relative["figure"]["value"] == pytest.approx((2.0 + 3.0) / (2.0 + 2.1))
    assert relative["well_conditioned"]["holds"]  # the divisor, 2.0 and 2.1, is above 0
