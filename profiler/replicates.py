"""What the replicates of a staleness study read: phi per stale part and horizon, under
one rule, with an interval over replicates and its n. Pure numpy and scipy (no torch):
``profiler.stalecost`` runs the study, this module reads its runs.

A **replicate** is one failure step f of one threshold, trained on after f with one
data order d (d = 0: the failure-free run's own). Its runs all resume at f and see
the same batches after it:

- ``twin``: the failure-free state at f (d = 0: the reference run itself);
- ``composite``: what ``LayerCheck.restore()`` loads at f;
- ``blocks`` / ``embedding``: that composite with only its non-embedding layers
  (blocks, head and norms: every layer at the base threshold) stale, or only its
  embedding layers, the rest as at f;
- ``control``: every layer and its optimizer state as at f - S_c, the schedule, data
  position and generators as at f (S_c: the composite's staleness in whole steps, at
  least 1): S_c steps of work lost with no replay, phi = 1 by the simulator's
  definition.

Each run's Delta at a horizon is read (``profiler.convergence``) against the
replicate's failure-free run (the reference up to f, the twin after it) on two
clocks: steps, and learning-rate-weighted steps (sum of lr / lr_peak over the steps).
Its staleness S is on the same clock: the parameter-weighted age of what it loads
(``staleness`` in steps, ``staleness_lr`` summed over the lost steps' lr / lr_peak;
a part's S counts only its layers, over all the parameters, so that the parts' S
add up to the composite's). The **rules** that turn these into phi:

- ``lr``: Delta / S, both in learning-rate-weighted steps;
- ``relative``: (Delta / S) / (Delta_c / S_c) in steps, the control of the same
  replicate at the same horizon as the yardstick;
- ``steps``: Delta / S in steps (the reading before the control existed; kept to
  show what the control corrects).

A figure under ``lr`` or ``steps`` is the mean of phi over the replicates; under
``relative`` it is the ratio of the means, mean(Delta / S) / mean(Delta_c / S_c) over
the replicates (each run paired with its own replicate's control), which divides by
the controls' mean rather than by each control alone: one control's Delta near 0 at a
short horizon makes its replicate's own ratio arbitrary, not the mean's. The interval
is a t-interval: the standard error is the replicates' spread (sd / sqrt(n) for a
mean; for the ratio, sd(Delta / S - phi Delta_c / S_c) / (sqrt(n) mean(Delta_c /
S_c)), its first-order form) with the evaluation's own noise added in quadrature
(the spread over bootstrap resamples of the held-out sequences of the same estimate,
every run resampled alike; the interquartile range / 1.349, so that a few resamples
whose divisor nears 0 do not set it), times the 97.5% quantile of Student's t with
n - 1 degrees of freedom. With n = 1 there is no spread to take: the interval is the
evaluation's alone (normal quantile), and the figure says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import stats

__all__ = ["RULES", "PARTS", "KINDS", "Estimate", "estimate", "ratio_estimate", "run_phi",
           "summarize", "horizon_key"]

RULES = ("lr", "relative", "steps")
PARTS = ("composite", "blocks", "embedding")
"""What was stale: everything the composite loads stale, its non-embedding layers
only, its embedding layers only."""
KINDS = ("twin", "exact", "control", *PARTS)
CLOCKS = {"steps": "readings", "lr": "readings_lr"}
"""Each clock's readings in a run's row."""
IQR_PER_SD = 2 * float(stats.norm.ppf(0.75))
"""The interquartile range of a normal distribution in standard deviations (1.349)."""


@dataclass(frozen=True)
class Estimate:
    """The mean of per-replicate values with its interval (module doc)."""

    value: float
    low: float
    high: float
    n: int
    sd: float | None
    se_eval: float

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n,
                "sd": self.sd, "se_eval": self.se_eval}


def estimate(values: Iterable[float], draws: Iterable[np.ndarray]) -> Estimate:
    """The t-interval of the mean of ``values`` (one per replicate), each with its
    readings on the study's bootstrap resamples of the held-out sequences (``draws``,
    aligned: resample b of every replicate is the same resample)."""
    values = np.asarray(list(values), dtype=np.float64)
    if len(values) == 0:
        raise ValueError("no replicate to estimate from")
    mean = float(values.mean())
    spread = float(values.std(ddof=1)) if len(values) > 1 else None
    return _interval(mean, spread, np.vstack(list(draws)).mean(axis=0), len(values))


def ratio_estimate(mine: Iterable[float], theirs: Iterable[float], mine_draws: Iterable[np.ndarray],
                   their_draws: Iterable[np.ndarray]) -> Estimate:
    """The t-interval of mean(``mine``) / mean(``theirs``), the replicates paired (module
    doc); the draws as ``estimate``'s."""
    a, b = (np.asarray(list(x), dtype=np.float64) for x in (mine, theirs))
    if len(a) == 0 or len(a) != len(b):
        raise ValueError("give one value of each, per replicate, for at least one replicate")
    ratio = float(a.mean() / b.mean())
    spread = float((a - ratio * b).std(ddof=1) / abs(b.mean())) if len(a) > 1 else None
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.vstack(list(mine_draws)).mean(axis=0) / np.vstack(list(their_draws)).mean(axis=0)
    return _interval(ratio, spread, draws, len(a))


def _interval(value: float, spread: float | None, draws: np.ndarray, n: int) -> Estimate:
    """``value`` +- t (or the normal quantile with no ``spread``) x the standard error of
    the module doc; ``spread``: the replicates' sd of what is averaged (None: n = 1)."""
    finite = draws[np.isfinite(draws)]
    low_q, high_q = np.quantile(finite, [0.25, 0.75]) if finite.size > 1 else (value, value)
    se_eval = float((high_q - low_q) / IQR_PER_SD) if finite.size > 1 else 0.0
    if spread is None:
        half = float(stats.norm.ppf(0.975)) * se_eval
        return Estimate(value, value - half, value + half, 1, None, se_eval)
    half = float(stats.t.ppf(0.975, n - 1)) * math.sqrt(spread ** 2 / n + se_eval ** 2)
    return Estimate(value, value - half, value + half, n, spread, se_eval)


def horizon_key(name: str) -> float:
    return math.inf if name == "end" else float(name)


def _draws(reading: Mapping[str, Any]) -> np.ndarray:
    return np.asarray(reading["draws"], dtype=np.float64)


def run_phi(row: Mapping[str, Any], control: Mapping[str, Any] | None, name: str,
            rule: str) -> tuple[float, np.ndarray] | None:
    """phi of one run at horizon ``name`` under ``rule`` with its bootstrap draws (None:
    its S is 0 on the rule's clock, or the control the relative rule divides by reads
    0). ``row``'s readings hold their ``draws`` (as the study keeps them in memory)."""
    if rule == "relative":
        if row["kind"] == "control":
            return 1.0, np.ones_like(_draws(row["readings"][name]))
        mine, yardstick = run_phi(row, None, name, "steps"), (
            None if control is None else run_phi(control, None, name, "steps"))
        if mine is None or yardstick is None or yardstick[0] == 0:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return mine[0] / yardstick[0], mine[1] / yardstick[1]
    if rule not in CLOCKS:
        raise ValueError(f"rule {rule!r}: use one of {', '.join(RULES)}")
    staleness = row["staleness_lr" if rule == "lr" else "staleness"]
    if not staleness > 0:
        return None
    reading = row[CLOCKS[rule]][name]
    return reading["delta"] / staleness, _draws(reading) / staleness


def summarize(rows: list[Mapping[str, Any]], *, rule: str, main: float,
              figure_horizon: str) -> dict[str, Any]:
    """The study's summary: phi per threshold, part and horizon under ``rule`` (and the
    values under every rule), the control's readings on both clocks, and the figures
    (``stale_cost`` the composite's at the main threshold and figure horizon,
    ``stale_cost_blocks`` and ``stale_cost_embedding`` its parts')."""
    controls = {_replicate(r): r for r in rows if r["kind"] == "control"}
    phi: dict[str, Any] = {}
    for k in sorted({r["threshold"] for r in rows if r["kind"] in PARTS}, reverse=True):
        phi[f"{k:g}"] = {}
        for part in ("control", *PARTS):
            mine = [r for r in rows if r["kind"] == part and r["threshold"] == k]
            per = {}
            for name in sorted({n for r in mine for n in r["readings"]}, key=horizon_key):
                per[name] = _estimates(mine, controls, name, rule)
            if per:
                phi[f"{k:g}"][part] = per
    control = {clock: _control_check(phi, clock) for clock in CLOCKS}
    figures = {}
    for part, key in zip(PARTS, ("stale_cost", "stale_cost_blocks", "stale_cost_embedding")):
        entry = phi.get(f"{main:g}", {}).get(part, {}).get(figure_horizon)
        if entry is not None:
            figures[key] = {"threshold": main, "horizon": figure_horizon, "part": part,
                            "rule": rule, **entry}
    return {"rule": rule, "phi": phi, "control": control, "well_conditioned":
            _conditioned(control, phi, rule), "figures": figures,
            "figure": figures.get("stale_cost")}


def _replicate(row: Mapping[str, Any]) -> tuple[Any, int, int]:
    return row["threshold"], row["failure_step"], row["draw"]


def _estimates(rows: list[Mapping[str, Any]], controls: Mapping[Any, Any], name: str,
               rule: str) -> dict[str, Any] | None:
    """The estimate under ``rule`` with the means of Delta and S beside it, and the value
    under every rule (what the choice of rule changes)."""
    have = [r for r in rows if name in r["readings"]]
    out: dict[str, Any] = {}
    for each in RULES:
        got = [(r, run_phi(r, controls.get(_replicate(r)), name, each)) for r in have]
        got = [(r, p) for r, p in got if p is not None and np.isfinite(p[0])]
        if not got:
            continue
        if each == "relative" and got[0][0]["kind"] != "control":
            pairs = [(run_phi(r, None, name, "steps"), run_phi(controls[_replicate(r)], None, name,
                                                                  "steps")) for r, _ in got]
            est = ratio_estimate([p[0] for p, _ in pairs], [c[0] for _, c in pairs],
                                 [p[1] for p, _ in pairs], [c[1] for _, c in pairs])
        else:
            est = estimate([p[0] for _, p in got], [p[1] for _, p in got])
        if each == rule:
            clock = "readings_lr" if rule == "lr" else "readings"
            out.update(est.to_dict())
            out.update(
                delta=float(np.mean([r[clock][name]["delta"] for r, _ in got])),
                staleness=float(np.mean([r["staleness"] for r, _ in got])),
                staleness_lr=float(np.mean([r["staleness_lr"] for r, _ in got])),
                failure_steps=sorted({r["failure_step"] for r, _ in got}),
                draws=sorted({r["draw"] for r, _ in got}),
                censored=sorted({r[c][name]["censored"] for r, _ in got for c in CLOCKS.values()}
                                - {None}))
        out.setdefault("rules", {})[each] = est.to_dict()
    return out if "value" in out else None


def _control_check(phi: Mapping[str, Any], clock: str) -> dict[str, Any]:
    """Per threshold and horizon: the control's phi on ``clock`` (Delta_c / S_c) with its
    interval and n, and whether 1 lies in it."""
    out: dict[str, Any] = {}
    for k, parts in phi.items():
        for name, entry in parts.get("control", {}).items():
            if entry is None or clock not in entry.get("rules", {}):
                continue
            est = entry["rules"][clock]
            out.setdefault(k, {})[name] = {**est, "reads_one": est["low"] <= 1.0 <= est["high"]}
    return out


def _conditioned(control: Mapping[str, Any], phi: Mapping[str, Any], rule: str) -> dict[str, Any]:
    """Whether ``rule`` is well conditioned by the control: on its own clock (``lr``,
    ``steps``) the control reads 1 within its interval at every horizon; for
    ``relative`` the control's Delta_c / S_c (its divisor) is above 0 within its
    interval at every horizon."""
    if rule == "relative":
        checks = [entry["rules"]["steps"]["low"] > 0 for parts in phi.values()
                  for entry in parts.get("control", {}).values()
                  if entry is not None and "steps" in entry.get("rules", {})]
        criterion = "the control's Delta_c / S_c in steps is above 0 within its interval"
    else:
        checks = [h["reads_one"] for per in control[rule].values() for h in per.values()]
        criterion = f"the control reads 1 within its interval on the {rule} clock"
    return {"rule": rule, "criterion": criterion + " at every horizon",
            "holds": bool(checks) and all(checks)}
