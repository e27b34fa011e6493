"""Frontier speed: every setting of a grid at once against one replay per setting.

    python benchmarks/bench_frontier.py [--trace traces/qwen2.5-7b-synthetic] [--repeat 5]

Variant: ``sim.frontier.evaluate`` of the trace's default grid (400 settings: 10 base
thresholds x 5 embedding thresholds x 4 Smax x 2 intervals), one ``layercheck.contract.lanes``
replay of all of them plus their measures. Reference, in the same run and
interleaved with it: the same settings one by one, each replayed with
``layercheck.contract.fastreplay.fast_replay`` (the fastest single-setting replay) and
measured with ``layercheck.contract.trace``'s weighted staleness, as the What-if view
measures one setting. Every number of every setting must agree. Prints min and
median of each and the load average (the machine is shared), then the time to
simulate the effective ratio of the Pareto points (not part of the replay).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layercheck.contract.fastreplay import fast_replay  # noqa: E402
from layercheck.contract.trace import last_written, read_trace  # noqa: E402
from sim.api import Scenario  # noqa: E402
from sim.frontier import Grid, _policies, evaluate, rate  # noqa: E402


def reference(trace, configs):
    """One replay and one measurement per setting, in a Python loop."""
    drift, ratio = trace.drift_matrix(), np.nan_to_num(trace.lr_ratio(), nan=1.0)
    steps = np.arange(1, trace.num_steps + 1)
    rows = []
    for policy in _policies(trace, configs):
        written = fast_replay(policy, drift, ratio).writes
        series = trace.weighted_staleness(written)
        defined = ~np.isnan(series)
        oldest = steps[defined] - last_written(written)[defined].min(axis=1)
        rows.append((int(written.sum()), float((written @ trace.layer_bytes).sum()),
                     int(oldest.max()) if oldest.size else 0,
                     float(series[defined].mean()) if defined.any() else 0.0))
    return np.array(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="traces/qwen2.5-7b-synthetic")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    trace = read_trace(args.trace)
    configs = Grid.for_trace(trace).configs()
    print(f"{trace.name}: {len(trace.layer_names)} layers x {trace.num_steps:,} steps, "
          f"{len(configs)} settings, {args.repeat} interleaved repeats, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    fast, ref = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = evaluate(trace, configs)
        fast.append(time.perf_counter() - start)
        start = time.perf_counter()
        expected = reference(trace, configs)
        ref.append(time.perf_counter() - start)
    t = result.table
    same = (np.array_equal(t["layer_writes"], expected[:, 0])
            and np.array_equal(t["bytes_written"], expected[:, 1])
            and np.array_equal(t["max_staleness"], expected[:, 2])
            and np.allclose(t["mean_weighted_staleness"], expected[:, 3], rtol=1e-9, atol=0))
    print("| method | min s | median s | identical |")
    print("|---|---|---|---|")
    print(f"| frontier: all settings at once (sim.frontier.evaluate) | {min(fast):.2f} | "
          f"{statistics.median(fast):.2f} | {'yes' if same else 'NO'} |")
    print(f"| reference: fast_replay per setting + measures | {min(ref):.2f} | "
          f"{statistics.median(ref):.2f} | |")
    print(f"\nspeed-up (medians) {statistics.median(ref) / statistics.median(fast):.1f}x; "
          f"{result.lanes.reasons.shape[1]:,} lanes for {len(configs) * len(trace.layer_names):,} "
          f"(setting, layer) pairs; load average now {os.getloadavg()[0]:.1f}")
    if trace.costs is not None:
        front = np.flatnonzero(t["pareto"])
        start = time.perf_counter()
        rate(result, Scenario.from_trace(trace), rows=front, mtbf_s=1800.0, seeds=10)
        print(f"effective ratio of the {len(front)} Pareto points (MTBF 0.5 h, 10 seeds, 30-day "
              f"window, one engine run): {time.perf_counter() - start:.2f} s")
    if not same:
        sys.exit("the frontier and the reference disagree")


if __name__ == "__main__":
    main()
