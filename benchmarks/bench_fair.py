"""Benchmark of the default command under the fair protocol (results: docs/benchmarks-sim.md).

    .venv/bin/python benchmarks/bench_fair.py [--repeat 3]

`python -m sim --mtbf 0.5h` searches every strategy's settings, checks the verdict's
bands and fresh seeds and prints the bill; its reference, measured in the same run and
interleaved with it, is the same command under the paper's protocol (`--protocol
matched`: every strategy at one cadence, the same verdict and bill). Each as a fresh
process, as a user runs it: wall and CPU seconds (the children's), and the ratio of the
fair command to the reference, min and median over the repeats, with the load average
before each pair. Target: the fair command answers in seconds (under 30 s of CPU on
one core of the development machine).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"fair": ["--mtbf", "0.5h"], "matched": ["--mtbf", "0.5h", "--protocol", "matched"]}


def _run(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -m sim ARGS`` as a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sim", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    _run(COMMANDS["fair"])                      # numba's cache and the presets, once
    seen: dict[str, list[tuple[float, float]]] = {k: [] for k in COMMANDS}
    loads = []
    for _ in range(args.repeat):
        loads.append(os.getloadavg()[0])
        for name, cmd in COMMANDS.items():
            seen[name].append(_run(cmd))
    for name, runs in seen.items():
        wall, cpu = np.array(runs).T
        print(f"{name:<8} wall min {wall.min():.1f} s median {np.median(wall):.1f} s; CPU min "
              f"{cpu.min():.1f} s median {np.median(cpu):.1f} s")
    ratio = np.array([f[1] / m[1] for f, m in zip(seen["fair"], seen["matched"])])
    print(f"fair / matched CPU: min {ratio.min():.2f} median {np.median(ratio):.2f}; load average "
          f"{min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
