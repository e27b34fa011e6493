"""Soak: 10,000 steps with the background writer; resident memory stays bounded.

    python benchmarks/bench_soak.py [--steps 10000] [--queue-mib 2] [--slow-ms 1] [--json F]

A small residual MLP writes every layer at every step (threshold 0: the most
snapshots the writer can be given) into a store that sleeps ``--slow-ms`` per
file, so the writer lags and the queue sits full (backpressure is the steady
state, the worst case for memory). ``gc`` runs every 1,000 steps so the disk
does not fill. Every 50 steps the process's resident memory (VmRSS) and the
writer's pending bytes are sampled; the writer's own ``WriteRecord`` log is
never drained, as in a loop that ignores it.

Passes (exit 0) when the pending bytes never exceed ``queue_bytes`` (one job
may exceed it only when the queue is empty) and the median RSS of the last
10% of the steps is within 1 MiB of the median of steps 45-55%: no growth
with the number of steps once warm. (The first half holds the one-time
costs: the allocator's arenas for the writer threads, and the WriteRecord
log filling up to its cap of 10,000 records, at step 2,000 here. A leak of
one record per layer write, ~150 B x 5 a step, would add ~3.6 MiB over the
second half.)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.tools.cleanup import collect_garbage  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402

WIDTH, BLOCKS, BATCH = 64, 4, 8
MIB = 1 << 20


class SlowStore:
    """A LocalStore whose atomic writes take ``delay`` seconds longer (slow storage)."""

    def __init__(self, root: Path, delay: float) -> None:
        self.inner, self.delay, self.url = LocalStore(root), delay, str(root)

    def write_atomic(self, path: str, data: bytes) -> None:
        time.sleep(self.delay)
        self.inner.write_atomic(path, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS)], nn.Linear(WIDTH, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def soak(steps: int, queue_bytes: int, slow_s: float, directory: Path) -> dict:
    model, opt = build()
    store = SlowStore(directory, slow_s)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1, smax=10,
                           queue_bytes=queue_bytes)
    samples, pending_peak, job_peak, stall = [], 0, 0, 0.0
    rss_before = rss_bytes()
    lc = LayerCheck(model, opt, store, cfg)
    lc.restore()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        x = torch.randn(BATCH, WIDTH)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        report = lc.step()
        stall += report.stall_s
        job_peak = max(job_peak, report.bytes_queued)
        pending_peak = max(pending_peak, lc.writer._pending)
        if step % 50 == 0:
            samples.append((step, rss_bytes(), lc.writer._pending))
        if step % 1000 == 0:
            lc.close()
            collect_garbage(store, keep=1)
            lc = LayerCheck(model, opt, store, cfg)
            lc.restore()
    lc.close()
    elapsed = time.perf_counter() - started

    def window(lo: int, hi: int) -> float:
        return statistics.median(r for s, r, _ in samples if lo <= s <= hi)

    early = window(int(steps * 0.45), int(steps * 0.55))
    late = window(int(steps * 0.9), steps)
    return {
        "steps": steps, "queue_bytes": queue_bytes, "slow_ms_per_file": slow_s * 1e3,
        "job_bytes_max": job_peak, "pending_bytes_peak": pending_peak,
        "pending_within_queue": pending_peak <= max(queue_bytes, job_peak),
        "rss_before_mib": rss_before / MIB, "rss_max_mib": max(r for _, r, _ in samples) / MIB,
        "rss_median_mid_mib": early / MIB, "rss_median_late_mib": late / MIB,
        "rss_growth_late_vs_mid_mib": (late - early) / MIB,
        "rss_max_above_before_mib": (max(r for _, r, _ in samples) - rss_before) / MIB,
        "training_stall_s": stall, "seconds": elapsed,
        "samples": [[s, round(r / MIB, 2), p] for s, r, p in samples[::10]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--queue-mib", type=float, default=2.0)
    ap.add_argument("--slow-ms", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, help="checkpoint folder (default: a temporary one, in "
                    "/dev/shm when there is one: this measures memory, not the disk)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="bench-soak-", dir=base) as tmp:
        result = soak(args.steps, int(args.queue_mib * MIB), args.slow_ms / 1e3,
                      args.dir or Path(tmp) / "ckpt")
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bounded = result["pending_within_queue"] and result["rss_growth_late_vs_mid_mib"] <= 1.0
    return 0 if bounded else 1


if __name__ == "__main__":
    sys.exit(main())
