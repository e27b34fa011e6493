"""Fitting failure laws to a record: ``python -m sim fit-failures FILE``.

For a record of nodes (``NodeRecord``): the system as one job (the gaps between its
distinct failure instants: what a job on every node sees), each node's law (its
rate, and a Weibull fit of the gaps between a node's own failures, pooled over the
nodes), and co-failures (failures of several nodes within a short window, against
what independent nodes would give). For Philly's interruptions: each job size's
time to interruption, and the restart gaps.

Every fit of a sample of gaps (``GapFit``): the rate (1 / mean gap) with a 95%
interval from the mean's standard error (any law of the gaps), the Weibull shape by maximum likelihood
with a 95% interval (the MLE's asymptotic standard error of log k, sqrt(6 / (pi^2
n))), Kolmogorov-Smirnov statistics and p-values of both fitted laws (with the
parameters estimated from the same data, so the p-values are too kind: read them
as a ranking), and the likelihood-ratio test of exponential (Weibull k = 1).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats

from .errors import SimError
from .records import InterruptionRecord, NodeRecord
from .tables import WIDTH, Column, render
from .units import format_duration

__all__ = ["GapFit", "fit_gaps", "cofailures", "fit_record", "RecordFit", "MIN_GAPS"]

MIN_GAPS = 10
"""The fewest gaps a fit takes (fewer leave the shape's interval wider than its range)."""
_Z = float(stats.norm.ppf(0.975))


@dataclass(frozen=True)
class GapFit:
    """Laws fitted to one sample of gaps (seconds)."""

    gaps: int
    mean_s: float
    rate_per_h: float
    """Failures per hour, 1 / mean gap (the exponential MLE)."""
    rate_per_h_low: float
    rate_per_h_high: float
    weibull_shape: float
    weibull_shape_low: float
    weibull_shape_high: float
    weibull_scale_s: float
    ks_exponential: float
    ks_exponential_p: float
    ks_weibull: float
    ks_weibull_p: float
    lr_statistic: float
    """2 (log-likelihood Weibull - exponential): chi-square with 1 degree of freedom."""
    lr_p: float
    """The chance of a ratio this large if the gaps were exponential."""
    better: str
    """'weibull' where the likelihood ratio rejects exponential at 5%, else 'exponential'."""


def _weibull_mle(x: np.ndarray) -> tuple[float, float]:
    """Shape and scale by maximum likelihood: the root in k of the profile equation
    sum(x^k ln x) / sum(x^k) - 1/k - mean(ln x) = 0 (x^k taken relative to max x)."""
    logs = np.log(x)
    top = logs.max()

    def score(k: float) -> float:
        w = np.exp(k * (logs - top))
        return float((w * logs).sum() / w.sum() - 1.0 / k - logs.mean())
    if np.ptp(logs) == 0:
        raise SimError("every gap is the same length: no shape to fit")
    shape = optimize.brentq(score, 1e-3, 1e3, xtol=1e-10)
    scale = math.exp(top + math.log(np.exp(shape * (logs - top)).mean()) / shape)
    return shape, scale


def fit_gaps(gaps_s) -> GapFit:
    """Exponential and Weibull fits of positive gaps (see the module)."""
    x = np.asarray(gaps_s, dtype=np.float64)
    if x.size < MIN_GAPS:
        raise SimError(f"{x.size} gaps are too few to fit (at least {MIN_GAPS})")
    if not (np.isfinite(x).all() and (x > 0).all()):
        raise SimError("gaps must be positive seconds (merge failures at one instant first)")
    n, mean = x.size, float(x.mean())
    hour = 3600.0
    # the rate's interval from the mean gap's standard error: right for any law of the
    # gaps (a Poisson count's chi-square interval is too narrow for clustered ones)
    half = _Z * float(x.std(ddof=1)) / math.sqrt(n)
    low, high = hour / (mean + half), (hour / (mean - half) if mean > half else math.inf)
    shape, scale = _weibull_mle(x)
    spread = _Z * math.sqrt(6.0 / (math.pi ** 2 * n))
    ks_e = stats.kstest(x, stats.expon(scale=mean).cdf)
    ks_w = stats.kstest(x, stats.weibull_min(shape, scale=scale).cdf)
    ll_e = float(stats.expon(scale=mean).logpdf(x).sum())
    ll_w = float(stats.weibull_min(shape, scale=scale).logpdf(x).sum())
    lr = max(0.0, 2.0 * (ll_w - ll_e))
    lr_p = float(stats.chi2.sf(lr, 1))
    return GapFit(gaps=n, mean_s=mean, rate_per_h=hour / mean, rate_per_h_low=float(low),
                  rate_per_h_high=float(high), weibull_shape=shape,
                  weibull_shape_low=shape * math.exp(-spread),
                  weibull_shape_high=shape * math.exp(spread), weibull_scale_s=scale,
                  ks_exponential=float(ks_e.statistic), ks_exponential_p=float(ks_e.pvalue),
                  ks_weibull=float(ks_w.statistic), ks_weibull_p=float(ks_w.pvalue),
                  lr_statistic=lr, lr_p=lr_p, better="weibull" if lr_p < 0.05 else "exponential")


def cofailures(record: NodeRecord, window_s: float = 0.0) -> dict[str, Any]:
    """Failures of several nodes together: failures grouped while consecutive ones are at
    most ``window_s`` apart (0: the same recorded instant, a minute in LANL's release).
    ``expected_share`` is the share that independent nodes failing at the record's rate
    would give: a failure has another within the window (or its recorded minute) with
    probability 1 - exp(-rate x width)."""
    if not (math.isfinite(window_s) and window_s >= 0):
        raise SimError(f"co-failure window {window_s!r} must be zero or more seconds")
    t = record.times_s
    new = np.concatenate(([True], np.diff(t) > window_s))
    group = np.cumsum(new) - 1
    sizes = np.bincount(group)
    nodes_in = [np.unique(record.node[group == g]).size for g in np.flatnonzero(sizes > 1)]
    shared = int(sizes[sizes > 1].sum())
    resolution = _resolution(t)
    width = 2 * window_s + resolution if window_s > 0 else resolution
    rate = record.failures / record.span_s
    histogram = {int(k): int(v) for k, v in zip(*np.unique(sizes, return_counts=True))}
    return {"window_s": window_s, "resolution_s": resolution, "events": int(sizes.size),
            "shared_failures": shared, "share": shared / record.failures,
            "expected_share": float(-math.expm1(-rate * width)),
            "largest": int(sizes.max()), "most_nodes": int(max(nodes_in, default=1)),
            "events_by_size": histogram}


def _resolution(t: np.ndarray) -> float:
    """The record's time resolution: the largest of 1 s, 60 s, 3600 s dividing every time."""
    for step in (3600.0, 60.0, 1.0):
        if np.allclose(np.round(t / step) * step, t, rtol=0, atol=1e-6):
            return step
    return 0.0


@dataclass(frozen=True)
class RecordFit:
    """What ``python -m sim fit-failures`` reports."""

    record: str
    attribution: str
    summary: dict[str, Any]
    fits: dict[str, GapFit]
    """Named samples: 'system' and 'node gaps' for a record of nodes; 'gpus=N' for Philly."""
    extra: dict[str, Any]
    """Co-failures (nodes) or restart gaps (Philly)."""

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "summary": self.summary,
                "fits": {k: asdict(v) for k, v in self.fits.items()}, **self.extra,
                "attribution": self.attribution}

    def text(self, *, width: int | None = WIDTH) -> str:
        """The summary, the fits' table (blocks of ``width`` columns, ``sim.tables``; None:
        one line a sample), the extra findings and the data's attribution."""
        lines = [f"{self.record}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.summary.items())]
        columns = [Column("sample", 10, left=True), Column("gaps", 6), Column("mean", 9),
                   Column("rate/h", 9), Column("95%", 19), Column("shape", 6), Column("95%", 13),
                   Column("KS exp", 7), Column("p", 8), Column("KS wbl", 7), Column("p", 8),
                   Column("LR p", 8), Column("better", left=True)]
        rows = [[name, str(f.gaps), format_duration(f.mean_s), f"{f.rate_per_h:.4g}",
                 f"{f.rate_per_h_low:.4g}..{f.rate_per_h_high:.4g}", f"{f.weibull_shape:.3f}",
                 f"{f.weibull_shape_low:.3f}..{f.weibull_shape_high:.3f}",
                 f"{f.ks_exponential:.3f}", f"{f.ks_exponential_p:.2g}", f"{f.ks_weibull:.3f}",
                 f"{f.ks_weibull_p:.2g}", f"{f.lr_p:.2g}", f.better] for name, f in self.fits.items()]
        lines.append(render(columns, rows, width=width))
        for key, value in self.extra.items():
            lines.append(f"{key}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()))
        lines.append(f"data: {self.attribution}")
        return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def fit_record(record: NodeRecord | InterruptionRecord, *, window_s: float = 0.0) -> RecordFit:
    """Fit a record (see the module); a sample with fewer than ``MIN_GAPS`` gaps is left out
    (a record of few failures may have a system fit and no node one)."""
    if isinstance(record, InterruptionRecord):
        return _fit_interruptions(record)
    t, node = record.times_s, record.node
    instants = np.unique(t)
    order = np.lexsort((t, node))
    same = node[order][1:] == node[order][:-1]
    node_gaps = np.diff(t[order])[same]
    repeats = int((node_gaps == 0).sum())
    failing = int(np.unique(node).size)
    exposure_h = record.nodes * record.span_s / 3600.0          # node-hours observed
    n = record.failures
    low, high = _node_rate_interval(record, exposure_h)
    summary = {"nodes": record.nodes, "nodes_failing": failing, "failures": n,
               "span_days": record.span_s / 86400.0,
               "system_mtbf_h": record.span_s / n / 3600.0,
               "node_mtbf_h": record.node_mtbf_s / 3600.0,
               "node_rate_per_h": n / exposure_h,
               "node_rate_per_h_low": low, "node_rate_per_h_high": high,
               "repeated_node_instants": repeats}
    # the node's shape from the gaps between one node's own failures, pooled (a node's
    # time before its first and after its last failure is censored and left out; so
    # is a node failing twice in one recorded minute)
    samples = {"system": np.diff(instants), "node gaps": node_gaps[node_gaps > 0]}
    fits = {name: fit_gaps(x) for name, x in samples.items() if x.size >= MIN_GAPS}
    if not fits:
        raise SimError(f"record {record.name}: {instants.size - 1} gaps between its failures are "
                       f"too few to fit (at least {MIN_GAPS})")
    return RecordFit(record=record.name, attribution=record.attribution, summary=summary,
                     fits=fits, extra={"cofailures": cofailures(record, window_s)})


def _node_rate_interval(record: NodeRecord, exposure_h: float) -> tuple[float, float]:
    """The per-node rate's 95% interval by resampling nodes (2,000 bootstrap draws, seed 0:
    the same figures every run): it keeps what a Poisson interval would not, that nodes
    differ and a node's failures cluster."""
    counts = np.bincount(record.node, minlength=record.nodes)
    picks = np.random.default_rng(0).integers(record.nodes, size=(2000, record.nodes))
    rates = counts[picks].sum(axis=1) / exposure_h
    return float(np.percentile(rates, 2.5)), float(np.percentile(rates, 97.5))


def _fit_interruptions(record: InterruptionRecord) -> RecordFit:
    """Each job size with enough interruptions: its attempts' lengths (interrupted attempts
    only: the record holds no attempt that ran to the end, so the means are those of
    attempts that were interrupted, shorter than the mean time to an interruption)."""
    fits = {}
    for gpus in np.unique(record.gpus):
        x = record.attempt_s[record.gpus == gpus]
        if x.size >= MIN_GAPS:
            fits[f"gpus={int(gpus)}"] = fit_gaps(x)
    gap = record.restart_gap_s
    summary = {"interruptions": record.failures, "jobs": record.jobs,
               "gpus": f"{int(record.gpus.min())}-{int(record.gpus.max())}",
               "job_sizes_fitted": len(fits)}
    # percentiles as observed gaps (the inverted CDF), as the data README quotes them
    restart = {"median_s": float(np.percentile(gap, 50, method="inverted_cdf")),
               "p90_s": float(np.percentile(gap, 90, method="inverted_cdf")),
               "mean_s": float(gap.mean()), "max_s": float(gap.max())}
    return RecordFit(record=record.name, attribution=record.attribution, summary=summary,
                     fits=fits, extra={"restart_gap": restart})
