"""``python -m profiler capture``: real training with LayerCheck attached, recorded as a trace.

Order of work: resolve the device, build the job (``Trainer``), measure the
storage bandwidth where the checkpoints go, train ``steps`` steps with
LayerCheck recording every phase, drift and write, wait for the last write,
evaluate on held-out text, measure one real restore of the final step, and
write ``traces/<name>/``. The checkpoint directory is scratch (a temporary
folder unless ``ckpt`` is given) and is deleted at the end unless kept.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layercheck.trace import SCHEMA_VERSION, Trace, write_trace

from .config import CaptureConfig
from .machine import describe_machine, resolve_device
from .models import resolve_model
from .recorder import Recorder
from .trainer import Trainer

__all__ = ["capture", "CaptureResult", "default_name", "TRACE_FILES"]

TRACE_FILES = ("manifest.json", "steps.parquet", "drift.parquet", "writes.parquet",
               "recovery.parquet", "drill.json")


@dataclass(frozen=True)
class CaptureResult:
    path: Path
    trace: Trace
    summary: dict[str, Any]


def default_name(config: CaptureConfig, label: str) -> str:
    return f"{label}-{config.steps}steps"


def capture(config: CaptureConfig, *, out: Path | None = None, ckpt: Path | None = None,
            keep_ckpt: bool = False, keep_history: bool = False, progress: bool = True,
            say: Callable[[str], None] = print, argv: list[str] | None = None) -> CaptureResult:
    """Run the job of ``config`` and write its trace (contract in the module doc)."""
    started = time.perf_counter()
    source = resolve_model(config.model)  # bad input fails here, before torch loads
    import torch
    device, note = resolve_device(config.device)
    if note:
        print(note, file=sys.stderr)
    config = config.replace(threads=config.threads or torch.get_num_threads())
    say(config.scaling_note)
    trainer = Trainer.prepare(config, device, source=source)
    out = Path(out) if out else Path("traces") / default_name(config, trainer.source.label)
    scratch = ckpt is None
    ckpt_dir = Path(ckpt) if ckpt else Path(tempfile.mkdtemp(prefix="layercheck-capture-"))
    try:
        machine = describe_machine(device, ckpt_dir)
        recorder, lc_dict, metric, pruned = _train(trainer, ckpt_dir, progress, keep_history)
        trace = _trace(trainer, recorder, out.name, lc_dict, machine, metric, argv, pruned)
    finally:
        if scratch and not keep_ckpt:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    _clear(out)
    write_trace(trace, out)
    return CaptureResult(out, trace, {**summarize(trace), "wall_s": time.perf_counter() - started})


def _train(trainer: Trainer, ckpt_dir: Path, progress: bool,
           keep_history: bool) -> tuple[Recorder, dict[str, Any], float, int]:
    from layercheck import LayerCheck
    from tqdm import tqdm
    config = trainer.config
    lc = LayerCheck(trainer.model, trainer.optimizer, ckpt_dir,
                    config.layercheck_config(keep_versions=None if keep_history else 1),
                    scheduler=trainer.scheduler)
    recorder = Recorder(len(lc.layer_map))
    try:
        if lc.restore() != 0:
            raise FileExistsError(f"{ckpt_dir} already holds a checkpoint: a capture starts "
                                  "fresh, so give an empty --ckpt folder")
        bar = tqdm(total=config.steps, desc=f"capture {trainer.source.label}", unit="step",
                   disable=not progress, mininterval=2.0, file=sys.stderr)
        position = 0
        for _ in range(config.steps):
            loss, times = trainer.step(position)
            position += config.batch_size
            before = lc.state.accumulators.copy()
            report = lc.step(extra={"position": position})
            recorder.step(times, loss, report, before)
            recorder.writes(lc.drain_writes())
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.close()
        lc.flush()
        recorder.writes(lc.drain_writes())
        lc_dict, lr_peak, sizes = lc.config.to_dict(), lc.lr_peak, lc.policy.sizes
    finally:
        lc.close()
    metric = trainer.evaluate()
    recorder.restore(_measure_restore(trainer, ckpt_dir))
    return (recorder, {"config": lc_dict, "lr_peak": lr_peak, "sizes": sizes}, metric,
            lc.writer.bytes_dropped)


def _measure_restore(trainer: Trainer, ckpt_dir: Path) -> Any:
    """Restore the newest committed step into the job's own model and optimizer
    (training is over): a real recovery's plan, load and restore times."""
    from layercheck import LayerCheck
    with LayerCheck(trainer.model, trainer.optimizer, ckpt_dir, trainer.config.layercheck_config(),
                    scheduler=trainer.scheduler) as lc:
        lc.restore()
        return lc.restored


def _trace(trainer: Trainer, recorder: Recorder, name: str, lc: dict[str, Any],
           machine: dict[str, Any], metric: float, argv: list[str] | None,
           pruned: int) -> Trace:
    tables = recorder.tables()
    from layercheck.layermap import LayerMap
    layer_map = LayerMap.auto(trainer.model)
    sizes = recorder.layer_bytes()
    layers = [{"name": l.name, "kind": l.kind, "params": l.numel, "bytes": sizes[i]}
              for i, l in enumerate(layer_map)]
    if lc["sizes"] is not None:  # what a write budget charged (tensor bytes, no file header)
        for layer, state_bytes in zip(layers, lc["sizes"]):
            layer["state_bytes"] = int(state_bytes)
    config = trainer.config
    manifest = {
        "schema_version": SCHEMA_VERSION, "name": name, "kind": "captured",
        "description": (f"Captured by `python -m profiler capture`: {trainer.source.label} "
                        f"({trainer.num_params:,} parameters) trained {config.steps} steps "
                        f"as a {trainer.source.objective} LM on Python's own documentation, "
                        f"on {machine['device']}. {config.scaling_note}."),
        "model": {**trainer.source.describe(), "parameters": trainer.num_params,
                  "architecture": type(trainer.model).__name__},
        "layers": layers, "config": lc["config"], "lr_peak": lc["lr_peak"], "machine": machine,
        "sources": {"data": trainer.corpus.describe(), "dataset": trainer.dataset.describe(),
                    "capture": config.to_dict(), "layercheck_scaling": config.scaling_note,
                    "command": " ".join(argv) if argv else None,
                    "pruned_superseded_bytes": pruned,
                    "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "evaluation": {"name": trainer.metric_name, "value": metric},
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
