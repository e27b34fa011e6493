"""FSDP2 benchmark: LayerCheck per step against dcp.save and dcp.async_save every step, 2 ranks.

    python benchmarks/bench_fsdp.py [--rounds 8] [--turn-steps 4] [--warmup 6]
                                    [--out docs/benchmarks-fsdp.json]

One job, one run: a real 2-rank FSDP2 training run (torchrun, gloo, CPU, one
thread per rank) of MiniLM-L6 (22.7 M parameters) fine-tuned as a masked LM
on Python's documentation (the profiler's model and data: batch 8 x 64
tokens, 4 sequences per rank, AdamW at a constant 5e-5, weight decay 0.01 on
matrices), ``fully_shard`` per encoder block then the root. Each rank holds
four copies of the same model, one per variant, each trained from the same
start on the same batches:

- ``none``: no checkpointing;
- ``layercheck``: ``FsdpLayerCheck.step()`` after every optimizer step, the
  default thresholds (1e-3, embeddings 1e-2) and Smax (1000); its warm-up is
  ``--warmup`` steps instead of 200, so that the measured steps are its
  steady state (the base checkpoint is in the warm-up);
- ``dcp_save``: ``dcp.save(get_state_dict(model, optimizer))`` after every
  step, a new folder per step: PyTorch's synchronous checkpoint of the whole
  model and optimizer, each rank writing its shards (fsynced);
- ``dcp_async_save``: ``dcp.async_save`` of the same after every step, on a
  gloo group of its own; each call first waits for the previous save to
  finish (as torchtitan does), so what it cannot overlap is charged to the
  step that waits.

Interleaved and repeated: every variant first trains ``--warmup`` steps (not
measured); then, ``--rounds`` times, each variant takes a turn of
``--turn-steps`` steps, the order rotating every round, so that the machine's
load (other people's jobs) hits them alike. An untimed barrier lines the
ranks up before each step. A step is timed on rank 0 from the forward to the
return of the checkpoint call. Each round gives one ratio per variant: the
median step of its turn over the median step of the ``none`` turn of the same
round; the output is the minimum and the median of those ratios over the
rounds, with the load average of each round. At the end of each turn the
variant drains (LayerCheck's pending writes, the last async save; timed and
reported apart) so that its I/O does not run into the next turn. Bytes: what
each variant wrote per measured step (every rank's files).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_zero import machine, run_job  # the same machine record and torchrun launcher

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "layercheck", "dcp_save", "dcp_async_save")
THREADS = 1
LR = 5e-5


# -- on every rank, under torchrun -------------------------------------------------
def build_minilm(mesh):
    """MiniLM as a masked LM (loss summed over the masked positions, projected onto
    the vocabulary only there), sharded per block, then the root; AdamW."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from profiler.models import resolve_model

    class MaskedLoss(nn.Module):
        """The MLM's own modules under their names; forward returns the mean loss."""

        def __init__(self, mlm: nn.Module) -> None:
            super().__init__()
            self.bert, self.cls = mlm.bert, mlm.cls
            self.config = mlm.config

        def forward(self, input_ids, labels):
            hidden = self.bert(input_ids=input_ids).last_hidden_state
            chosen = labels != -100
            return nn.functional.cross_entropy(self.cls(hidden[chosen]), labels[chosen])

    source = resolve_model("minilm")
    mlm, tokenizer = source.build(seed=0, max_len=64)
    model = MaskedLoss(mlm)
    for block in model.bert.encoder.layer:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    plain = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": plain, "weight_decay": 0.0}], lr=LR)
    return model, optimizer, tokenizer, source


class Variant:
    """One model copy and what it does after each optimizer step."""

    def __init__(self, name: str, mesh, folder: Path, warmup: int) -> None:
        import torch.distributed as dist
        self.name, self.folder = name, folder
        self.model, self.optimizer, self.tokenizer, self.source = build_minilm(mesh)
        self.steps = 0
        self.lc = self.future = None
        self.group = dist.new_group(backend="gloo") if name == "dcp_async_save" else None
        if name == "layercheck":
            from layercheck import LayerCheckConfig
            from layercheck.fsdp import FsdpLayerCheck
            self.lc = FsdpLayerCheck(self.model, self.optimizer, str(folder),
                                     LayerCheckConfig(warmup_steps=warmup))
            self.lc.restore()

    def step(self, batch: dict) -> dict:
        import torch.distributed as dist
        dist.barrier()
        self.steps += 1
        t0 = time.perf_counter()
        loss = self.model(**batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        self.checkpoint()
        t2 = time.perf_counter()
        return {"step": self.steps, "compute_s": t1 - t0, "checkpoint_s": t2 - t1,
                "step_s": t2 - t0, "loss": float(loss.detach())}

    def checkpoint(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        if self.name == "layercheck":
            self.lc.step()
        elif self.name.startswith("dcp"):
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state, where = {"model": model_sd, "optim": optim_sd}, str(self.folder / f"step{self.steps}")
            if self.name == "dcp_save":
                dcp.save(state, checkpoint_id=where)
            else:
                if self.future is not None:
                    self.future.result()
                self.future = dcp.async_save(state, checkpoint_id=where, process_group=self.group)

    def drain(self) -> float:
        import torch.distributed as dist
        t0 = time.perf_counter()
        if self.lc is not None:
            self.lc.flush()
        if self.future is not None:
            self.future.result()
            self.future = None
        dist.barrier()
        return time.perf_counter() - t0

    def clear(self) -> None:
        """Untimed, after a turn: delete DCP's checkpoints (the next turn's disk is not
        this one's), on rank 0 once every rank has counted the bytes."""
        import torch.distributed as dist
        dist.barrier()
        if self.name.startswith("dcp") and dist.get_rank() == 0:
            for old in self.folder.iterdir():
                shutil.rmtree(old)
        dist.barrier()

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


def batches(tokenizer, rank: int, ranks: int):
    """The profiler's masked-LM batches of MiniLM: this rank's rows of each."""
    from profiler.jobs.corpus import load_corpus
    from profiler.jobs.dataset import Dataset
    data = Dataset.build(load_corpus(), tokenizer, objective="masked", seq_len=64, batch_size=8,
                         seed=0)
    per_rank = data.batch_size // ranks

    def at(step: int) -> dict:
        batch = data.batch_at(step * data.batch_size)
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        return {"input_ids": batch["input_ids"][rows], "labels": batch["labels"][rows]}
    return at


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(THREADS)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    root = Path(args.ckpt)
    variants = []
    for name in VARIANTS:
        (root / name).mkdir(parents=True, exist_ok=True)
        variants.append(Variant(name, mesh, root / name, args.warmup))
    batch_at = batches(variants[0].tokenizer, rank, world)
    for v in variants:  # LayerCheck's base checkpoint happens here
        for s in range(args.warmup):
            v.step(batch_at(s))
        v.drain()
        v.clear()
    at_warmup = {v.name: v.bytes_on_disk() for v in variants}
    rounds = []
    for r in range(args.rounds):
        row: dict = {"round": r, "load": os.getloadavg()[0], "turns": {}}
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            first = args.warmup + r * args.turn_steps
            held = v.bytes_on_disk()
            steps = [v.step(batch_at(s)) for s in range(first, first + args.turn_steps)]
            row["turns"][v.name] = {"steps": steps, "drain_s": v.drain(),
                                    "bytes": v.bytes_on_disk() - held}
            v.clear()
        row["load_after"] = os.getloadavg()[0]
        rounds.append(row)
    lc = variants[1].lc
    layers = len(lc.layer_map)
    lc.close()
    if rank == 0:
        Path(args.result).write_text(json.dumps({
            "ranks": world, "params": sum(p.numel() for p in variants[0].model.parameters()),
            "layers": layers, "rounds": rounds, "bytes_at_warmup": at_warmup}))
    dist.destroy_process_group()
    return 0


# -- the driver --------------------------------------------------------------------
def summarize(out: dict, turn_steps: int) -> dict:
    """Per variant: the ratios of its median step to ``none``'s, round by round."""
    rounds = out["rounds"]
    summary: dict = {}
    for name in VARIANTS:
        medians = [statistics.median(s["step_s"] for s in r["turns"][name]["steps"]) for r in rounds]
        none = [statistics.median(s["step_s"] for s in r["turns"]["none"]["steps"]) for r in rounds]
        ratios = [a / b for a, b in zip(medians, none)]
        with_drain = [(sum(s["step_s"] for s in r["turns"][name]["steps"]) + r["turns"][name]["drain_s"])
                      / sum(s["step_s"] for s in r["turns"]["none"]["steps"]) for r in rounds]
        steps = [s for r in rounds for s in r["turns"][name]["steps"]]
        summary[name] = {
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios), "ratios": ratios,
            "ratio_with_drain_median": statistics.median(with_drain),
            "step_ms_median": 1e3 * statistics.median(s["step_s"] for s in steps),
            "checkpoint_ms_median": 1e3 * statistics.median(s["checkpoint_s"] for s in steps),
            "drain_ms_per_step": 1e3 * sum(r["turns"][name]["drain_s"] for r in rounds)
            / (len(rounds) * turn_steps),
            "mb_per_step": sum(r["turns"][name]["bytes"] for r in rounds)
            / (len(rounds) * turn_steps) / 1e6,
            "max_loss_difference_vs_none": max(
                abs(a["loss"] - b["loss"]) for r in rounds
                for a, b in zip(r["turns"][name]["steps"], r["turns"]["none"]["steps"]))}
    for name in ("dcp_save", "dcp_async_save"):
        per_round = [a / b for a, b in zip(summary["layercheck"]["ratios"], summary[name]["ratios"])]
        summary["layercheck"][f"over_{name}_median"] = statistics.median(per_round)
        summary["layercheck"][f"over_{name}_min"] = min(per_round)
    return summary


def table(summary: dict) -> str:
    lines = ["| variant | step / none: median [min] over rounds | with drain, median "
             "| step ms, median | checkpoint call ms, median | drain ms per step | MB per step |",
             "|---|---|---|---|---|---|---|"]
    for name, f in summary.items():
        lines.append(f"| {name} | {f['ratio_median']:.3f} [{f['ratio_min']:.3f}] | "
                     f"{f['ratio_with_drain_median']:.3f} | {f['step_ms_median']:.0f} | "
                     f"{f['checkpoint_ms_median']:.1f} | {f['drain_ms_per_step']:.1f} | "
                     f"{f['mb_per_step']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds of turns (default 8)")
    ap.add_argument("--turn-steps", type=int, default=4, help="steps per turn (default 4)")
    ap.add_argument("--warmup", type=int, default=6, help="unmeasured steps first; LayerCheck's "
                    "warm-up, ending in its base checkpoint (default 6)")
    ap.add_argument("--out", default="docs/benchmarks-fsdp.json", help="JSON results")
    ap.add_argument("--scratch", default=None, help="folder for the checkpoints (default: temp)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--ckpt", "--result"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if min(args.rounds, args.turn_steps, args.warmup) < 1:
        ap.error("--rounds, --turn-steps and --warmup must be at least 1")
    scratch = Path(args.scratch or tempfile.gettempdir())
    scratch.mkdir(parents=True, exist_ok=True)
    out = run_job("fsdp", ["--rounds", str(args.rounds), "--turn-steps", str(args.turn_steps),
                           "--warmup", str(args.warmup)], scratch, script=Path(__file__))
    summary = summarize(out, args.turn_steps)
    loads = [x for r in out["rounds"] for x in (r["load"], r["load_after"])]
    doc = {"command": ("python benchmarks/bench_fsdp.py " + " ".join(sys.argv[1:])).strip(),
           "date": time.strftime("%Y-%m-%d"), "wall_s": out["wall_s"], "machine": machine(),
           "ranks": out["ranks"], "threads_per_rank": THREADS, "model": "minilm",
           "params": out["params"], "layers": out["layers"], "warmup": args.warmup,
           "rounds": args.rounds, "turn_steps": args.turn_steps,
           "load_min": min(loads), "load_max": max(loads), "load_median": statistics.median(loads),
           "summary": summary, "raw": out["rounds"]}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(summary))
    lc = summary["layercheck"]
    print(f"LayerCheck over dcp.save per round: median {lc['over_dcp_save_median']:.3f}; over "
          f"dcp.async_save: median {lc['over_dcp_async_save_median']:.3f}; load average "
          f"{min(loads):.1f}-{max(loads):.1f}; {out['wall_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
