"""The memory tier's stall and the buddy's send, each against its floor, side by side in one run.

    python benchmarks/memory_tier.py [--mb 128] [--rounds 10] [--folder /dev/shm/...]
                                     [--out docs/benchmarks-memory-tier.json]

The job: an MLP of ``--mb`` MB of training state (weights and both AdamW moments,
after one real step), under a ``ModuleSource`` as LayerCheck holds it.

**Stall** (one process), per round, in an order that alternates between rounds:

- *tier*: what ``LayerCheck.step()`` spends on the memory tier on the training
  thread (``Tiers.step``: the training state captured, every layer's live
  tensors copied into its mapped tmpfs file), the previous step's commit
  (checksums, marker) already done, as it is when a step's compute outlasts it;
- *host copy*: the snapshot LayerCheck already takes of the same tensors
  (``hostcopy.host``: a new host tensor each, the copy a durable write starts from);
- *preallocated copy*: the same bytes copied into buffers allocated once (the
  floor: a memcpy).

**Buddy send** (two processes over gloo on this host, buddies of each other),
per round, alternating: *buddy*: ``BuddyLink.exchange`` of a committed slot
(send this rank's slot while receiving the other's into a ward slot, commit it);
*plain*: a plain ``isend``/``irecv`` pair of the same bytes as one tensor each way.

Printed (and ``--out``): per variant min and median seconds, per round the ratios
tier / host copy, tier / preallocated copy and buddy / plain, their min and
median, and the load average at the start and at the end. Targets: tier <= 1.2x a
host copy, buddy <= 1.2x a plain send.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck, whatever is installed


def job(mb: int):
    """(model, optimizer, ModuleSource) of an MLP holding about ``mb`` MB of state."""
    import torch
    from torch import nn

    from layercheck.backends.layermap import LayerMap
    from layercheck.backends.source import ModuleSource
    torch.manual_seed(0)
    width = 1024
    layers = max(1, round(mb * 2**20 / (3 * 4 * (width * width + width))))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    return model, optimizer, ModuleSource(model, optimizer, LayerMap.for_model(model))


def stall(args, folder: Path) -> dict:
    import torch

    from layercheck.backends.hostcopy import host
    from layercheck.snapshot import capture_state
    from layercheck.tiers.memory import MemoryTier
    from layercheck.tiers.tiered import live_tensors
    _, optimizer, source = job(args.mb)
    layers = range(len(source.layer_map))
    tier = MemoryTier(str(folder), 0, 1 << 40)
    live = [live_tensors(source, i) for i in layers]
    buffers = [{k: torch.empty_like(t) for k, t in d.items()} for d in live]
    nbytes = sum(t.numel() * t.element_size() for d in live for t in d.values())

    def tier_step(step: int) -> None:
        items = {f"L{i}": live_tensors(source, i) for i in layers}
        tensors, document = capture_state(step, optimizer, None, None)
        items["state"] = tensors
        tier.write(step, items, document)

    def host_copy(step: int) -> None:
        for i in layers:
            {k: host(t) for k, t in live_tensors(source, i).items()}
        capture_state(step, optimizer, None, None)

    def preallocated(step: int) -> None:
        for d, into in zip((live_tensors(source, i) for i in layers), buffers):
            for k, t in d.items():
                into[k].copy_(t)
        capture_state(step, optimizer, None, None)

    variants = {"tier": tier_step, "host copy": host_copy, "preallocated copy": preallocated}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(1, 3):  # the tier's files exist and are mapped; pages touched
        tier_step(step)
        tier.wait()
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            tier.wait()  # the previous commit done: a step's compute outlasts it
            start = time.perf_counter()
            variants[name](10 + r)
            times[name].append(time.perf_counter() - start)
    tier.close()
    return {"bytes": nbytes, "times": times,
            "ratios": {"tier / host copy": _ratios(times["tier"], times["host copy"]),
                       "tier / preallocated copy": _ratios(times["tier"],
                                                           times["preallocated copy"])}}


def _ratios(a: list[float], b: list[float]) -> dict:
    r = [x / y for x, y in zip(a, b)]
    return {"min": min(r), "median": statistics.median(r), "rounds": r}


def _buddy_rank(rank: int, store: str, args, folder: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from layercheck.tiers.buddy import BuddyLink
    from layercheck.tiers.memory import MemoryTier
    from layercheck.tiers.tiered import live_tensors
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    _, _, source = job(args.mb)
    mine = os.path.join(folder, f"node{rank}")
    link = BuddyLink(mine, f"node{rank}", None, 600.0)
    tier = MemoryTier(mine, rank, 1 << 40)
    items = {f"L{i}": live_tensors(source, i) for i in range(len(source.layer_map))}
    tier.write(1, items, {})
    tier.wait()
    slot, record = tier.newest()
    nbytes = sum(item["nbytes"] for item in record["items"].values())
    plain_out = torch.ones(nbytes, dtype=torch.uint8)
    plain_in = torch.empty(nbytes, dtype=torch.uint8)
    group = link.group

    def plain() -> None:
        works = [dist.isend(plain_out, 1 - rank, group=group, tag=99),
                 dist.irecv(plain_in, 1 - rank, group=group, tag=99)]
        for work in works:
            work.wait()

    variants = {"buddy": lambda: link.exchange(slot, record), "plain": plain}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in variants:  # warm: the ward's files exist and are mapped
        variants[name]()
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            dist.barrier(group=group)
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": nbytes, "times": times,
                                         "ratios": {"buddy / plain": _ratios(times["buddy"],
                                                                             times["plain"])}}))
    tier.close()
    link.close()
    dist.destroy_process_group()


def buddy(args, folder: Path) -> dict:
    import torch.multiprocessing as mp
    out = folder / "buddy.json"
    mp.spawn(_buddy_rank, args=(str(folder / "store"), args, str(folder), str(out)), nprocs=2)
    return json.loads(out.read_text())


def summary(name: str, part: dict) -> list[str]:
    lines = [f"{name}: {part['bytes'] / 2**20:.1f} MiB"]
    for variant, t in part["times"].items():
        lines.append(f"  {variant:<18} min {min(t) * 1e3:8.2f} ms  median "
                     f"{statistics.median(t) * 1e3:8.2f} ms")
    for ratio, r in part["ratios"].items():
        lines.append(f"  {ratio:<26} min {r['min']:.3f}  median {r['median']:.3f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=128, help="MB of training state (default 128)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--folder", default=None, help="a tmpfs folder (default: under /dev/shm)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lc-memtier-bench-", dir=args.folder or (
        "/dev/shm" if os.path.isdir("/dev/shm") else None)))
    load = os.getloadavg()
    try:
        result = {"stall": stall(args, folder / "stall"), "buddy": buddy(args, folder)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["load_average"] = {"start": load, "end": os.getloadavg()}
    result["command"] = "python benchmarks/memory_tier.py " + " ".join(sys.argv[1:])
    for line in summary("memory tier stall", result["stall"]) + summary("buddy send",
                                                                         result["buddy"]):
        print(line)
    print(f"load average: start {load[0]:.2f}, end {result['load_average']['end'][0]:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
