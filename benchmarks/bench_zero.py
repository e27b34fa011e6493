"""ZeRO-3 benchmark: LayerCheck vs DeepSpeed's own checkpoint at every step vs none, 2 ranks.

    python benchmarks/bench_zero.py [--models minilm,tiny] [--segments 6] [--segment-steps 6]
                                    [--warmup 8] [--jobs 1] [--variants none,layercheck,...]
                                    [--quick] [--out docs/benchmarks-zero.json]
    python benchmarks/bench_zero.py --drift-ratio [--rounds 12] [--turn-steps 5] [--warmup 3]
                                    [--out docs/benchmarks-zero-drift.json]

``--drift-ratio`` measures one thing in one job: drift tracking per step
(``StepReport.drift_s``: the drift hook inside the optimizer step plus
``take()``, the all-reduce of the sums included; an untimed barrier first, so
that it does not time the other rank's step) of MiniLM under ZeRO-3 on 2
ranks, against the same tracker and kernel on one rank (plain ``LayerCheck``
with the profiler's plain trainer, in rank 0's process, while rank 1 waits).
The two take turns of ``--turn-steps`` steps, ``--rounds`` times, the order
alternating; each round gives one ratio (the ZeRO-3 turn's median step over
the one-rank turn's), and the load average is recorded at every round. Each
step also times the pass's physical reference right after it: one plain
torch read (``.sum()``) of the w, m and v that the rank's pass reads (under
ZeRO-3 its fp32 partitions and their moments), so that each job also gives
the ratio of ``bench_layercheck.py --drift-ratio``, drift over a plain read,
per step. Thresholds are infinite and
the warm-up longer than the run, so nothing is written: no background writer
competes with the hook.

A job is a real 2-rank DeepSpeed ZeRO-3 training run (torchrun, gloo,
DeepSpeed's cpu accelerator, one thread per rank) of the profiler's job
(``profiler.jobs.zero.ZeroJob``): MiniLM-L6 masked-LM fine-tuning on
Python's documentation, or the profiler's tiny Qwen2 causal LM; batch 8 x 64
tokens, 4 sequences per rank. Each job holds three engines of the same
model, one per variant, each training on from the same start:

- ``none``: no checkpointing;
- ``layercheck``: ``ZeroLayerCheck`` with the default thresholds (1e-3,
  embeddings 1e-2) and Smax (1000); its warm-up is ``--warmup`` steps
  instead of 200, so that the measured steps are the steady state (after
  the base checkpoint): ``lc.step()`` after every ``engine.step()``;
- ``layercheck_fused``: the same with ``fused_step=True``: DeepSpeed's inner
  torch AdamW steps each flat partition with the drift sums taken in the
  same pass (``layercheck.drift.fusedstep``), so no drift pass runs after it;
- ``drift_only`` (not run by default): ``layercheck_fused`` with infinite
  thresholds and Smax, so that after the base checkpoint no layer is written:
  what LayerCheck costs without its layer writes (drift, the policy, and the
  small training state it commits at every step), to tell the writes' cost
  from the rest;
- ``deepspeed``: ``engine.save_checkpoint(dir, tag=...)`` after every
  ``engine.step()``: DeepSpeed's synchronous full checkpoint (one new tag
  per step, all kept until the job ends).

Side by side: every engine first trains ``--warmup`` steps (not measured),
then the variants take turns, ``--segment-steps`` steps each, for
``--segments`` rounds, the order rotating every round, so that the machine's
load (other people's jobs) hits them alike and each segment can be compared
with the other variants' segments of the same minute.

Measured, on rank 0: the wall time of each step from the forward to the
return of the checkpoint call (an untimed barrier lines the ranks up before
each step, in every variant); within it, LayerCheck's drift hook (inside
``engine.step()``) and the checkpoint call, whose sum over the training
time of the same steps (``in_step_share``) is the checkpointing cost the
training thread itself pays, hardly touched by the machine's load, which
slows both alike; where LayerCheck's time goes, per step: the drift hook,
``take()`` (the all-reduce of the drift sums), the rest of ``lc.step()`` (the
policy, the host copies of the chosen partitions, the hand-over to the writer:
``StepReport.stall_s``), and the CPU seconds of LayerCheck's writer threads
(serialising, checksumming, writing, fsync: they compete with the two ranks
for the cores; read from ``/proc/self/task``); and at the end of each segment
the **drain**:
``lc.flush()`` (LayerCheck's pending background writes) and ``os.sync()``
(what DeepSpeed's saves left in the page cache: DeepSpeed does not fsync),
then a barrier. The drain keeps one variant's I/O out of the next one's
segment; counted in ("with drain") it charges each variant the time to make
its checkpoints durable, as if nothing had overlapped with training. Bytes:
what landed in each variant's checkpoint folder (every rank's files) over
the measured steps.
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
VARIANTS = ("none", "layercheck", "layercheck_fused", "drift_only", "deepspeed")
DEFAULT_VARIANTS = ("none", "layercheck", "layercheck_fused", "deepspeed")
THREADS = 1


# -- one job, on every rank (under torchrun) -------------------------------------
class Variant:
    """One engine and what it does after each ``engine.step()``."""

    def __init__(self, name: str, trainer, folder: Path, warmup: int) -> None:
        self.name, self.trainer, self.folder = name, trainer, folder
        self.step_no = self.position = 0
        self.lc = None
        if name in ("layercheck", "layercheck_fused", "drift_only"):
            import math

            from layercheck import LayerCheckConfig
            from layercheck.zero import ZeroLayerCheck
            quiet = dict(base_threshold=math.inf, embedding_threshold=math.inf,
                         smax=10 ** 9) if name == "drift_only" else {}
            self.lc = ZeroLayerCheck(trainer.engine, str(folder),
                                     LayerCheckConfig(warmup_steps=warmup,
                                                      fused_step=name != "layercheck", **quiet),
                                     scheduler=trainer.scheduler)
            self.lc.restore()

    def step(self) -> dict:
        import torch.distributed as dist
        dist.barrier()
        self.step_no += 1
        t0 = time.perf_counter()
        share, _ = self.trainer.step(self.position)
        t1 = time.perf_counter()
        self.position += self.trainer.config.batch_size
        hook_s = take_s = stall_s = 0.0
        writer_before = writer_cpu_s()
        if self.lc is not None:
            hook_s = self.lc.drift.seconds  # the drift hook, inside engine.step()
            report = self.lc.step(extra={"position": self.position})
            take_s, stall_s = report.drift_s - hook_s, report.stall_s
        elif self.name == "deepspeed":
            self.trainer.engine.save_checkpoint(str(self.folder), tag=f"step{self.step_no}")
        t2 = time.perf_counter()
        return {"step": self.step_no, "compute_s": t1 - t0, "checkpoint_s": t2 - t1,
                "step_s": t2 - t0, "drift_hook_s": hook_s, "take_s": take_s,
                "stall_s": stall_s, "writer_cpu_before_s": writer_before, "loss_share": share}

    def drain(self) -> float:
        import torch.distributed as dist
        t0 = time.perf_counter()
        if self.lc is not None:
            self.lc.flush()
        os.sync()
        dist.barrier()
        return time.perf_counter() - t0

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


def writer_cpu_s() -> float:
    """CPU seconds so far of this process's LayerCheck writer threads (the writer
    and its file threads, by their Python names; the kernel does not know those
    names before Python 3.14), from /proc/self/task (Linux; 0 elsewhere)."""
    import threading
    total = 0
    for thread in threading.enumerate():
        if not thread.name.startswith("layercheck-") or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # the thread ended, or no /proc
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from profiler.config import CaptureConfig, ZeroConfig
    from profiler.jobs.zero import ZeroJob, init_distributed
    rank, world = init_distributed()
    steps = args.warmup + args.segments * args.segment_steps
    config = CaptureConfig(model=args.model, steps=steps, warmup_steps=args.warmup,
                           threads=THREADS)
    root = Path(args.ckpt)
    variants = []
    for name in args.variants.split(","):
        (root / name).mkdir(parents=True, exist_ok=True)
        trainer = ZeroJob.prepare(ZeroConfig(capture=config, ranks=world), say=lambda _: None)
        variants.append(Variant(name, trainer, root / name, args.warmup))
    rows: dict[str, list] = {v.name: [] for v in variants}
    drains: dict[str, list] = {v.name: [] for v in variants}
    for v in variants:  # warm-up: LayerCheck's base checkpoint happens here
        for _ in range(args.warmup):
            v.step()
        v.drain()
    at_warmup = {v.name: v.bytes_on_disk() for v in variants}
    loads = []
    for seg in range(args.segments):
        order = variants[seg % len(variants):] + variants[:seg % len(variants)]
        for v in order:
            loads.append({"segment": seg, "variant": v.name, "load": os.getloadavg()[0]})
            turn = [{**v.step(), "segment": seg} for _ in range(args.segment_steps)]
            # the writer's CPU time over the turn (ticks of 10 ms: per step it is too coarse)
            spent = writer_cpu_s() - turn[0]["writer_cpu_before_s"]
            for row in turn:
                row["writer_cpu_s"] = spent / len(turn)
            rows[v.name] += turn
            drains[v.name].append({"segment": seg, "drain_s": v.drain()})
    measured = args.segments * args.segment_steps
    result = {"model": args.model, "params": variants[0].trainer.num_params, "variants": {}}
    for v in variants:
        written = v.bytes_on_disk() - at_warmup[v.name]
        result["variants"][v.name] = {
            "steps": rows[v.name], "drains": drains[v.name], "bytes_at_warmup": at_warmup[v.name],
            "bytes_measured": written, "bytes_per_step": written / measured}
        if v.lc is not None:
            v.lc.close()
    result["loads"] = loads
    if rank == 0:
        Path(args.result).write_text(json.dumps(result))
    return 0


# -- drift tracking: ZeRO-3 on 2 ranks against one rank, same kernel ------------------
def drift_worker(args: argparse.Namespace) -> int:
    """Every rank: a ZeRO-3 MiniLM job with ZeroLayerCheck; rank 0 also a plain
    job with LayerCheck. Turns alternate; rank 0 writes per-step drift seconds."""
    import math

    import torch.distributed as dist
    sys.path.insert(0, str(ROOT))
    from layercheck import LayerCheck, LayerCheckConfig
    from layercheck.zero import ZeroLayerCheck
    from profiler.config import CaptureConfig, ZeroConfig
    from profiler.jobs.plain import PlainJob
    from profiler.jobs.zero import ZeroJob, init_distributed
    rank, world = init_distributed()
    steps = 2 * (args.warmup + args.rounds * args.turn_steps)
    config = CaptureConfig(model="minilm", steps=steps, threads=THREADS)
    # nothing is ever written: the drift hook and take() alone are measured
    quiet = LayerCheckConfig(base_threshold=math.inf, embedding_threshold=math.inf,
                             smax=10 ** 9, warmup_steps=10 ** 9)
    root = Path(args.ckpt)
    zero = ZeroJob.prepare(ZeroConfig(capture=config, ranks=world), say=lambda _: None)
    jobs = {"zero3": (zero, ZeroLayerCheck(zero.engine, str(root / "zero"), quiet,
                                           scheduler=zero.scheduler))}
    if rank == 0:
        plain = PlainJob.prepare(config, say=lambda _: None)
        jobs["one_rank"] = (plain, LayerCheck(plain.model, plain.optimizer, root / "plain", quiet,
                                              scheduler=plain.scheduler))
    positions = dict.fromkeys(("zero3", "one_rank"), 0)

    def turn(name: str, n: int) -> tuple[list[float], list[float], list[float]]:
        drift, hook, read = [], [], []
        if name in jobs:  # rank 1 sits out the one-rank turns at the barrier below
            trainer, lc = jobs[name]
            for _ in range(n):
                trainer.step(positions[name])
                positions[name] += config.batch_size
                if name == "zero3":
                    # untimed: take()'s all-reduce must not time the other rank's step
                    dist.barrier()
                hook.append(lc.drift.seconds)  # the pass alone, inside engine.step()
                drift.append(lc.step().drift_s)  # + take(): under ZeRO-3 the all-reduce
                assert lc.drift.fused_params > 0, "the fused kernel must serve both"
                read.append(plain_read_s(lc))
        dist.barrier()
        return drift, hook, read

    for name in ("zero3", "one_rank"):
        turn(name, args.warmup)  # numba compiles, kernel plans are built
    rounds = []
    for r in range(args.rounds):
        row = {"round": r, "load": os.getloadavg()[0]}
        for name in (("zero3", "one_rank") if r % 2 == 0 else ("one_rank", "zero3")):
            row[name], row[f"{name}_hook"], row[f"{name}_read"] = turn(name, args.turn_steps)
        rounds.append(row)
    for _, lc in jobs.values():
        lc.close()
    if rank == 0:
        Path(args.result).write_text(json.dumps({"rounds": rounds, "ranks": world}))
    return 0


def plain_read_s(lc) -> float:
    """Seconds of one plain torch read of the tensors this rank's drift pass
    reads: each w (a parameter, or under ZeRO an fp32 partition), exp_avg and
    exp_avg_sq, ``.sum()`` of each."""
    import torch
    state = lc.source.optimizer.state
    t0 = time.perf_counter()
    with torch.no_grad():
        for tensors in lc.source.drift_layers():
            for t in tensors:
                s = state.get(t)
                if s and "exp_avg" in s:
                    t.sum(), s["exp_avg"].sum(), s["exp_avg_sq"].sum()
    return time.perf_counter() - t0


def run_drift_ratio(args: argparse.Namespace) -> dict:
    scratch = Path(args.scratch or tempfile.gettempdir())
    out = run_job("drift", ["--drift-ratio", "--rounds", str(args.rounds), "--turn-steps",
                            str(args.turn_steps), "--warmup", str(args.warmup)], scratch)
    rows = out["rounds"]
    # medians of the turns: a load spike on this shared machine stretches single steps
    ratios = [statistics.median(r["zero3"]) / statistics.median(r["one_rank"]) for r in rows]
    loads = [r["load"] for r in rows]
    over_read = {f"{name}{part}": [d / x for r in rows
                                   for d, x in zip(r[f"{name}{part}"], r[f"{name}_read"])]
                 for name in ("zero3", "one_rank") for part in ("", "_hook")}
    return {"command": ("python benchmarks/bench_zero.py " + " ".join(sys.argv[1:])).strip(),
            "date": time.strftime("%Y-%m-%d"), "wall_s": out["wall_s"],
            "machine": machine(), "threads_per_rank": THREADS, "model": "minilm",
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
            "ratios": ratios, "load_min": min(loads), "load_max": max(loads),
            "zero3_ms_median": 1e3 * statistics.median(x for r in rows for x in r["zero3"]),
            "one_rank_ms_median": 1e3 * statistics.median(x for r in rows for x in r["one_rank"]),
            # drift over one plain read of the same tensors, per step (bench_layercheck's ratio);
            # "_hook": the pass inside the step alone, without take()'s all-reduce
            **{f"{name}_over_read_{f.__name__}": f(v) for name, v in over_read.items()
               for f in (min, statistics.median)},
            "zero3_read_ms_median": 1e3 * statistics.median(
                x for r in rows for x in r["zero3_read"]),
            "one_rank_read_ms_median": 1e3 * statistics.median(
                x for r in rows for x in r["one_rank_read"]),
            "rounds": rows}


# -- the driver --------------------------------------------------------------------
def run_job(name: str, worker_args: list[str], scratch: Path, script: Path | None = None) -> dict:
    """``script``'s worker (default: this file's) under torchrun on 2 ranks: rank 0's
    result, and the wall time."""
    ckpt = Path(tempfile.mkdtemp(prefix=f"bench-zero-{name}-", dir=scratch))
    result = ckpt.with_suffix(".json")
    sys.path.insert(0, str(ROOT))
    from profiler.launch import rank_environment, torchrun
    command = torchrun([str((script or Path(__file__)).resolve()), "--worker", *worker_args,
                        "--ckpt", str(ckpt), "--result", str(result)], 2)
    env = rank_environment(THREADS, DS_ACCELERATOR="cpu")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
        out = json.loads(result.read_text())
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
        result.unlink(missing_ok=True)
    out["wall_s"] = time.perf_counter() - started
    return out


def summarize(jobs: list[dict]) -> dict:
    out: dict = {}
    for model in dict.fromkeys(j["model"] for j in jobs):
        mine = [j for j in jobs if j["model"] == model]
        figs = {v: _figures([j["variants"][v] for j in mine]) for v in VARIANTS
                if v in mine[0]["variants"]}
        base = figs["none"]
        for v, f in figs.items():
            f["overhead"] = f["step_ms_mean"] / base["step_ms_mean"] - 1
            f["overhead_median"] = f["step_ms_median"] / base["step_ms_median"] - 1
            f["overhead_with_drain"] = f["ms_per_step_with_drain"] / base["ms_per_step_with_drain"] - 1
            paired = [a / b - 1 for a, b in zip(f["segment_means_ms"], base["segment_means_ms"])]
            f["segment_overheads"] = paired
            f["segment_overhead_median"] = statistics.median(paired)
            # checkpointing must not change training: same losses as "none" (exactly,
            # for a model without dropout; the engines share one RNG for dropout masks)
            f["max_loss_difference_vs_none"] = max(
                abs(a["loss_share"] - b["loss_share"])
                for j in mine for a, b in zip(j["variants"][v]["steps"], j["variants"]["none"]["steps"]))
        out[model] = {"params": mine[0]["params"], "variants": figs}
    return out


def _figures(runs: list[dict]) -> dict:
    steps = [s for r in runs for s in r["steps"]]
    drains = [d["drain_s"] for r in runs for d in r["drains"]]
    segments: dict[tuple[int, int], list[float]] = {}
    for k, r in enumerate(runs):
        for s in r["steps"]:
            segments.setdefault((k, s["segment"]), []).append(s["step_s"])
    n = len(steps)
    hook = sum(s["drift_hook_s"] for s in steps)
    training = sum(s["compute_s"] for s in steps) - hook
    return {
        "measured_steps": n,
        "step_ms_median": 1e3 * statistics.median(s["step_s"] for s in steps),
        "step_ms_mean": 1e3 * statistics.fmean(s["step_s"] for s in steps),
        "compute_ms_median": 1e3 * statistics.median(s["compute_s"] for s in steps),
        "checkpoint_ms_median": 1e3 * statistics.median(s["checkpoint_s"] for s in steps),
        "checkpoint_ms_mean": 1e3 * statistics.fmean(s["checkpoint_s"] for s in steps),
        "drift_hook_ms_median": 1e3 * statistics.median(s["drift_hook_s"] for s in steps),
        "drift_hook_ms_mean": 1e3 * statistics.fmean(s["drift_hook_s"] for s in steps),
        "take_ms_mean": 1e3 * statistics.fmean(s.get("take_s", 0.0) for s in steps),
        "stall_ms_mean": 1e3 * statistics.fmean(s.get("stall_s", 0.0) for s in steps),
        "writer_cpu_ms_mean": 1e3 * statistics.fmean(s.get("writer_cpu_s", 0.0) for s in steps),
        "training_ms_mean": 1e3 * (sum(s["compute_s"] for s in steps) - hook) / n,
        # measured inside the same steps, so the machine's load scales both alike
        "in_step_share": (hook + sum(s["checkpoint_s"] for s in steps)) / training,
        "drain_ms_per_step": 1e3 * sum(drains) / n,
        "ms_per_step_with_drain": 1e3 * (sum(s["step_s"] for s in steps) + sum(drains)) / n,
        "segment_means_ms": [1e3 * statistics.fmean(v) for _, v in sorted(segments.items())],
        "bytes_per_step": sum(r["bytes_measured"] for r in runs) / n,
        "bytes_at_warmup": statistics.fmean(r["bytes_at_warmup"] for r in runs),
    }


def table(summary: dict) -> str:
    lines = ["| model | variant | step ms, median | step ms, mean | overhead (mean) | overhead, "
             "median of paired segments [range] | drain ms per step | overhead with drain "
             "| drift hook + checkpoint call ms, median | in-step share "
             "| MB written per step |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, s in summary.items():
        for v, f in s["variants"].items():
            none = v == "none"
            seg = f["segment_overheads"]
            lines.append(
                f"| {model} | {v} | {f['step_ms_median']:.1f} | {f['step_ms_mean']:.1f} | "
                + ("- | - | " if none else f"{100 * f['overhead']:+.1f}% | "
                   f"{100 * f['segment_overhead_median']:+.1f}% [{100 * min(seg):+.0f}%, "
                   f"{100 * max(seg):+.0f}%] | ")
                + f"{f['drain_ms_per_step']:.1f} | "
                + ("- | " if none else f"{100 * f['overhead_with_drain']:+.1f}% | ")
                + f"{f['drift_hook_ms_median']:.1f} + {f['checkpoint_ms_median']:.1f} | "
                + f"{100 * f['in_step_share']:.1f}% | {f['bytes_per_step'] / 1e6:.2f} |")
    return "\n".join(lines)


def breakdown(summary: dict) -> str:
    """Where each LayerCheck variant's time goes, per step (means), against the step
    without checkpointing."""
    lines = ["| model | variant | step, none (ms) | overhead (mean) | drift hook | take() "
             "(all-reduce) | rest of lc.step() (policy, host copies) | writer threads' CPU "
             "| in-step share |", "|---|---|---|---|---|---|---|---|---|"]
    for model, s in summary.items():
        base = s["variants"]["none"]["step_ms_mean"]
        for v, f in s["variants"].items():
            if v in ("none", "deepspeed"):
                continue
            lines.append(f"| {model} | {v} | {base:.0f} | {100 * f['overhead']:+.1f}% | "
                         f"{f['drift_hook_ms_mean']:.1f} ms | {f['take_ms_mean']:.1f} ms | "
                         f"{f['stall_ms_mean']:.1f} ms | {f['writer_cpu_ms_mean']:.1f} ms | "
                         f"{100 * f['in_step_share']:.1f}% |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,tiny")
    ap.add_argument("--segments", type=int, default=6, help="rounds of turns (default 6)")
    ap.add_argument("--segment-steps", type=int, default=6, help="steps per turn (default 6)")
    ap.add_argument("--warmup", type=int, default=8, help="unmeasured steps first; LayerCheck's "
                    "warm-up, ending in its base checkpoint (default 8)")
    ap.add_argument("--jobs", type=int, default=1, help="repeat each model's job (default 1)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"which of {', '.join(VARIANTS)} (default: all but drift_only; none "
                    "is the reference)")
    ap.add_argument("--quick", action="store_true", help="MiniLM, 3 segments of 3 steps, "
                    "warm-up 4: a smoke run (the figures need the defaults or more)")
    ap.add_argument("--out", default=None, help="JSON results (default: "
                    "docs/benchmarks-zero.json, or docs/benchmarks-zero-drift.json)")
    ap.add_argument("--drift-ratio", action="store_true", help="drift tracking per step, ZeRO-3 "
                    "on 2 ranks over one rank with the same kernel (see the module doc)")
    ap.add_argument("--rounds", type=int, default=12, help="--drift-ratio: rounds (default 12)")
    ap.add_argument("--turn-steps", type=int, default=5,
                    help="--drift-ratio: steps per turn (default 5)")
    ap.add_argument("--scratch", default=None, help="folder for the checkpoints (default: temp)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--model", "--ckpt", "--result"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return drift_worker(args) if args.drift_ratio else worker(args)
    if args.drift_ratio:
        args.warmup = 3 if "--warmup" not in sys.argv else args.warmup
        doc = run_drift_ratio(args)
        out = args.out or "docs/benchmarks-zero-drift.json"
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"drift tracking per step, ZeRO-3 (2 ranks) / one rank, same kernel, "
              f"{len(doc['ratios'])} interleaved rounds: min {doc['ratio_min']:.3f}, median "
              f"{doc['ratio_median']:.3f} (ZeRO-3 {doc['zero3_ms_median']:.1f} ms, one rank "
              f"{doc['one_rank_ms_median']:.1f} ms, medians); drift / plain read of the same "
              f"w, m, v per step: ZeRO-3 min {doc['zero3_over_read_min']:.2f}, median "
              f"{doc['zero3_over_read_median']:.2f} (the pass alone: median "
              f"{doc['zero3_hook_over_read_median']:.2f}; read {doc['zero3_read_ms_median']:.1f} ms), "
              f"one rank min {doc['one_rank_over_read_min']:.2f}, median "
              f"{doc['one_rank_over_read_median']:.2f} (read {doc['one_rank_read_ms_median']:.1f} ms); "
              f"load average {doc['load_min']:.1f}-{doc['load_max']:.1f}; wrote {out}")
        return 0
    if args.quick:
        args.models, args.segments, args.segment_steps, args.warmup = "minilm", 3, 3, 4
    if min(args.segments, args.segment_steps, args.warmup, args.jobs) < 1:
        ap.error("--segments, --segment-steps, --warmup and --jobs must be at least 1")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "none" not in chosen or not set(chosen) <= set(VARIANTS):
        ap.error(f"--variants: some of {', '.join(VARIANTS)}, none included (the reference)")
    scratch = Path(args.scratch or tempfile.gettempdir())
    scratch.mkdir(parents=True, exist_ok=True)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    jobs, started = [], time.time()
    for _ in range(args.jobs):
        for model in models:
            job = run_job(model, ["--model", model, "--segments", str(args.segments),
                                  "--segment-steps", str(args.segment_steps),
                                  "--warmup", str(args.warmup),
                                  "--variants", ",".join(chosen)], scratch)
            loads = [l["load"] for l in job["loads"]]
            print(f"{model}: {job['wall_s']:.0f} s, load average {min(loads):.1f}-{max(loads):.1f}",
                  flush=True)
            jobs.append(job)
    summary = summarize(jobs)
    doc = {"command": ("python benchmarks/bench_zero.py " + " ".join(sys.argv[1:])).strip(),
           "date": time.strftime("%Y-%m-%d"), "wall_s": time.time() - started,
           "machine": machine(), "ranks": 2, "threads_per_rank": THREADS,
           "warmup": args.warmup, "segments": args.segments, "segment_steps": args.segment_steps,
           "jobs_per_model": args.jobs, "summary": summary, "jobs": jobs}
    out = args.out or "docs/benchmarks-zero.json"
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(summary))
    print(breakdown(summary))
    print(f"wrote {out}")
    return 0


def machine() -> dict:
    """``profiler.machine.host`` with torch's and DeepSpeed's versions."""
    sys.path.insert(0, str(ROOT))
    from profiler.machine import host
    return host("torch", "deepspeed")


if __name__ == "__main__":
    sys.exit(main())
