"""The simulator's predictions against real runs killed at known times (issue 11, part 3).

    python benchmarks/bench_validation.py [--trace traces/minilm-200steps] [--capture]
        [--window 600] [--mtbf 150] [--seed 0] [--interval K] [--json docs/validation.json]

The full version of ``python -m profiler validate``: for a calibrated plain
MiniLM capture (``--capture`` makes one first: ``python -m profiler capture
--out TRACE``, 200 steps, calibration included), a failure log drawn with
mean gap ``--mtbf`` over ``--window`` seconds, then per strategy (deepspeed:
a synchronous full save every k steps; checkfreq: dcp.async_save every k
steps; layercheck: the library) a real run of the capture's job on this CPU
for the window, its worker SIGKILLed at each failure time and restarted,
and the simulator on the same trace, costs.json, log, window and k. Prints
the table (measured ratio, predicted ratio, relative error, failures,
window) and the measured and predicted parts, and writes the JSON.

Goal (issue 11): within 5% relative for each strategy. The machine must be
quiet: the runs' compute is measured while they run, the prediction uses
the capture's, and another job's load changes both restarts and steps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "traces" / "minilm-200steps")
    parser.add_argument("--capture", action="store_true",
                        help="capture (and calibrate) the trace first")
    parser.add_argument("--window", default="600")
    parser.add_argument("--mtbf", default="150")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=int)
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "validation.json")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    if args.capture:
        _run([sys.executable, "-m", "profiler", "capture", "--quiet", "--out", str(args.trace)],
             env)
    command = [sys.executable, "-m", "profiler", "validate", "--trace", str(args.trace),
               "--window", args.window, "--mtbf", args.mtbf, "--seed", str(args.seed),
               "--out", str(args.json)]
    if args.interval is not None:
        command += ["--interval", str(args.interval)]
    _run(command, env)
    doc = json.loads(args.json.read_text())
    print("\nparts (seconds), measured / predicted:")
    for row in doc["table"]:
        parts = ", ".join(f"{k[9:]} {row[k]:.1f}/{row['predicted_' + k[9:]]:.1f}"
                          for k in row if k.startswith("measured_") and k != "measured_ratio")
        print(f"  {row['strategy']:11s} {parts}")
    worst = max(abs(row["relative_error"]) for row in doc["table"])
    print(f"\nworst relative error {worst:.2%} (goal: 5%); load average "
          f"{doc['load_average']['start'][0]:.1f} at the start, "
          f"{doc['load_average']['end'][0]:.1f} at the end")
    return 0


def _run(command: list[str], env: dict[str, str]) -> None:
    print("$ " + " ".join(command[1:]), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(done.returncode)


if __name__ == "__main__":
    sys.exit(main())
