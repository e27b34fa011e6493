"""Elastic restore benchmark: 2 FSDP2 ranks' directory restored in 1 process, against the
same-size restore (2 ranks) and against DCP's own resharding ``dcp.load`` of the same state.

    python benchmarks/bench_elastic.py [--rounds 3] [--repeats 3] [--out docs/benchmarks-elastic.json]

One directory, written once: a real 2-rank FSDP2 job (torchrun, gloo, CPU, one
thread per rank) trains a Qwen2 causal LM built from a config (6 blocks,
hidden 256, vocabulary 8192, tied head: 6.5 M parameters) with AdamW for 3
steps under ``FsdpLayerCheck`` at threshold 0 (every layer written at every
step), then saves the same state with ``dcp.save(get_state_dict(...))``, each
rank writing its shards. Then, ``--rounds`` times, alternating:

- ``same``: a 2-rank job restores the directory ``--repeats`` times with
  ``FsdpLayerCheck.restore()`` (a fresh model and optimizer each time);
- ``elastic``: a 1-rank job (``FsdpLayerCheck`` on a 1-rank mesh) restores
  the same directory, every layer resharded on read (``apply_elastic``), and
  interleaved with it, ``dcp``: ``dcp.load`` of the DCP checkpoint into a
  fresh 1-rank FSDP2 model and optimizer and ``set_state_dict``: DCP's own
  resharding of the same state.

Each restore is timed on rank 0 from the call to its return (ranks lined up
by a barrier first); a round's figure per variant is the median of its
repeats. Output: per round the three times and the load average, and over the
rounds the minimum and median of elastic / same and elastic / dcp.
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
STEPS = 3


# -- under torchrun ------------------------------------------------------------------
def build(steps: int = STEPS):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return model, optimizer


def checkpointer(model, optimizer, directory: str):
    from layercheck import LayerCheckConfig
    from layercheck.fsdp import FsdpLayerCheck
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1,
                              interval=1)
    return FsdpLayerCheck(model, optimizer, directory, config)


def write(args: argparse.Namespace) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optimizer = build()
    lc = checkpointer(model, optimizer, args.ckpt)
    lc.restore()
    for step in range(1, STEPS + 1):
        g = torch.Generator().manual_seed(step * 100 + dist.get_rank())
        ids = torch.randint(0, 8192, (4, 64), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lc.step()
    lc.close()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=args.dcp)
    return {"params": sum(p.numel() for p in model.parameters())}


def timed(work) -> float:
    import torch.distributed as dist
    dist.barrier()
    start = time.perf_counter()
    work()
    dist.barrier()
    return time.perf_counter() - start


def restore_once(args: argparse.Namespace) -> float:
    model, optimizer = build()
    lc = checkpointer(model, optimizer, args.ckpt)
    try:
        seconds = timed(lambda: lc.restore())
        assert lc.restored.step == STEPS
    finally:
        lc.close()
    return seconds


def dcp_once(args: argparse.Namespace) -> float:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model, optimizer = build()
    # a fresh optimizer holds no moments for get_state_dict to lay out: one zero step does
    for p in model.parameters():
        p.grad = None
    optimizer.step()

    def load() -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=args.dcp)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    return timed(load)


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    out: dict = {"load": os.getloadavg()[0]}
    if args.mode == "write":
        out.update(write(args))
    elif args.mode == "same":
        out["same"] = [restore_once(args) for _ in range(args.repeats)]
    else:  # elastic and dcp, interleaved, the order alternating
        out["elastic"], out["dcp"] = [], []
        for r in range(args.repeats):
            for name in (("elastic", "dcp") if r % 2 == 0 else ("dcp", "elastic")):
                out[name].append((restore_once if name == "elastic" else dcp_once)(args))
    if dist.get_rank() == 0:
        Path(args.result).write_text(json.dumps(out))
    dist.destroy_process_group()
    return 0


# -- the launcher --------------------------------------------------------------------
def job(mode: str, ranks: int, ckpt: Path, folder: Path, repeats: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from profiler.launch import rank_environment, torchrun
    result = folder / f"{mode}.json"
    command = torchrun([str(Path(__file__).resolve()), "--worker", "--mode", mode,
                        "--ckpt", str(ckpt), "--dcp", str(folder / "dcp"), "--result",
                        str(result), "--repeats", str(repeats)], ranks)
    env = {**rank_environment(1), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-4000:]}")
    return json.loads(result.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--mode", default="write")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--dcp", default="")
    ap.add_argument("--result", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    folder = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    try:
        ckpt = folder / "ckpt"
        written = job("write", 2, ckpt, folder, 1)
        rounds = []
        for r in range(args.rounds):
            same = job("same", 2, ckpt, folder, args.repeats)
            elastic = job("elastic", 1, ckpt, folder, args.repeats)
            row = {"round": r, "load": [same["load"], elastic["load"]],
                   **{k: statistics.median(v) for k, v in
                      (("same", same["same"]), ("elastic", elastic["elastic"]),
                       ("dcp", elastic["dcp"]))}}
            rounds.append(row)
            print(f"round {r}: same {row['same']:.3f} s, elastic {row['elastic']:.3f} s, "
                  f"dcp.load {row['dcp']:.3f} s, load average {row['load']}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = {name: [row["elastic"] / row[name] for row in rounds] for name in ("same", "dcp")}
    summary = {"params": written["params"], "rounds": rounds,
               **{f"elastic_over_{name}": {"min": min(v), "median": statistics.median(v)}
                  for name, v in ratios.items()}}
    for name in ("same", "dcp"):
        s = summary[f"elastic_over_{name}"]
        print(f"elastic / {name}: min {s['min']:.2f}, median {s['median']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
