"""The validation job's steps under LayerCheck and under tiered, interleaved: is a slow step the tier's or the machine's?

    python benchmarks/tier_step_pace.py [--rounds 2] [--steps 8]

The job a validation of ``traces/minilm-200steps`` runs (MiniLM, batch 8, 64 tokens,
2 threads), built once; per round, ``--steps`` steps under ``LayerCheckpointer`` (the
library, no memory tier) and as many under ``TieredCheckpointer`` (the library with
its memory tier in a fresh tmpfs folder), in that order. Printed: the load average and,
per strategy, the median of each step's compute (``job.step``: forward, backward,
optimizer, drift tracking) and of its save's stall (``Saved.stall_s``: for tiered the
memory tier's copy of the whole state), the first step of each checkpointer left out.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    from profiler.checkpointers.layerwise import LayerCheckpointer
    from profiler.checkpointers.tiered import TieredCheckpointer
    from profiler.config import CaptureConfig
    from profiler.failures.nodes import NodeMemory
    from profiler.jobs.plain import PlainJob
    config = CaptureConfig(model="minilm", steps=200, batch_size=8, seq_len=64, threads=2)
    job = PlainJob.prepare(config, say=lambda _: None)
    root = Path(tempfile.mkdtemp(prefix="tier-step-pace-"))
    node = NodeMemory(root)
    print(f"load average at the start: {os.getloadavg()}")
    samples: dict[str, list[tuple[float, float]]] = {"layercheck": [], "tiered": []}
    position = 0
    try:
        for r in range(args.rounds):
            for name in samples:
                folder = root / f"{name}{r}"
                ckpt = (TieredCheckpointer(job, folder, tier=str(node.folder))
                        if name == "tiered" else LayerCheckpointer(job, folder))
                for step in range(1, args.steps + 1):
                    start = time.perf_counter()
                    job.step(position)
                    compute = time.perf_counter() - start
                    position += config.batch_size
                    saved = ckpt.save(step, position)
                    if step > 1:
                        samples[name].append((compute, saved.stall_s))
                ckpt.flush()
                ckpt.close()
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()}")
    for name, values in samples.items():
        print(f"{name:10s} compute median {statistics.median(c for c, _ in values):.3f} s, "
              f"stall median {statistics.median(s for _, s in values):.3f} s "
              f"({len(values)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
