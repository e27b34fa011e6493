"""Benchmark of the default command under the fair protocol (results: docs/benchmarks-sim.md,
docs/benchmarks-dashboard.md).

    .venv/bin/python benchmarks/bench_fair.py [--repeat 3]
    .venv/bin/python benchmarks/bench_fair.py --against 2911603 [--repeat 5]

`python -m sim --mtbf 0.5h` searches every strategy's settings, checks the verdict's
bands and fresh seeds and prints the bill; its reference, measured in the same run and
interleaved with it, is the same command under the paper's protocol (`--protocol
matched`: every strategy at one cadence, the same verdict and bill). Each as a fresh
process, as a user runs it: wall and CPU seconds (the children's), and the ratio of the
fair command to the reference, min and median over the repeats, with the load average
before each pair. Target: the fair command answers in seconds (under 30 s of CPU on
one core of the development machine).

``--against REF``: the reference is instead the same command (``--mtbf 0.5h --no-bands
--json``, the dashboard's default job: ``--args`` to change it) run from commit REF's
tree (``git archive`` into a temporary folder), so a faster search is timed against the
one it replaces, interleaved, and its output must be the old one's byte for byte (the
JSON's ``seconds`` aside): the run stops at the first difference.
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"fair": ["--mtbf", "0.5h"], "matched": ["--mtbf", "0.5h", "--protocol", "matched"]}
SEARCH = "--mtbf 0.5h --no-bands --json"
"""The search the dashboard's My job page opens on, as ``--against`` times it."""


def _run(args: list[str], root: Path = ROOT) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``python -m sim ARGS`` as a fresh process in ``root``, and
    its output without the JSON's timing line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sim", *args], cwd=root, check=True,
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = "\n".join(line for line in out.stdout.splitlines() if '"seconds":' not in line)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), text


def _tree(ref: str, into: Path) -> Path:
    """Commit ``ref``'s files in ``into`` (``git archive``)."""
    archive = into / "ref.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, stdout=f)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def _report(seen: dict[str, list[tuple[float, float, str]]], names: tuple[str, str],
            loads: list[float]) -> None:
    for name, runs in seen.items():
        wall, cpu = np.array([r[:2] for r in runs]).T
        print(f"{name:<10} wall min {wall.min():.1f} s median {np.median(wall):.1f} s; CPU min "
              f"{cpu.min():.1f} s median {np.median(cpu):.1f} s")
    a, b = names
    for i, what in ((1, "CPU"), (0, "wall")):
        ratio = np.array([x[i] / y[i] for x, y in zip(seen[a], seen[b])])
        print(f"{a} / {b} {what}: min {ratio.min():.2f} median {np.median(ratio):.2f}")
    print(f"load average before each pair {min(loads):.1f}-{max(loads):.1f} "
          f"({os.cpu_count()} CPUs)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", metavar="REF", help="time the search against commit REF's")
    parser.add_argument("--args", default=SEARCH, help=f"with --against: the command's "
                        f"arguments (default {SEARCH!r})")
    args = parser.parse_args()
    loads: list[float] = []
    if args.against is None:
        _run(COMMANDS["fair"])                      # numba's cache and the presets, once
        seen: dict[str, list] = {k: [] for k in COMMANDS}
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for name, cmd in COMMANDS.items():
                seen[name].append(_run(cmd))
        _report(seen, ("fair", "matched"), loads)
        return
    command = shlex.split(args.args)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"this tree": ROOT, args.against: _tree(args.against, Path(tmp))}
        for root in roots.values():
            _run(command, root)                     # each tree's numba cache, once
        seen = {name: [] for name in roots}
        print(f"python -m sim {args.args}: this tree against {args.against}, {args.repeat} "
              "interleaved repeats")
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for name, root in roots.items():
                seen[name].append(_run(command, root))
            if seen["this tree"][-1][2] != seen[args.against][-1][2]:
                sys.exit(f"the output differs from {args.against}'s: not the same search")
        _report(seen, ("this tree", args.against), loads)
        print("output: the same, byte for byte (the JSON's seconds aside)")


if __name__ == "__main__":
    main()
