"""LayerCheck on a GPU: MiniLM captured on CUDA; stall, drift share and the writer against their references.

    python benchmarks/gpu_capture.py [--steps 300] [--repeats 12] [--quick]
                                     [--out docs/benchmarks-gpu.json]

Prepared for a lent GPU (one process, one device; about 3-6 minutes on an
A100/H100-class card, well inside 10). It has not run on a GPU yet; ``--device
cpu`` runs the same measurements on the CPU, to check the script, not for
figures. Three parts, each against its reference measured in the same run:

1. **Capture**: ``python -m profiler capture --model minilm --device cuda
   --steps S --no-calibrate`` (the README's job: MiniLM-L6 masked LM, batch 8 x
   64, the paper's thresholds scaled to the run), in a subprocess as a user
   runs it. From its trace: drift's and the stall's share of the step (the
   drift hook's GPU time where it exceeds the host's, ``DriftTracker.hook_seconds``),
   the step's phases, the bytes written against a full checkpoint at every
   step, and the writer's persist times.
2. **Stall against a pinned-memory copy**: the same job in this process with
   LayerCheck writing every layer at every step (thresholds 0: a full
   snapshot, the largest stall), ``--repeats`` rounds. Per round: one training
   step, then ``lc.step()``, whose stall (``StepReport.stall_s``: the policy and
   the host copies, queued on a side stream into pinned memory, and the fence)
   is compared with a device-to-host copy of the same tensors (every weight,
   exp_avg and exp_avg_sq) into preallocated pinned memory, waited for, and
   with a plain ``.cpu()`` of them (pageable memory, synchronous).
3. **The writer against torch.save**: in the same rounds, LayerCheck's
   background writer's time for that snapshot (``lc.flush()`` right after the
   step: the files written, checksummed, fsynced and committed) against
   ``torch.save`` of the model's and optimizer's state dicts (the same bytes and
   more) to the same disk, then fsync.

The order of the three timed things rotates every round. Prints min and median
of each ratio with the load average, and writes every round to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck and profiler, whatever is installed


def _ratios(values) -> dict:
    values = list(values)
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def capture_part(device: str, steps: int, scratch: Path) -> dict:
    """Part 1: the profiler's capture, as a user runs it; its trace's summary."""
    from layercheck.contract.trace import read_trace
    from profiler.capture import summarize
    out = scratch / "trace"
    command = [sys.executable, "-m", "profiler", "capture", "--model", "minilm", "--device",
               device, "--steps", str(steps), "--no-calibrate", "--quiet", "--out", str(out),
               "--ckpt", str(scratch / "capture-ckpt")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_capture: the capture failed:\n{done.stderr[-3000:]}")
    trace = read_trace(out)
    s = summarize(trace)
    steps_table = trace.steps
    return {"command": " ".join(command[1:]), "wall_s": time.perf_counter() - started,
            "device": trace.manifest["machine"].get("device"),
            "steps": s["steps"], "step_s_median": s["step_s_median"],
            "forward_s_median": s["forward_s_median"], "backward_s_median": s["backward_s_median"],
            "optimizer_s_median": s["optimizer_s_median"], "drift_share": s["drift_share"],
            "stall_share": s["stall_share"],
            "drift_ms_median": 1e3 * float(steps_table["drift_s"].median()),
            "bytes_vs_full_every_step": s["bytes_vs_full_every_step"],
            "persist_s_median": s["persist_s_median"], "write_mb_per_s": s["write_mb_per_s"]}


def snapshot_part(device: str, repeats: int, scratch: Path) -> dict:
    """Parts 2 and 3, interleaved in one process."""
    import torch

    from layercheck import LayerCheck, LayerCheckConfig
    from profiler.config import CaptureConfig
    from profiler.jobs.plain import PlainJob
    job = PlainJob.prepare(CaptureConfig(model="minilm", device=device, steps=repeats + 2),
                           say=lambda _: None)
    every = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0,
                             keep_versions=1)
    lc = LayerCheck(job.module, job.adam, str(scratch / "ckpt"), every, scheduler=job.scheduler)
    lc.restore()
    position = 0
    job.step(position)  # the optimizer's state exists from here on
    position += job.config.batch_size
    lc.step()
    lc.flush()
    params = [p for g in job.adam.param_groups for p in g["params"]]
    tensors = [t for p in params for t in (p, job.adam.state[p]["exp_avg"],
                                           job.adam.state[p]["exp_avg_sq"])]
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=device == "cuda") for t in tensors]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def pinned_copy() -> float:
        sync()
        t0 = time.perf_counter()
        for src, dst in zip(tensors, pinned):
            dst.copy_(src, non_blocking=True)
        sync()
        return time.perf_counter() - t0

    def pageable_copy() -> float:
        sync()
        t0 = time.perf_counter()
        [t.cpu() for t in tensors]
        return time.perf_counter() - t0

    def torch_save() -> tuple[float, int]:
        sync()
        path = scratch / "torch_save.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save({"model": job.module.state_dict(), "optimizer": job.adam.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        spent = time.perf_counter() - t0
        written = path.stat().st_size
        path.unlink()
        return spent, written

    rows = []
    for r in range(repeats):
        job.step(position)
        position += job.config.batch_size
        row = {"load": os.getloadavg()[0]}
        work = ["layercheck", "pinned", "torch_save"]
        for name in work[r % 3:] + work[:r % 3]:
            if name == "layercheck":
                report = lc.step(extra={"position": position})
                t0 = time.perf_counter()
                lc.flush()
                row.update(stall_s=report.stall_s, bytes=report.bytes_queued,
                           writer_s=time.perf_counter() - t0, drift_s=report.drift_s)
            elif name == "pinned":
                row.update(pinned_s=pinned_copy(), pageable_s=pageable_copy())
            else:
                row["torch_save_s"], row["torch_save_bytes"] = torch_save()
        rows.append(row)
    lc.close()
    return {
        "repeats": repeats, "snapshot_bytes": nbytes, "layercheck_bytes_per_step": rows[-1]["bytes"],
        "stall_ms": _ratios(1e3 * r["stall_s"] for r in rows),
        "pinned_copy_ms": _ratios(1e3 * r["pinned_s"] for r in rows),
        "pageable_copy_ms": _ratios(1e3 * r["pageable_s"] for r in rows),
        "stall_over_pinned_copy": _ratios(r["stall_s"] / r["pinned_s"] for r in rows),
        "stall_over_pageable_copy": _ratios(r["stall_s"] / r["pageable_s"] for r in rows),
        "writer_ms": _ratios(1e3 * r["writer_s"] for r in rows),
        "torch_save_ms": _ratios(1e3 * r["torch_save_s"] for r in rows),
        "writer_over_torch_save": _ratios(r["writer_s"] / r["torch_save_s"] for r in rows),
        "writer_over_torch_save_per_byte": _ratios(
            (r["writer_s"] / r["bytes"]) / (r["torch_save_s"] / r["torch_save_bytes"])
            for r in rows),
        "load": _ratios(r["load"] for r in rows), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="steps of the capture (default 300)")
    ap.add_argument("--repeats", type=int, default=12, help="rounds of parts 2 and 3 (default 12)")
    ap.add_argument("--quick", action="store_true", help="40 capture steps, 4 rounds")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default); cpu checks the script, its figures are not a GPU's")
    ap.add_argument("--only", choices=("capture", "snapshot"), help="one part")
    ap.add_argument("--scratch", type=Path, help="folder for checkpoints and the trace "
                    "(default: a temporary one, deleted at the end)")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args()
    if args.steps < 20 or args.repeats < 1:
        ap.error("--steps must be at least 20 and --repeats at least 1")
    if args.quick:
        args.steps, args.repeats = 40, 4
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_capture: this torch ({torch.__version__}) sees no CUDA GPU; run it on a "
              "machine with one (or --device cpu to check the script)", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="gpu-capture-", dir=args.scratch))
    print(f"load average at start: {os.getloadavg()}; device "
          f"{torch.cuda.get_device_name(0) if args.device == 'cuda' else 'cpu'}", flush=True)
    started = time.time()
    result = {"command": "python benchmarks/gpu_capture.py " + " ".join(sys.argv[1:]),
              "torch": torch.__version__, "device": args.device}
    try:
        if args.only in (None, "capture"):
            c = result["capture"] = capture_part(args.device, args.steps, scratch)
            print(f"capture ({c['device']}, {c['steps']} steps, {c['wall_s']:.0f} s): step "
                  f"{1e3 * c['step_s_median']:.1f} ms (median; forward "
                  f"{1e3 * c['forward_s_median']:.1f}, backward {1e3 * c['backward_s_median']:.1f}, "
                  f"optimizer {1e3 * c['optimizer_s_median']:.1f}); drift "
                  f"{100 * c['drift_share']:.2f}% of compute ({c['drift_ms_median']:.2f} ms median), "
                  f"stall {100 * c['stall_share']:.2f}%; bytes {100 * c['bytes_vs_full_every_step']:.1f}% "
                  f"of a full checkpoint every step; persist {c['persist_s_median']:.3f} s median",
                  flush=True)
        if args.only in (None, "snapshot"):
            s = result["snapshot"] = snapshot_part(args.device, args.repeats, scratch)
            print(f"every layer at every step ({s['layercheck_bytes_per_step'] / 1e6:.0f} MB), "
                  f"{s['repeats']} rounds, load average {s['load']['min']:.1f}-{s['load']['max']:.1f}:")
            for label, ratio, mine, reference in (
                    ("stall / pinned copy of w, m, v", "stall_over_pinned_copy", "stall_ms",
                     "pinned_copy_ms"),
                    ("stall / pageable .cpu() of them", "stall_over_pageable_copy", "stall_ms",
                     "pageable_copy_ms"),
                    ("writer (files, checksums, fsync, commit) / torch.save + fsync",
                     "writer_over_torch_save", "writer_ms", "torch_save_ms")):
                print(f"  {label}: min {s[ratio]['min']:.2f}, median {s[ratio]['median']:.2f} "
                      f"({s[mine]['median']:.1f} ms against {s[reference]['median']:.1f} ms, "
                      "medians)", flush=True)
            print(f"  writer / torch.save per byte: median "
                  f"{s['writer_over_torch_save_per_byte']['median']:.2f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["wall_s"] = time.time() - started
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
