"""``python -m profiler capture``: real training with LayerCheck attached, recorded as a trace.

One pipeline for every job (``profiler.jobs.job``: a plain process, or a rank of a
DeepSpeed ZeRO-3 or a PyTorch FSDP2 job under torchrun; at world size 1
every collective is a no-op). Order of work: build the job, agree on the checkpoint folder (rank
0's choice), rank 0 measures the storage bandwidth there, train ``steps``
steps with the job's LayerCheck recording every phase, drift and write,
wait for the last write, evaluate on held-out text, measure one real
restore of the final step (every rank its shards), gather to rank 0, then
calibrate (``profiler.calibrate``: what each checkpointing strategy's
mechanism costs here; skipped with ``calibrate=False``). Rank 0 writes
``traces/<name>/`` (and ``costs.json``). The checkpoint directory is
scratch (a temporary folder unless ``ckpt`` is given) and is deleted at
the end unless kept.

What the figures mean when the job has several ranks:

- ``steps``: rank 0's phase times (the ranks wait for each other inside
  collectives, so rank 0's step is the job's step); ``drift_s`` is the drift
  hook plus what ``lc.step()`` adds (on several ranks the all-reduce of the sums);
  ``loss`` is the whole batch's mean loss (every rank's share summed).
- ``drift``: the drift of each whole layer (the same on every rank).
- ``writes``: one row per layer version; ``bytes`` is every rank's shard
  together, ``persist_s`` rank 0's submit-to-commit time.
- ``recovery``: the slowest rank's plan/load/restore seconds, and the bytes
  of every rank's shards.
"""
from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layercheck.contract.trace import SCHEMA_VERSION, Trace, write_trace
from layercheck.tools.inspection import format_size

from .config import CaptureConfig, ZeroConfig
from .contention import ContentionMeter, Lap, summarize as summarize_contention, warning
from .jobs.job import Job, PhaseTimes
from .jobs import open_job
from .machine import describe_machine
from .models import describe_lora
from .recorder import Recorder

__all__ = ["capture", "CaptureResult", "TRACE_FILES", "summarize"]

TRACE_FILES = ("manifest.json", "steps.parquet", "drift.parquet", "writes.parquet",
               "recovery.parquet", "drill.json", "costs.json", "validation.json")
"""Every file a capture (or a later drill, calibration or validation) puts in a trace folder."""


@dataclass(frozen=True)
class CaptureResult:
    path: Path
    trace: Trace
    summary: dict[str, Any]

    def text(self) -> str:
        """The summary a person reads: what was captured and where, the bytes against a
        full checkpoint at every step, the stall, and the next command to run."""
        s, out = self.summary, shlex.quote(str(self.path))
        model = self.trace.manifest.get("sources", {}).get("capture", {}).get("model", "the model")
        lines = [
            f"wrote {self.path}: {s['steps']:,} steps of {model} ({s['layers']} layers), "
            f"median step {s['step_s_median']:.3g} s",
            f"LayerCheck wrote {format_size(s['bytes_written'])} from its base checkpoint (step "
            f"{s['base_step']}) on: {s['bytes_vs_full_every_step']:.1%} of a full checkpoint "
            f"({format_size(s['full_checkpoint_bytes'])}) at every step",
            f"stall on the training thread: {s['stall_share']:.1%} of compute (drift tracking "
            f"{s['drift_share']:.1%})",
            f"training loss {s['loss_first']:.4g} at step 1, {s['loss_last10_mean']:.4g} over the "
            f"last {min(10, s['steps'])} steps"]
        evaluation = s.get("evaluation") or {}
        if evaluation.get("value") is not None:
            lines.append(f"{evaluation['name']}: {evaluation['value']:.4g}")
        if "costs" in s:
            lines.append(f"costs.json: {len(s['costs'])} figures of what each checkpointing "
                         "strategy's mechanism costs on this machine")
            lines.append(f"next: python -m sim --trace {out} --mtbf 2h   "
                         "# every strategy under failures, priced by this machine")
        else:
            lines.append(f"next: python -m profiler calibrate --trace {out}   "
                         f"# then: python -m sim --trace {out} --mtbf 2h")
        lines.append("(every figure as JSON: add --json)")
        return "\n".join(lines)


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
    """One rank's record of the training."""

    steps: list[_Step]
    writes: list[list[Any]]
    """[step, layer, name, reason, bytes, persist_s] of this rank's shard of each version."""
    layers: list[dict[str, Any]]
    lc: dict[str, Any]
    pruned: int
    metric: float
    restore: dict[str, Any]
    laps: list[Lap]
    """Per step: wall, machine-busy and this rank's CPU seconds (``profiler.contention``)."""


def capture(spec: CaptureConfig | ZeroConfig, *, out: Path | None = None,
            ckpt: Path | None = None, keep_ckpt: bool = False, keep_history: bool = False,
            progress: bool = True, say: Callable[[str], None] = print,
            argv: list[str] | None = None, calibrate: bool = True,
            repeats: int | None = None) -> CaptureResult | None:
    """Run the job of ``spec`` and write its trace (contract in the module doc). A
    collective under ZeRO: rank 0 returns the ``CaptureResult``, the others None.
    ``argv``: the arguments after ``python -m profiler`` (recorded as the command);
    ``repeats``: the calibration's repeats per figure (default: its own)."""
    started = time.perf_counter()
    job = open_job(spec, say=say)
    ranks = job.ranks
    out = Path(out) if out else Path("traces") / job.default_name()
    scratch = ckpt is None
    ckpt_dir = Path(ranks.from_coordinator(
        str(ckpt) if ckpt else tempfile.mkdtemp(prefix="layercheck-capture-")
        if ranks.is_coordinator else None))
    try:
        machine = describe_machine(job.device, ckpt_dir) if ranks.is_coordinator else {}
        run = _train(job, ckpt_dir, progress and ranks.is_coordinator, keep_history)
        trace = _gather_trace(job, run, out.name, machine, argv)
        costs = None
        if calibrate:
            from .calibrate import calibrate_job
            costs = calibrate_job(job, trace, near=ckpt_dir.parent, say=say, repeats=repeats)
    except BaseException:
        if ranks.is_coordinator and scratch and not keep_ckpt:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        raise
    ranks.barrier()  # every rank is done with the folder
    if not ranks.is_coordinator:
        return None
    if scratch and not keep_ckpt:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    _clear(out)
    write_trace(trace, out)
    summary = summarize(trace)
    said = warning(trace.manifest["machine"].get("contention"), f"capture of {out}")
    if said:
        say(f"warning: {said}")
    if costs is not None:
        from layercheck.contract.calibration import write_calibration
        write_calibration(costs, out)
        summary["costs"] = {name: f.value for name, f in costs.figures.items()}
    return CaptureResult(out, trace, {**summary, "wall_s": time.perf_counter() - started})


def _train(job: Job, ckpt_dir: Path, progress: bool, keep_history: bool) -> _Run:
    from tqdm import tqdm
    config = job.config
    lc = job.make_layercheck(ckpt_dir, config.layercheck_config(
        keep_versions=None if keep_history else 1))
    steps: list[_Step] = []
    writes: list[list[Any]] = []
    try:
        if lc.restore() != 0:
            raise FileExistsError(f"{ckpt_dir} already holds a checkpoint: a capture starts "
                                  "fresh, so give an empty --ckpt folder")
        label = job.source.label + (f" ({job.setup}, rank 0)" if job.setup else "")
        bar = tqdm(total=config.steps, desc=f"capture {label}", unit="step",
                   disable=not progress, mininterval=2.0, file=sys.stderr)
        position = 0
        meter, laps = ContentionMeter(), []
        meter.start()
        for _ in range(config.steps):
            share, times = job.step(position)
            position += config.batch_size
            before = lc.state.accumulators.copy()
            hook_s = lc.drift.hook_seconds()  # inside the optimizer phase (a GPU's time on a GPU)
            t0 = time.perf_counter()
            report = lc.step(extra={"position": position})
            steps.append(_Step(times, share, report, before, hook_s, time.perf_counter() - t0))
            laps.append(meter.lap())
            writes.extend(_rows(lc.drain_writes()))
            bar.update(1)
            bar.set_postfix(loss=f"{share:.3f}", refresh=False)
        bar.close()
        lc.flush()
        writes.extend(_rows(lc.drain_writes()))
        lc_dict = {"config": lc.config.to_dict(), "lr_peak": lc.lr_peak,
                   "sizes": lc.policy.sizes}
        layers = [{"name": l.name, "kind": l.kind, "params": l.numel} for l in lc.layer_map]
    finally:
        lc.close()
    metric = job.evaluate()
    return _Run(steps, writes, layers, lc_dict, lc.writer.bytes_dropped, metric,
                _measure_restore(job, ckpt_dir), laps)


def _rows(records: list[Any]) -> list[list[Any]]:
    return [[r.step, r.layer, r.name, r.reason, r.bytes, r.persist_s] for r in records]


def _measure_restore(job: Job, ckpt_dir: Path) -> dict[str, Any]:
    """Restore the newest committed step into the job's own model and optimizer
    (training is over; every rank its shards): a real recovery's plan, load and
    restore times."""
    with job.make_layercheck(ckpt_dir, job.config.layercheck_config()) as lc:
        lc.restore()
        r = lc.restored
    return {"step": r.step, "plan_s": r.plan_s, "load_s": r.load_s, "restore_s": r.restore_s,
            "bytes": r.bytes}


# -- rank 0 assembles the trace -------------------------------------------------
def _gather_trace(job: Job, run: _Run, name: str, machine: dict[str, Any],
                  argv: list[str] | None) -> Trace | None:
    """A collective: every rank sends its part; rank 0 returns the trace."""
    losses = job.ranks.all_reduce_sum([s.share for s in run.steps])
    job_cpu = job.ranks.all_reduce_sum([lap.own_s for lap in run.laps])
    step_s = [s.times.compute_s + s.lc_s for s in run.steps]
    parts = job.ranks.gather({"writes": run.writes, "restore": run.restore,
                              "median_step_s": float(np.median(step_s))})
    if not job.ranks.is_coordinator:
        return None
    recorder = Recorder(len(run.layers))
    for s, loss in zip(run.steps, losses):
        recorder.step(s.times, loss, s.report, s.before, drift_in_optimizer_s=s.hook_s)
    recorder.writes(_merge_writes([p["writes"] for p in parts]))
    recorder.restore(_merge_restores([p["restore"] for p in parts]))
    # rank 0's view of the machine against every rank's own CPU: the other processes
    contention = summarize_contention(run.laps, job_cpu)
    return _trace(job, recorder, run, name, {**machine, "contention": contention}, argv,
                  [p["median_step_s"] for p in parts])


def _merge_writes(per_rank: list[list[list[Any]]]) -> list[Any]:
    """One WriteRecord per layer version: bytes of every rank's shard, rank 0's persist time."""
    from layercheck.storage.writer import WriteRecord
    keys = [sorted((w[0], w[1]) for w in rows) for rows in per_rank]
    if any(k != keys[0] for k in keys):
        raise RuntimeError("the ranks committed different layer versions; ZeroLayerCheck "
                           "and FsdpLayerCheck guarantee they do not, so this is a bug: report it")
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


def _trace(job: Job, recorder: Recorder, run: _Run, name: str, machine: dict[str, Any],
           argv: list[str] | None, median_step_s: list[float]) -> Trace:
    """The one manifest builder: the job's own words come from ``job.manifest_parts``."""
    tables = recorder.tables()
    sizes, base = recorder.layer_bytes(), recorder.base_bytes()
    layers = [{**layer, "bytes": sizes.get(i, 0), "base_bytes": base.get(i, 0)}
              for i, layer in enumerate(run.layers)]
    if run.lc["sizes"] is not None:  # what a write budget charged (tensor bytes, no file header)
        for layer, state_bytes in zip(layers, run.lc["sizes"]):
            layer["state_bytes"] = int(state_bytes)
    config, source, command = job.config, job.source, job.command(argv)
    parts = job.manifest_parts(argv)
    if job.ranks.world_size > 1:
        parts["sources"].setdefault(job.sources_key, {})["median_step_s_per_rank"] = median_step_s
    shown = f"`{command}`" if command else "`python -m profiler capture`"
    lora = describe_lora(job.model)
    adapted = "" if lora is None else (
        f" with LoRA adapters (r={lora['r']}, alpha {lora['alpha']}, on "
        f"{', '.join(lora['target_modules'])}: {lora['trainable_parameters']:,} parameters "
        "train, the rest frozen)")
    manifest = {
        "schema_version": SCHEMA_VERSION, "name": name, "kind": "captured",
        "description": (f"Captured by {shown}: {parts['setup']}{source.label} "
                        f"({job.num_params:,} parameters){adapted} trained {config.steps} steps as a "
                        f"{source.objective} LM on Python's own documentation{parts['detail']}. "
                        f"{config.scaling_note}."),
        "model": {**source.describe(), "parameters": job.num_params,
                  "architecture": job.architecture, **parts["model"],
                  **({"lora": lora} if lora is not None else {})},
        "layers": layers, "config": run.lc["config"], "lr_peak": run.lc["lr_peak"],
        "machine": {**machine, **parts["machine"]},
        "sources": {"data": job.corpus.describe(), "dataset": job.dataset.describe(),
                    "capture": config.to_dict(), "layercheck_scaling": config.scaling_note,
                    "command": command, **parts["sources"],
                    "pruned_superseded_bytes": run.pruned,
                    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "evaluation": {"name": job.metric_name, "value": run.metric},
    }
    return Trace(manifest=manifest, **tables)


def _clear(out: Path) -> None:
    """A new capture replaces every file of an old trace (a stale drill.json must go)."""
    for name in TRACE_FILES:
        (out / name).unlink(missing_ok=True)


def summarize(trace: Trace) -> dict[str, Any]:
    """The headline figures of a captured trace."""
    s, w = trace.steps, trace.writes
    compute = trace.compute_seconds()
    base = int(w.loc[w["reason"] == "base", "step"].min()) if (w["reason"] == "base").any() else 1
    after = trace.num_steps - base + 1
    full = trace.full_checkpoint_bytes
    return {
        "steps": trace.num_steps, "layers": len(trace.layer_names),
        "step_s_median": float(np.median(compute + s["drift_s"] + s["stall_s"])),
        "forward_s_median": float(s["forward_s"].median()),
        "backward_s_median": float(s["backward_s"].median()),
        "optimizer_s_median": float(s["optimizer_s"].median()),
        "drift_share": float(s["drift_s"].sum() / compute.sum()),
        "stall_share": float(s["stall_s"].sum() / compute.sum()),
        "loss_first": float(s["loss"].iloc[0]), "loss_last10_mean": float(s["loss"].tail(10).mean()),
        "layer_writes": int(len(w)), "checkpoint_steps": int(w["step"].nunique()),
        "bytes_written": int(w["bytes"].sum()), "full_checkpoint_bytes": full,
        "full_every_step_bytes": int(full * after), "base_step": base,
        "bytes_vs_full_every_step": float(w["bytes"].sum() / (full * after)),
        "persist_s_median": float(w["persist_s"].median()) if len(w) else float("nan"),
        "evaluation": trace.manifest.get("evaluation"),
        "write_mb_per_s": trace.manifest["machine"].get("write_bytes_per_s", 0) / 1e6,
        "read_mb_per_s": trace.manifest["machine"].get("read_bytes_per_s", 0) / 1e6,
    }
