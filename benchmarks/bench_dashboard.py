"""What-if replay speed: layercheck.contract.fastreplay against layercheck.contract.policy.replay.

    python benchmarks/bench_dashboard.py [--steps 10000] [--layers 31] [--repeat 7]

A 31-layer x 10,000-step run (layers drifting at different rates, warm-up then
cosine learning-rate decay), replayed at several settings as the what-if
sliders would set them. Prints a Markdown table: median and best time of each,
the speed-up, and whether the decisions are identical (they must be).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layercheck.contract.fastreplay import fast_replay  # noqa: E402
from layercheck.contract.policy import Policy, replay  # noqa: E402

SETTINGS = [  # (label, base threshold, smax, warm-up, interval)
    ("paper default K=1e-3", 1e-3, 1000, 200, 1),
    ("K=1e-2", 1e-2, 1000, 200, 1),
    ("K=1e-4", 1e-4, 1000, 200, 1),
    ("K=0 (every layer, every step)", 0.0, 1000, 200, 1),
    ("K=inf (Smax only)", np.inf, 1000, 200, 1),
    ("K=1e-3, Smax 100", 1e-3, 100, 50, 1),
    ("K=1e-3, interval 10", 1e-3, 1000, 200, 10),
]


def run(steps: int, layers: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    drift = rng.gamma(2.0, 0.5, size=(steps, layers)) * np.geomspace(3e-4, 3e-6, layers)
    t = np.arange(1, steps + 1)
    lr = np.where(t < 200, t / 200, 0.1 + 0.45 * (1 + np.cos(np.pi * (t - 200) / (steps - 200))))
    return drift, lr


def timed(fn, repeat: int) -> tuple[float, float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--layers", type=int, default=31)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    drift, lr = run(args.steps, args.layers)
    print(f"{args.layers} layers x {args.steps:,} steps, {args.repeat} repeats\n")
    print("| setting | layer writes | reference median ms | fast median ms | fast best ms "
          "| speed-up | method | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for label, k, smax, warmup, interval in SETTINGS:
        policy = Policy(base=np.full(args.layers, k), smax=smax, warmup_steps=warmup,
                        interval=interval, lr_scaling=True)
        ref_med, _, ref = timed(lambda: replay(policy, drift, lr), max(1, args.repeat // 2))
        med, best, fast = timed(lambda: fast_replay(policy, drift, lr), args.repeat)
        same = all(np.array_equal(a.layers, b[1]) and np.array_equal(a.reasons, b[2])
                   for a, b in zip(ref, fast.decisions()))
        print(f"| {label} | {int(fast.writes.sum()):,} | {ref_med * 1e3:.0f} | {med * 1e3:.1f} "
              f"| {best * 1e3:.1f} | {ref_med / med:.1f}x | {fast.method} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
