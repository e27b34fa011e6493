"""How well the probes beside a validation's runs estimated each run's own restarts.

``python -m profiler.failures.estimates VALIDATION.json [...]`` reads validation
documents (``profiler.failures.validate``) and, per file and over all, compares
each run's restart per failure with two estimates a validation can make before it
predicts: the median of the probe just before the run (``before``), and the median
of that probe and the restarts just after it (``bracketed``: the probe's own
``after_s`` where the document has them, else the next run's probe; the last run of
a document without them has none and keeps ``before``). It prints the root mean
square and the mean of estimate - run, in seconds a failure.

A run's restart per failure is solved from its measured total (``restart_s``: every
restart from the kill to the successor's ready) and its failure log: the one
``x`` with sum over failures of min(x, the time to the next failure or the window's
end) equal to the total, since a failure during a restart ends that restart there.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

__all__ = ["restart_per_failure", "estimate_errors", "main"]


def restart_per_failure(restart_s: float, failures_s: list[float], window_s: float) -> float:
    """The restart ``x`` of every failure that the measured total ``restart_s`` means
    (module doc), found by bisection; 0 with no failure."""
    if not failures_s or restart_s <= 0:
        return 0.0
    gaps = [later - t for t, later in zip(failures_s, failures_s[1:])] + [window_s - failures_s[-1]]
    if restart_s >= sum(gaps):
        raise ValueError(f"a restart total of {restart_s:g} s is longer than the window "
                         f"after the first failure allows ({sum(gaps):g} s)")
    low, high = 0.0, max(gaps)
    for _ in range(60):
        middle = (low + high) / 2
        over = sum(min(middle, g) for g in gaps) > restart_s
        low, high = (low, middle) if over else (middle, high)
    return (low + high) / 2


def estimate_errors(doc: dict[str, Any]) -> dict[str, list[float]]:
    """Per estimate (``before``, ``bracketed``), estimate - run for every run of
    ``doc`` in the order the validation ran them, in seconds a failure."""
    runs = [(run, row["strategy"]) for run in doc["runs"] for row in run["table"]]
    out: dict[str, list[float]] = {"before": [], "bracketed": []}
    for i, (run, strategy) in enumerate(runs):
        probe = run["probes"][strategy]
        own, after = list(probe["restarts_s"]), list(probe.get("after_s", []))
        if not after and i + 1 < len(runs):
            after = list(runs[i + 1][0]["probes"][runs[i + 1][1]]["restarts_s"])
        actual = restart_per_failure(run["measured"][strategy]["restart_s"], run["failures_s"],
                                     doc["window_s"])
        out["before"].append(statistics.median(own) - actual)
        out["bracketed"].append(statistics.median(own + after) - actual)
    return out


def _line(name: str, errors: list[float]) -> str:
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return (f"  {name:10s} root mean square {rms:.2f} s, mean {statistics.fmean(errors):+.2f} s "
            f"({len(errors)} runs)")


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m profiler.failures.estimates VALIDATION.json [...]", file=sys.stderr)
        return 2
    total: dict[str, list[float]] = {"before": [], "bracketed": []}
    for path in paths:
        try:
            errors = estimate_errors(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{path}: not a validation document with probes ({exc!r}): give the "
                  "validation.json of `python -m profiler validate`", file=sys.stderr)
            return 2
        print(path)
        for name, values in errors.items():
            print(_line(name, values))
            total[name] += values
    if len(paths) > 1:
        print("all")
        for name, values in total.items():
            print(_line(name, values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
