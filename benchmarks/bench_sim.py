"""Benchmark of the failure simulator (results: docs/benchmarks-sim.md).

    .venv/bin/python benchmarks/bench_sim.py [--repeat 3]

1. The issue's sweep: 20 MTBFs log-spaced 0.01 h..3 h x every strategy (7) x 10 seeds,
   each run a 30-day window, on the default preset (Qwen2.5-7B), plus the perfect
   checkpointer's curve. Target: under 60 s.
2. Simulated events per second over that sweep. An event is a failure, a
   completed recovery, a checkpoint taken or a job finished; the engine jumps
   between failures, so checkpoints between two failures cost one binary
   search, not one step each. Also reported: failures per second alone (the
   part the engine processes one by one, per lane). Target: >= 500,000/s.
3. The default command, `python -m sim --mtbf 0.5h`, in-process.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from sim import Scenario, simulate, sweep


def _sweep(scenario: Scenario):
    start, cpu = time.perf_counter(), time.process_time()
    df = sweep(scenario, mtbf_s=np.geomspace(36.0, 10800.0, 20), seeds=10)
    df.attrs["cpu_s"] = time.process_time() - cpu
    return time.perf_counter() - start, df


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scenario = Scenario.from_preset("qwen2.5-7b")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}")
    for i in range(args.repeat):
        seconds, df = _sweep(scenario)
        events = df.attrs["events"]
        runs = df[df.strategy != "limit"]
        failures = float((runs.failures * 10).sum())
        print(f"sweep run {i + 1}: {seconds:.1f} s wall ({df.attrs['cpu_s']:.1f} s CPU) for {len(runs)} (MTBF, strategy) points x 10 seeds "
              f"+ limit; {events:,.0f} events -> {events / seconds:,.0f} events/s; "
              f"{failures:,.0f} failures -> {failures / seconds:,.0f} failures/s")
    start = time.perf_counter()
    simulate(scenario, mtbf_s=1800.0, seeds=10)
    print(f"default command (simulate at MTBF 0.5 h, 10 seeds, 30 days): "
          f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
