"""The fused Adam step (``LayerCheckConfig(fused_step=True)``) against torch's own AdamW.

    python benchmarks/bench_fusedstep.py [--repeats 30] [--steps 40] [--quick]
                                         [--out docs/benchmarks-fusedstep.json]

Two measurements, each against its reference in the same run, interleaved:

**The step** (``--repeats`` rounds): the optimizer of the profiler's MiniLM capture
job (MiniLM-L6 masked LM, AdamW on layer-aligned groups, weight decay 0.01) with
the gradients of one real backward, stepped by five optimizers over copies of the
same weights: torch's default step (for-loop on CPU), ``foreach=True``,
``fused=True``, the fused step (which also sums every parameter's drift), and
today's default with exact drift: torch's fastest step followed by the drift
tracker's pass (its numba kernel). Each round runs each once, in an order that
rotates every round; each round gives the ratio of the fused step over torch's
fastest step of that round (``min(foreach, fused)``) and over each of them.
Goal: median at most 1.05.

**Drift's share of a training step** (``--steps``): two copies of the capture job
(batch 8 x 64 tokens, torch's thread count), one with ``LayerCheck`` as it is
(exact drift after the step), one with ``fused_step=True``, taking steps in
turn (the order alternating). Nothing is written (infinite thresholds, a
warm-up longer than the run), so what LayerCheck adds is drift tracking alone.
Per step: the compute (forward, backward, optimizer; the drift hook's own
seconds taken out, as the profiler records it) and the drift seconds
(``StepReport.drift_s``: the hook inside the optimizer step plus ``take()``).
Shares are drift over compute, per step. The fused job's optimizer phase
includes the drift sums it takes on the way (the first measurement prices
them), so the row "optimizer + drift" compares the two jobs' whole cost of a
step's update with its drift. Goal: the fused job's share at most 0.5%.

Every figure comes with min and median and the load average (a 1-minute load
above 2 on 2 cores marks the run provisional).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck and profiler, whatever is installed

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.drift.tracker import DriftTracker  # noqa: E402
from layercheck.drift.fusedstep import FusedStep  # noqa: E402

QUIET_LOAD = 2.0
"""A 1-minute load average above this (on 2 cores) marks a run provisional."""


def _job(steps: int, seq: int):
    from profiler.config import CaptureConfig
    from profiler.jobs.plain import PlainJob
    return PlainJob.prepare(CaptureConfig(model="minilm", seq_len=seq, steps=steps),
                            say=lambda _: None)


def _ratios(values) -> dict:
    values = list(values)
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# -- the step -----------------------------------------------------------------------
class Stepper:
    """One optimizer over its own copy of the weights, gradients and state."""

    def __init__(self, name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 grads: list[torch.Tensor]) -> None:
        self.name = name
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        for p, g in zip(self.params, grads):
            p.grad = g.clone()
        self.optimizer, self.after = optimizer, None
        self.model = model  # keeps the weights alive

    def step(self) -> float:
        t0 = time.perf_counter()
        self.optimizer.step()
        if self.after is not None:
            self.after.take()
        return time.perf_counter() - t0


def steppers(job) -> dict[str, Stepper]:
    """The five optimizers of the step measurement, each over a copy of the job's
    model, AdamW state after one real step, and gradients of one real backward."""
    job.gradients(0)
    job.adam.step()  # a real first step: moments that are not zero
    job.gradients(job.config.batch_size)
    grads = [p.grad.detach().clone() for g in job.adam.param_groups for p in g["params"]]
    out = {}
    for name in ("torch_default", "torch_foreach", "torch_fused", "fused_step", "fastest_then_pass"):
        model = copy.deepcopy(job.module)
        by_id = dict(zip((id(p) for p in job.module.parameters()), model.parameters()))
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [by_id[id(p)] for p in g["params"]]} for g in job.adam.param_groups]
        flags = {"torch_default": {"foreach": False}, "torch_foreach": {"foreach": True},
                 "torch_fused": {"fused": True}, "fused_step": {},
                 "fastest_then_pass": {"fused": True}}[name]
        for g in groups:
            g.update({"foreach": None, "fused": None, **flags})
        opt = torch.optim.AdamW(groups, lr=job.adam.param_groups[0]["lr"])
        state = copy.deepcopy(job.adam.state_dict())
        opt.load_state_dict(state)
        for g, want in zip(opt.param_groups, groups):  # load_state_dict put the saved flags back
            g["foreach"], g["fused"] = want["foreach"], want["fused"]
        out[name] = Stepper(name, model, opt, grads)
        if name == "fused_step":
            out[name].after = FusedStep.attach(opt)
        if name == "fastest_then_pass":
            layers = [[by_id[id(p)] for p in params] for params in _layer_params(job)]
            out[name].after = DriftTracker(opt, layers)
    return out


def _layer_params(job) -> list[list[torch.Tensor]]:
    from layercheck.backends.layermap import LayerMap
    lm = LayerMap.for_model(job.module)
    return [[p for _, p in lm.parameters(i)] for i in range(len(lm))]


def measure_step(job, repeats: int) -> dict:
    runs = steppers(job)
    for s in runs.values():  # once each, untimed: first-touch page faults, kernel loading
        s.step()
    names = list(runs)
    rows = []
    for r in range(repeats):
        row = {"load": os.getloadavg()[0]}
        for name in names[r % len(names):] + names[:r % len(names)]:
            row[name] = runs[name].step()
        rows.append(row)
    fastest = [min(r["torch_foreach"], r["torch_fused"]) for r in rows]
    return {
        "repeats": repeats, "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in runs["fused_step"].params),
        "ms": {n: {"min": 1e3 * min(r[n] for r in rows),
                   "median": 1e3 * statistics.median(r[n] for r in rows)} for n in names},
        "fused_over_fastest_torch": _ratios(r["fused_step"] / f for r, f in zip(rows, fastest)),
        "fused_over_foreach": _ratios(r["fused_step"] / r["torch_foreach"] for r in rows),
        "fused_over_torch_fused": _ratios(r["fused_step"] / r["torch_fused"] for r in rows),
        "fused_over_default": _ratios(r["fused_step"] / r["torch_default"] for r in rows),
        "fastest_then_pass_over_fastest_torch": _ratios(
            r["fastest_then_pass"] / f for r, f in zip(rows, fastest)),
        "load": _ratios(r["load"] for r in rows), "rows": rows}


# -- drift's share of the capture job's step -------------------------------------------
def measure_share(steps: int, seq: int, warmup: int) -> dict:
    jobs = {name: _job(warmup + steps, seq) for name in ("exact", "fused_step")}
    quiet = dict(base_threshold=math.inf, embedding_threshold=math.inf,
                 warmup_steps=warmup + steps + 1, smax=warmup + steps + 1)
    folders = {name: tempfile.mkdtemp(prefix=f"bench-fusedstep-{name}-") for name in jobs}
    lcs = {name: LayerCheck(job.module, job.adam, folders[name],
                            LayerCheckConfig(fused_step=name == "fused_step", **quiet),
                            scheduler=job.scheduler)
           for name, job in jobs.items()}
    for lc in lcs.values():
        lc.restore()
    rows: list[dict] = []
    position = 0
    for step in range(warmup + steps):
        row = {"load": os.getloadavg()[0]}
        for name in (list(jobs) if step % 2 == 0 else list(jobs)[::-1]):
            _, times = jobs[name].step(position)
            hook = lcs[name].drift.hook_seconds()  # the hook, inside the optimizer phase
            report = lcs[name].step(extra={"position": position + jobs[name].config.batch_size})
            optimizer = times.optimizer_s - hook
            row[name] = {"compute_s": times.forward_s + times.backward_s + optimizer,
                         "optimizer_s": optimizer, "drift_s": report.drift_s,
                         "measured_in_step": lcs[name].drift.step_params}
        position += jobs["exact"].config.batch_size
        if step >= warmup:
            rows.append(row)
    for lc in lcs.values():
        lc.close()
    out = {"steps": steps, "seq": seq, "batch": jobs["exact"].config.batch_size,
           "threads": torch.get_num_threads(), "load": _ratios(r["load"] for r in rows)}
    for name in jobs:
        mine = [r[name] for r in rows]
        out[name] = {
            "drift_share": _ratios(m["drift_s"] / m["compute_s"] for m in mine),
            "drift_ms": _ratios(1e3 * m["drift_s"] for m in mine),
            "compute_ms": _ratios(1e3 * m["compute_s"] for m in mine),
            "optimizer_plus_drift_ms": _ratios(1e3 * (m["optimizer_s"] + m["drift_s"]) for m in mine),
            "tensors_measured_in_step": mine[-1]["measured_in_step"]}
    out["optimizer_plus_drift_fused_over_exact"] = _ratios(
        (r["fused_step"]["optimizer_s"] + r["fused_step"]["drift_s"])
        / (r["exact"]["optimizer_s"] + r["exact"]["drift_s"]) for r in rows)
    out["rows"] = rows
    return out


def report(step: dict | None, share: dict | None) -> None:
    if step is not None:
        ms = step["ms"]
        r = step["fused_over_fastest_torch"]
        print(f"the step, MiniLM ({step['params'] / 1e6:.1f} M parameters), {step['threads']} "
              f"threads, {step['repeats']} interleaved rounds, load average "
              f"{step['load']['min']:.1f}-{step['load']['max']:.1f}:")
        for name, v in ms.items():
            print(f"  {name:18s} min {v['min']:7.1f} ms  median {v['median']:7.1f} ms")
        print(f"  fused step / torch's fastest (per round): min {r['min']:.3f}, median "
              f"{r['median']:.3f} (goal <= 1.05); / foreach median "
              f"{step['fused_over_foreach']['median']:.3f}; / fused=True median "
              f"{step['fused_over_torch_fused']['median']:.3f}; / default median "
              f"{step['fused_over_default']['median']:.3f}; torch's fastest + drift pass / torch's "
              f"fastest median {step['fastest_then_pass_over_fastest_torch']['median']:.3f}"
              + (" (provisional: not a quiet machine)" if step["load"]["max"] > QUIET_LOAD else ""))
    if share is not None:
        print(f"drift's share of the capture job's step (MiniLM, batch {share['batch']} x "
              f"{share['seq']}, {share['steps']} steps each, alternating), load average "
              f"{share['load']['min']:.1f}-{share['load']['max']:.1f}:")
        for name in ("exact", "fused_step"):
            s = share[name]
            print(f"  {name:10s} drift {100 * s['drift_share']['median']:.2f}% of the step "
                  f"(min {100 * s['drift_share']['min']:.2f}%; {s['drift_ms']['median']:.2f} ms of "
                  f"{s['compute_ms']['median']:.0f} ms), optimizer + drift median "
                  f"{s['optimizer_plus_drift_ms']['median']:.1f} ms")
        o = share["optimizer_plus_drift_fused_over_exact"]
        print(f"  optimizer + drift, fused / exact: min {o['min']:.3f}, median {o['median']:.3f}"
              + (" (provisional: not a quiet machine)" if share["load"]["max"] > QUIET_LOAD else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30, help="rounds of the step measurement")
    ap.add_argument("--steps", type=int, default=40, help="measured steps of each capture job")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence (the capture's 64)")
    ap.add_argument("--only", choices=("step", "share"), help="one of the two measurements")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own count)")
    ap.add_argument("--quick", action="store_true", help="8 rounds and 10 steps: a smoke run")
    ap.add_argument("--out", type=Path, help="write the raw results as JSON")
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 1:
        ap.error("--repeats and --steps must be at least 1")
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.steps = 8, 10
    print(f"load average at start: {os.getloadavg()}", flush=True)
    start = time.time()
    step = share = None
    if args.only in (None, "step"):
        step = measure_step(_job(2, args.seq), args.repeats)
        report(step, None)
    if args.only in (None, "share"):
        share = measure_share(args.steps, args.seq, warmup=3)
        report(None, share)
    result = {"command": "python benchmarks/bench_fusedstep.py " + " ".join(sys.argv[1:]),
              "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__,
                          "load_average_at_end": os.getloadavg()},
              "wall_s": time.time() - start, "step": step, "share": share}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
