"""The drill's training process (``python -m profiler worker JOB.json``, internal).

It builds the job from the config alone, restores from the LayerCheck
directory (step 0 on a fresh one), trains to the end, evaluates, and logs
one JSON line per event to ``job["log"]``: ``start`` (with the restore's
plan/load/restore seconds), ``step`` (loss), ``halted``, ``done`` (metric).
With ``halt_at`` it stops after that step once the step's checkpoint is
committed, logs ``halted`` and waits to be killed: the drill delivers the
failure with SIGKILL, so nothing of the process survives but its directory.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from .config import CaptureConfig
from .plainjob import PlainJob

__all__ = ["run_job", "write_job"]


def write_job(path: Path, *, config: CaptureConfig, device: str, ckpt: Path, log: Path,
              halt_at: int | None) -> Path:
    job = {"config": config.to_dict(), "device": device, "ckpt": str(ckpt), "log": str(log),
           "halt_at": halt_at}
    path.write_text(json.dumps(job, indent=2))
    return path


def run_job(path: Path) -> int:
    job = json.loads(Path(path).read_text())
    config = CaptureConfig.from_dict(job["config"]).replace(device=job["device"])
    trainer = PlainJob.prepare(config, say=lambda _: None)
    ckpt = Path(job["ckpt"])
    with open(job["log"], "a") as log, trainer.make_layercheck(
            ckpt, config.layercheck_config(keep_versions=1)) as lc:
        start = lc.restore()
        _emit(log, "start", pid=os.getpid(), **_restore_fields(lc.restored))
        position = (lc.extra or {}).get("position", 0)
        for step in range(start + 1, config.steps + 1):
            loss, _ = trainer.step(position)
            position += config.batch_size
            lc.step(extra={"position": position})
            _emit(log, "step", step=step, loss=loss)
            if step == job["halt_at"]:
                lc.flush()  # the failure strikes after step t's checkpoint committed
                _emit(log, "halted", step=step)
                _wait_for_the_kill()
    metric = trainer.evaluate()
    with open(job["log"], "a") as log:
        _emit(log, "done", metric=metric)
    return 0


def _restore_fields(report: Any) -> dict[str, Any]:
    return {"restored": report.step, "plan_s": report.plan_s, "load_s": report.load_s,
            "restore_s": report.restore_s, "bytes": report.bytes}


def _emit(log: TextIO, event: str, **fields: Any) -> None:
    log.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
    log.flush()


def _wait_for_the_kill() -> None:
    while True:
        time.sleep(3600)
