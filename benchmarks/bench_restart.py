"""Does a worker that has written checkpoints restart slower? The restart probe, both ways, in one run.

    python benchmarks/bench_restart.py [--trace traces/minilm-200steps] [--rounds 3]
                                       [--every 6] [--out restart.json]

The calibration's restart probe (``profiler.mechanisms.restart``) SIGKILLs a worker
that has trained ``VICTIM_STEPS`` steps and written nothing, then times its
successor from the kill to ``ready``. A validation's workers are killed after
writing checkpoints. Per round, in an order that alternates (the quiet victim first
in even rounds, the checkpointing one in odd ones), on the trace's job:

- **quiet victim**: the probe as the calibration runs it;
- **checkpointing victim**: the same, the victim saving DeepSpeed checkpoints every
  ``--every`` steps and killed after two saves and a further 0 to ``every - 1``
  steps (spread over the rounds: a failure falls anywhere in the save cycle).

Prints per variant min and median seconds, min and median of the per-round ratio
checkpointing / quiet, the page cache (``Cached`` of /proc/meminfo) and the load
average at the start and the end; ``--out`` writes the same as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from layercheck.contract.trace import read_trace  # noqa: E402
from profiler.calibrate import job_spec  # noqa: E402
from profiler.mechanisms.restart import time_restart  # noqa: E402

SAVES = 2


def _cached_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) // 1024
    return -1


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "traces" / "minilm-200steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.every < 1:
        parser.error("--rounds and --every must be at least 1")
    if not (args.trace / "manifest.json").is_file():
        parser.error(f"{args.trace} is not a trace folder (no manifest.json): "
                     "pass --trace traces/NAME")
    trace = read_trace(args.trace)
    config = job_spec(trace, str(args.trace))
    start = {"load_average": _load(), "cached_mb": _cached_mb()}
    times: dict[str, list[float]] = {"quiet": [], "checkpointing": []}
    for r in range(args.rounds):
        order = ("quiet", "checkpointing") if r % 2 == 0 else ("checkpointing", "quiet")
        for variant in order:
            kill_at = SAVES * args.every + r * args.every // args.rounds
            with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
                if variant == "quiet":
                    seconds = time_restart(config, "cpu", Path(tmp)).seconds
                else:
                    seconds = time_restart(config, "cpu", Path(tmp), every=args.every,
                                           kill_at=kill_at).seconds
            times[variant].append(seconds)
            print(f"round {r} {variant:>13}: {seconds:.2f} s", flush=True)
    ratios = [c / q for c, q in zip(times["checkpointing"], times["quiet"])]
    doc = {"command": "python benchmarks/bench_restart.py " + " ".join(argv or sys.argv[1:]),
           "trace": trace.name, "every": args.every, "rounds": args.rounds, "seconds": times,
           "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
           "start": start, "end": {"load_average": _load(), "cached_mb": _cached_mb()}}
    for variant, values in times.items():
        print(f"{variant:>13}: min {min(values):.2f} s, median {statistics.median(values):.2f} s")
    print(f"checkpointing / quiet: min {doc['ratio_min']:.3f}, median {doc['ratio_median']:.3f}; "
          f"page cache {start['cached_mb']} -> {doc['end']['cached_mb']} MB; load average "
          f"{start['load_average']} -> {doc['end']['load_average']}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    main()
