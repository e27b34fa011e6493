"""``capture --deepspeed zero3`` (and ``--fsdp``): the capture of ``capture.py`` on several ranks.

The job is a DeepSpeed ZeRO-3 engine (``zerojob.ZeroTrainer``) or, with
``--fsdp``, the same job under PyTorch FSDP2 (``fsdpjob.FsdpTrainer``); the
trainer makes its own LayerCheck (``make_layercheck``) and describes its
setup (``setup``); everything else here is the same for both.

Every rank (one process under torchrun) calls ``zero_capture``. Order of
work: build the job (``ZeroTrainer``: the plain capture's job, its batch
split over the ranks), agree on the checkpoint folder (rank 0's choice),
rank 0 measures the storage bandwidth there, train ``steps`` steps with
``ZeroLayerCheck`` (forward, backward, ``engine.step()``, ``lc.step()``),
wait for the last write, evaluate on held-out text, measure one real restore
of the final step on every rank, then gather to rank 0, which writes
``traces/<name>/`` in the format of ``layercheck.trace``, like a plain capture.

What the figures mean in a ZeRO trace:

- ``steps``: rank 0's phase times (the ranks wait for each other inside
  collectives, so rank 0's step is the job's step); ``optimizer_s`` is
  ``engine.step()`` without the drift hook; ``drift_s`` is the hook plus the
  all-reduce of the per-layer sums; ``loss`` is the whole batch's mean loss
  (every rank's share summed).
- ``drift``: the drift of each whole layer, exact over all ranks (the same
  numbers on every rank, so every rank writes the same layers).
- ``writes``: one row per layer version; ``bytes`` is every rank's shard
  together, ``persist_s`` rank 0's submit-to-commit time (the commit waits
  for every rank's shard to be durable).
- ``recovery``: the slowest rank's plan/load/restore seconds, and the bytes
  of every rank's shards.
- ``manifest.sources.deepspeed``: stage, ranks, backend, the DeepSpeed config
  and version, how it was launched, and each rank's median step
  (``manifest.sources.fsdp`` under ``--fsdp``: ranks, units, backend).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layercheck.trace import SCHEMA_VERSION, Trace, write_trace

from .capture import CaptureResult, _clear, summarize
from .config import ZeroConfig
from .errors import ProfilerError
from .launch import LAUNCHED_BY_PROFILER
from .machine import describe_machine
from .models import resolve_model
from .recorder import Recorder
from .trainer import PhaseTimes
from .fsdpjob import FsdpTrainer, init_fsdp
from .zerojob import ZeroTrainer, init_distributed

__all__ = ["zero_capture", "default_zero_name"]


def default_zero_name(zero: ZeroConfig, label: str) -> str:
    return f"{label}-{zero.backend}-{zero.capture.steps}steps"


@dataclass
class _Step:
    times: PhaseTimes
    share: float
    report: Any
    before: np.ndarray
    hook_s: float
    lc_s: float


@dataclass
class _Run:
    steps: list[_Step]
    writes: list[list[Any]]
    """[step, layer, name, reason, bytes, persist_s] of this rank's shard of each version."""
    layers: list[dict[str, Any]]
    lc: dict[str, Any]
    pruned: int
    metric: float
    restore: dict[str, Any]


def zero_capture(zero: ZeroConfig, *, out: Path | None = None, ckpt: Path | None = None,
                 keep_ckpt: bool = False, keep_history: bool = False, progress: bool = True,
                 say: Callable[[str], None] = print,
                 argv: list[str] | None = None) -> CaptureResult | None:
    """Run this rank's part of the capture (module doc): a collective. Rank 0
    writes the trace and returns its ``CaptureResult``; the other ranks return None."""
    started = time.perf_counter()
    source = resolve_model(zero.capture.model)
    trainer_class = FsdpTrainer if zero.fsdp else ZeroTrainer
    rank, world = init_fsdp() if zero.fsdp else init_distributed()
    if world != zero.ranks:
        raise ProfilerError(f"torchrun started {world} ranks but --ranks is {zero.ranks}: "
                            "drop --ranks, or give torchrun --nproc_per_node "
                            f"{zero.ranks}")
    import torch
    zero = dataclasses.replace(zero, capture=zero.capture.replace(
        threads=zero.capture.threads or torch.get_num_threads()))
    if rank == 0:
        say(zero.capture.scaling_note)
    trainer = trainer_class.prepare(zero, source=source)
    out = Path(out) if out else Path("traces") / default_zero_name(zero, source.label)
    scratch = ckpt is None
    ckpt_dir = _shared_folder(ckpt)
    try:
        machine = _machine(ckpt_dir, zero) if rank == 0 else {}
        run = _train(trainer, ckpt_dir, progress and rank == 0, keep_history)
        trace = _gather_trace(trainer, run, out.name, machine, argv)
    except BaseException:
        if rank == 0 and scratch and not keep_ckpt:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        raise
    _barrier()  # every rank is done with the folder
    if rank != 0:
        return None
    if scratch and not keep_ckpt:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    _clear(out)
    write_trace(trace, out)
    return CaptureResult(out, trace, {**summarize(trace), "wall_s": time.perf_counter() - started})


def _shared_folder(ckpt: Path | None) -> Path:
    """The checkpoint folder of every rank: ``ckpt``, or a temporary one rank 0 makes."""
    from layercheck.commit import all_gather_json
    import torch.distributed as dist
    mine = str(ckpt) if ckpt else (tempfile.mkdtemp(prefix="layercheck-zero-capture-")
                                   if dist.get_rank() == 0 else None)
    return Path(all_gather_json(mine, None, dist.get_world_size())[0])


def _machine(ckpt_dir: Path, zero: ZeroConfig) -> dict[str, Any]:
    machine = describe_machine("cpu", ckpt_dir)
    return {**machine, "ranks": zero.ranks, "threads_per_rank": zero.capture.threads}


def _train(trainer: ZeroTrainer, ckpt_dir: Path, progress: bool, keep_history: bool) -> _Run:
    from tqdm import tqdm
    config = trainer.config
    lc = trainer.make_layercheck(ckpt_dir, config.layercheck_config(
        keep_versions=None if keep_history else 1))
    steps: list[_Step] = []
    writes: list[list[Any]] = []
    try:
        if lc.restore() != 0:
            raise FileExistsError(f"{ckpt_dir} already holds a checkpoint: a capture starts "
                                  "fresh, so give an empty --ckpt folder")
        bar = tqdm(total=config.steps, desc=f"capture {trainer.source.label} ({trainer.zero.backend}, rank 0)",
                   unit="step", disable=not progress, mininterval=2.0, file=sys.stderr)
        position = 0
        for _ in range(config.steps):
            share, times = trainer.step(position)
            position += config.batch_size
            before = lc.state.accumulators.copy()
            hook_s = lc.drift.seconds  # the drift hook's time inside engine.step()
            t0 = time.perf_counter()
            report = lc.step(extra={"position": position})
            steps.append(_Step(times, share, report, before, hook_s, time.perf_counter() - t0))
            writes.extend(_rows(lc.drain_writes()))
            bar.update(1)
            bar.set_postfix(loss_share=f"{share:.3f}", refresh=False)
        bar.close()
        lc.flush()
        writes.extend(_rows(lc.drain_writes()))
        lc_dict = {"config": lc.config.to_dict(), "lr_peak": lc.lr_peak}
        layers = [{"name": l.name, "kind": l.kind, "params": l.numel} for l in lc.layer_map]
    finally:
        lc.close()
    metric = trainer.evaluate()
    return _Run(steps, writes, layers, lc_dict, lc.writer.bytes_dropped, metric,
                _measure_restore(trainer, ckpt_dir))


def _rows(records: list[Any]) -> list[list[Any]]:
    return [[r.step, r.layer, r.name, r.reason, r.bytes, r.persist_s] for r in records]


def _measure_restore(trainer: ZeroTrainer, ckpt_dir: Path) -> dict[str, Any]:
    """Every rank restores its shards of the newest committed step into the live
    engine (training is over): a real recovery's plan, load and restore times."""
    with trainer.make_layercheck(ckpt_dir, trainer.config.layercheck_config()) as lc:
        lc.restore()
        r = lc.restored
    return {"step": r.step, "plan_s": r.plan_s, "load_s": r.load_s, "restore_s": r.restore_s,
            "bytes": r.bytes}


# -- rank 0 assembles the trace -------------------------------------------------
def _gather_trace(trainer: ZeroTrainer, run: _Run, name: str, machine: dict[str, Any],
                  argv: list[str] | None) -> Trace | None:
    """A collective: every rank sends its part; rank 0 returns the trace."""
    import torch
    import torch.distributed as dist

    from layercheck.commit import all_gather_json
    world = dist.get_world_size()
    losses = torch.tensor([s.share for s in run.steps], dtype=torch.float64)
    dist.all_reduce(losses)
    step_s = [s.times.forward_s + s.times.backward_s + s.times.optimizer_s + s.lc_s
              for s in run.steps]
    parts = all_gather_json({"writes": run.writes, "restore": run.restore,
                             "median_step_s": float(np.median(step_s))}, None, world)
    if dist.get_rank() != 0:
        return None
    recorder = Recorder(len(run.layers))
    for s, loss in zip(run.steps, losses.tolist()):
        recorder.step(s.times, loss, s.report, s.before, drift_in_optimizer_s=s.hook_s)
    recorder.writes(_merge_writes([p["writes"] for p in parts]))
    recorder.restore(_merge_restores([p["restore"] for p in parts]))
    ranks = {"median_step_s_per_rank": [p["median_step_s"] for p in parts]}
    return _trace(trainer, recorder, run, name, machine, argv, ranks)


def _merge_writes(per_rank: list[list[list[Any]]]) -> list[Any]:
    """One WriteRecord per layer version: bytes of every rank's shard, rank 0's persist time."""
    from layercheck.writer import WriteRecord
    keys = [sorted((w[0], w[1]) for w in rows) for rows in per_rank]
    if any(k != keys[0] for k in keys):
        raise RuntimeError("the ranks committed different layer versions; ZeroLayerCheck "
                           "guarantees they do not, so this is a bug: report it")
    total: dict[tuple[int, int], int] = {}
    for rows in per_rank:
        for w in rows:
            total[(w[0], w[1])] = total.get((w[0], w[1]), 0) + int(w[4])
    return [WriteRecord(step, layer, name, reason, total[(step, layer)], persist_s)
            for step, layer, name, reason, _, persist_s in per_rank[0]]


def _merge_restores(per_rank: list[dict[str, Any]]) -> Any:
    from layercheck.checkpoint import RestoreReport
    if len({r["step"] for r in per_rank}) != 1:
        raise RuntimeError(f"the ranks restored different steps: {[r['step'] for r in per_rank]}")
    return RestoreReport(per_rank[0]["step"], None,
                         *(max(r[k] for r in per_rank) for k in ("plan_s", "load_s", "restore_s")),
                         sum(int(r["bytes"]) for r in per_rank))


def _trace(trainer: ZeroTrainer, recorder: Recorder, run: _Run, name: str,
           machine: dict[str, Any], argv: list[str] | None, ranks: dict[str, Any]) -> Trace:
    tables = recorder.tables()
    sizes = recorder.layer_bytes()
    layers = [{**layer, "bytes": sizes[i]} for i, layer in enumerate(run.layers)]
    zero, config = trainer.zero, trainer.config
    by_profiler = os.environ.get(LAUNCHED_BY_PROFILER) == "1"
    args = " ".join(argv or [])
    torchrun = f"torchrun --nproc_per_node {zero.ranks} -m profiler {args}"
    setup, key, details = trainer.setup()
    manifest = {
        "schema_version": SCHEMA_VERSION, "name": name, "kind": "captured",
        "description": (
            f"Captured by `{'python -m profiler ' + args if by_profiler else torchrun}`: a "
            f"{setup}. {trainer.source.label} ({trainer.num_params:,} parameters) trained "
            f"{config.steps} steps as a {trainer.source.objective} LM on Python's own "
            f"documentation, each step's {config.batch_size} sequences split "
            f"{zero.micro_batch} per rank. Step times are rank 0's; drift is each whole "
            f"layer's; write bytes are all ranks' shards together. {config.scaling_note}."),
        "model": {**trainer.source.describe(), "parameters": trainer.num_params,
                  "architecture": trainer.architecture,
                  "engine_module": type(trainer.model).__name__},
        "layers": layers, "config": run.lc["config"], "lr_peak": run.lc["lr_peak"],
        "machine": machine,
        "sources": {"data": trainer.corpus.describe(), "dataset": trainer.dataset.describe(),
                    "capture": config.to_dict(), "layercheck_scaling": config.scaling_note,
                    "command": "python -m profiler " + args if by_profiler else torchrun,
                    key: {**details, "launched_by": "python -m profiler (started torchrun)"
                          if by_profiler else "torchrun",
                          "torchrun_equivalent": torchrun, "step_times": "rank 0's", **ranks},
                    "pruned_superseded_bytes": run.pruned,
                    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "evaluation": {"name": trainer.metric_name, "value": run.metric},
    }
    return Trace(manifest=manifest, **tables)


def _barrier() -> None:
    import torch.distributed as dist
    dist.barrier()
