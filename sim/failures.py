"""When failures strike: exponential (MTBF), Weibull (shape), or a replayed log.

Failures are wall-clock events, independent of what the job is doing: they
strike during compute, checkpoints and recoveries alike. A run draws them from
its own ``numpy.random.Generator``; every strategy in a comparison is run
against the same failure times (common random numbers). Standard variates are
scaled by the MTBF, so one seed also gives coupled failure times across MTBFs.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from layercheck.contract.userfile import read_csv_bytes

from .errors import SimError
from .units import DURATION_RANGE, is_duration, parse_duration

__all__ = ["FailureModel", "job_mtbf", "log_gamma", "read_failure_log", "weibull_from_exponential"]


def log_gamma(x):
    """``scipy.special.gammaln(x)``, scipy.special imported at the first call (a Weibull
    model): importing it costs 0.4-1.5 s that every user of the simulator's models (the
    dashboard's first page among them) would otherwise pay before drawing anything."""
    from scipy.special import gammaln as scipy_gammaln
    return scipy_gammaln(x)


Kind = Literal["exponential", "weibull", "log"]

MAX_GPUS = 2**53
"""The most GPUs a job-level MTBF divides by: counts float64 holds exactly (a larger
count only means a shorter MTBF, which the work bound refuses long before)."""
MAX_RUN_FAILURES = 1_000_000
"""The most failures one run draws (``failure_times`` stops there whatever was
estimated): the fast engine takes one loop turn per failure of the run with the
most, about 70 us a turn on one core, so about a minute (``sim.workbound``)."""


@dataclass(frozen=True, kw_only=True)
class FailureModel:
    """The distribution of time between failures (a renewal process)."""

    kind: Kind = "exponential"
    """exponential (memoryless, the Young/Daly model), weibull, or log."""
    shape: float = 1.0
    """Weibull shape k (k < 1: failures cluster, as field studies of large
    clusters report; k = 1 is exponential). Scale = MTBF / Gamma(1 + 1/k), taken
    in logarithms so that no shape overflows it; a shape so small that a run
    would draw too many failures is refused by the work bound (``sim.workbound``)."""
    log_times: tuple[float, ...] | None = None
    """kind='log': failure times in seconds from the start of the log,
    ascending. The log's gaps repeat cyclically; each seed starts at a random
    gap; gaps are rescaled to the requested MTBF unless it is None."""
    repeat: bool = True
    """kind='log': False plays the log once, from time 0, exactly as written (every
    seed alike): how a real run killed at those times is replayed."""

    def __post_init__(self) -> None:
        if self.kind not in ("exponential", "weibull", "log"):
            raise SimError(f"failure kind {self.kind!r}: use exponential, weibull or log")
        if not (math.isfinite(self.shape) and self.shape > 0):
            raise SimError(f"weibull shape={self.shape!r} must be a positive number (1 = exponential)")
        if self.kind == "log":
            times = np.asarray(self.log_times if self.log_times is not None else (), dtype=float)
            if times.size == 0:
                raise SimError("a failure log needs at least one failure time")
            if not all(is_duration(t) for t in (times[0], times[-1])) or (np.diff(times) <= 0).any():
                raise SimError(f"failure log times must be strictly increasing, each a positive "
                               f"duration from {DURATION_RANGE}")

    @classmethod
    def exact_log(cls, times_s) -> "FailureModel":
        """Failures at exactly ``times_s`` seconds from the start, once."""
        return cls(kind="log", log_times=tuple(float(t) for t in times_s), repeat=False)

    @property
    def coefficient_of_variation(self) -> float:
        """Standard deviation over mean of the gaps (1 for exponential; inf where it overflows)."""
        if self.kind == "exponential":
            return 1.0
        if self.kind == "weibull":
            k = self.shape
            with np.errstate(over="ignore", invalid="ignore"):
                ratio = float(np.exp(log_gamma(1 + 2 / k) - 2 * log_gamma(1 + 1 / k)))
            return math.sqrt(ratio - 1) if math.isfinite(ratio) and ratio > 1 else (
                math.inf if not math.isfinite(ratio) else 0.0)
        gaps = np.diff(np.concatenate(([0.0], self.log_times)))
        return float(gaps.std() / gaps.mean())

    def expected_failures(self, *, mtbf_s: float | None, window_s: float) -> float:
        """About how many failures one run over ``window_s`` draws: what the work bound
        (``sim.workbound``) checks before anything is drawn. A renewal process from a failure
        expects window/MTBF + (CV^2 - 1)/2 failures (the renewal theorem's second term:
        clustered gaps add failures); a log played once, its rows within the window."""
        if self.kind == "log" and not self.repeat:
            gaps = np.diff(np.concatenate(([0.0], self.log_times)))
            if mtbf_s is not None:
                gaps = gaps * (mtbf_s / gaps.mean())
            return float(np.searchsorted(np.cumsum(gaps), window_s, side="left"))
        mean = mtbf_s if mtbf_s is not None else self.log_mtbf
        rate = window_s / mean
        if self.kind == "log":
            return rate
        cv = self.coefficient_of_variation
        return rate + max(0.0, (cv * cv - 1) / 2) if math.isfinite(cv) else math.inf

    @property
    def own_mtbf_s(self) -> float | None:
        """The MTBF a run uses when none is given: a log's mean gap; None otherwise."""
        return self.log_mtbf

    def to_dict(self) -> dict:
        """JSON-ready (a report's ``scenario.failures``)."""
        return {"kind": self.kind, "shape": self.shape, "repeat": self.repeat}

    @property
    def log_mtbf(self) -> float | None:
        """Mean gap of the log (None unless kind='log')."""
        if self.kind != "log":
            return None
        return float(self.log_times[-1]) / len(self.log_times)

    def failure_times(self, rng: np.random.Generator, *, mtbf_s: float | None,
                      window_s: float, limit: int = MAX_RUN_FAILURES) -> np.ndarray:
        """Failure times in [0, window_s), ascending, drawn from ``rng``; ``SimError`` once
        more than ``limit`` are drawn before the window ends (the work bound's guarantee,
        whatever its estimate said)."""
        if mtbf_s is None and self.kind != "log":
            raise SimError("mtbf is required for exponential and weibull failures")
        if mtbf_s is not None and not (math.isfinite(mtbf_s) and mtbf_s > 0):
            raise SimError(f"mtbf={mtbf_s!r} must be a positive duration, e.g. 0.5h")
        chunk = int(min(max(64, 1.2 * window_s / (mtbf_s or self.log_mtbf) + 64), 1 << 22))
        parts, total = [], 0.0
        draw = self._sampler(rng, mtbf_s)
        while total < window_s and len(parts) * chunk <= limit:
            gaps = draw(chunk)
            parts.append(gaps)
            total += float(gaps.sum())
        times = np.cumsum(np.concatenate(parts))
        times = times[: np.searchsorted(times, window_s, side="left")]
        if len(times) > limit:
            raise SimError(f"a run drew more than {limit:,} failures before its {window_s:.3g}s "
                           "window ended, the simulator's limit per run (docs/sim.md, Work "
                           "limits): raise the MTBF, shorten the window or use a Weibull shape "
                           "nearer 1")
        return times

    def _sampler(self, rng: np.random.Generator, mtbf_s: float | None):
        if self.kind == "exponential":
            return lambda n: mtbf_s * rng.standard_exponential(n)
        if self.kind == "weibull":
            # k-th root of a standard exponential, scaled by MTBF / Gamma(1 + 1/k), in logs:
            # the same variates as rng.weibull, without Gamma(1 + 1/k) overflowing (k < 0.006)
            # or the root itself overflowing before the scale brings it back
            log_scale = math.log(mtbf_s) - float(log_gamma(1.0 + 1.0 / self.shape))
            return lambda n: weibull_from_exponential(rng.standard_exponential(n), self.shape,
                                                      log_scale)
        gaps = np.diff(np.concatenate(([0.0], np.asarray(self.log_times, dtype=float))))
        if mtbf_s is not None:
            gaps = gaps * (mtbf_s / gaps.mean())
        if not self.repeat:
            return _once(gaps)
        start = int(rng.integers(len(gaps)))
        state = {"at": start}

        def draw(n: int) -> np.ndarray:
            idx = (state["at"] + np.arange(n)) % len(gaps)
            state["at"] = (state["at"] + n) % len(gaps)
            return gaps[idx]
        return draw


def weibull_from_exponential(exponential: np.ndarray, shape: float, log_scale: float) -> np.ndarray:
    """Weibull variates of ``shape`` and scale e^log_scale from standard exponential ones
    (the k-th root, taken in logarithms so that neither overflows)."""
    with np.errstate(divide="ignore"):               # an exponential variate of 0: a gap of 0
        return np.exp(np.log(exponential) / shape + log_scale)


def _once(gaps: np.ndarray):
    """A sampler that yields ``gaps`` once, then gaps that end every window."""
    state = {"given": False}

    def draw(n: int) -> np.ndarray:
        if state["given"]:
            return np.full(n, np.inf)
        state["given"] = True
        return np.concatenate((gaps, np.full(max(0, n - len(gaps)), np.inf)))
    return draw


def job_mtbf(gpu_mtbf_s: float, gpus: int) -> float:
    """The job's MTBF when any of ``gpus`` independent GPUs failing stops it."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise SimError(f"gpus={gpus!r} must be an integer from 1 to 2**53 (a count float64 "
                       "holds exactly)")
    return gpu_mtbf_s / gpus


def read_failure_log(path: str | Path) -> tuple[float, ...]:
    """Failure times from a CSV: a column named ``time`` or ``time_s`` (or the only
    column), one failure per row, in seconds or with units (``3.1h``)."""
    path = Path(path)
    try:
        rows = list(csv.reader(read_csv_bytes(path).decode("utf-8").splitlines()))
    except (OSError, UnicodeDecodeError) as exc:       # RefusedFile too: a FIFO, /dev/zero
        raise SimError(f"failure log {path}: cannot read ({exc})") from None
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    if not rows:
        raise SimError(f"failure log {path}: empty; write one failure time per row")
    header = [c.strip().lower() for c in rows[0]]
    column = next((header.index(n) for n in ("time_s", "time") if n in header), None)
    if column is None and len(header) == 1 and not _is_number(header[0]):
        column = 0
    if column is not None:
        rows = rows[1:]
    elif len(header) > 1:
        raise SimError(f"failure log {path}: name the failure-time column 'time' or 'time_s'")
    column = column or 0
    try:
        times = [parse_duration(r[column], what=f"{path} time") for r in rows]
    except (SimError, IndexError) as exc:
        raise SimError(f"failure log {path}: {exc}") from None
    return tuple(sorted(times))


def _is_number(text: str) -> bool:
    try:
        parse_duration(text)
    except SimError:
        return False
    return True
