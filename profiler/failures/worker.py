"""The training process of a drill or a validation (``python -m profiler worker JOB.json``, internal).

It builds the plain job from the config alone, then logs one JSON line per
event to ``job["log"]`` (a supervisor reads it as it grows, ``EventReader``):

- ``ready``: the job is built (model, data, optimizer; in a validation also
  the world-size-1 DeepSpeed engine every strategy's worker builds, so that
  all restart alike): a model ready to load. With ``probe`` the process
  stops here (the calibration's restart measurement). Its ``entered``,
  ``prepared`` and ``built`` are the wall-clock times the worker's code began
  (the interpreter started and the CLI imported), the job was prepared (corpus,
  batches, model, optimizer) and the engine was built: where a restart went.
- ``resumed``: the newest recovery point of the current job's folder is
  loaded (``step`` 0: none, the job starts at step 1 from the initial model),
  with ``resume_s`` (the whole load) and, under LayerCheck, the restore's
  parts (``plan_s``, ``load_s``, ``restore_s``, ``bytes``) and the step of
  each layer's version (``sources``); under tiered also ``tiers``, how many layers
  came from each tier (memory, storage).
- ``step``: one optimizer step, with wall-clock timestamps: ``begin`` (the
  step starts), ``computed`` (its forward, backward and optimizer are done:
  the checkpoint, if any, begins) and ``time`` (the checkpoint is done); and
  ``loss``, ``tracking_s`` (the part of the optimizer phase that was the
  strategy's: LayerCheck's drift tracking, LowDiff's compression), ``held_s``
  (the seconds the step's weight update waited for the strategy: CheckFreq's
  snapshot, ``Checkpointer.held_s``), and the process's own timers of the same
  spans, ``compute_s`` (forward + backward + optimizer, less tracking and held)
  and ``stall_s`` (the training thread's checkpoint work, tracking and held
  included). ``profiler.failures.ledger`` counts from the
  timestamps.
- ``halted`` (a drill: after step ``halt_at`` is committed it waits to be
  killed with SIGKILL), ``job_done`` (a validation goes on with the next job
  at step 1 from the initial model, in a fresh folder), ``done`` (a drill's
  final held-out ``metric``).

Which job a validation is in is durable (``job.json`` in the root, replaced
atomically once a job's last step is done), so a new worker resumes the
job its predecessor was killed in.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sim.strategies import LayerCheck

from ..config import CaptureConfig

__all__ = ["run_job", "write_job", "EventReader"]


def write_job(path: Path, *, config: CaptureConfig, device: str, root: Path, log: Path,
              strategy: str = LayerCheck.name, interval: int = 1, halt_at: int | None = None,
              repeat: bool = False, engine: bool = False, probe: bool = False,
              zero_ranks: int | None = None, fsdp: bool = False,
              options: dict[str, Any] | None = None) -> Path:
    """The job file of one worker. ``root`` holds the checkpoint folders;
    ``repeat``: jobs back to back until killed (a validation), else one job and
    an evaluation (a drill); ``engine``: build the DeepSpeed engine at start-up;
    ``probe``: stop once ready; ``zero_ranks``: (a probe only) build the ZeRO-3
    job (with ``fsdp``: the FSDP2 job) as one rank of that many, under torchrun;
    ``options``: the strategy's checkpointer's own keywords (``RealStrategy.options``,
    and GEMINI's ``peer``)."""
    job = {"config": config.to_dict(), "device": device, "root": str(root), "log": str(log),
           "strategy": strategy, "interval": interval, "halt_at": halt_at, "repeat": repeat,
           "engine": engine, "probe": probe, "zero_ranks": zero_ranks,
           "fsdp": fsdp, "options": options or {}}
    path.write_text(json.dumps(job, indent=2))
    return path


def run_job(path: Path) -> int:
    entered = time.time()
    from ..checkpointers import checkpointer_class
    from ..jobs.plain import PlainJob
    spec = json.loads(Path(path).read_text())
    config = CaptureConfig.from_dict(spec["config"]).replace(device=spec["device"])
    if spec.get("zero_ranks"):
        return _zero_probe(config, spec)
    job = PlainJob.prepare(config, say=lambda _: None)
    prepared = time.time()
    if spec["engine"]:
        from ..engine import deepspeed_available, engine_for
        if deepspeed_available():
            engine_for(job)
    root = Path(spec["root"])
    with open(spec["log"], "a") as log:
        _emit(log, "ready", pid=os.getpid(), entered=entered, prepared=prepared, built=time.time())
        if spec["probe"]:
            return 0
        initial = _Initial.of(job) if spec["repeat"] else None
        while True:
            number = _current(root)
            checkpointer = checkpointer_class(spec["strategy"])(job, root / f"job{number}",
                                                          interval=spec["interval"],
                                                          **spec.get("options", {}))
            _train_one(job, checkpointer, number, spec["halt_at"], log)
            if initial is None:
                break
            _finish(root, number)
            _emit(log, "job_done", job=number)
            checkpointer.close()
            initial.restore(job)
        checkpointer.close()
        _emit(log, "done", metric=job.evaluate())
    return 0


def _zero_probe(config: CaptureConfig, spec: dict[str, Any]) -> int:
    from ..config import ZeroConfig
    from ..jobs import open_job
    job = open_job(ZeroConfig(capture=config, ranks=spec["zero_ranks"],
                              fsdp=bool(spec.get("fsdp"))), say=lambda _: None)
    if job.ranks.is_coordinator:
        with open(spec["log"], "a") as log:
            _emit(log, "ready", pid=os.getpid())
    return 0


def _train_one(job: Any, checkpointer: Any, number: int, halt_at: int | None,
               log: TextIO) -> None:
    config = job.config
    start = time.perf_counter()
    resume = checkpointer.load()
    fields = _restore_fields(checkpointer)
    step, position = (resume.step, resume.position) if resume else (0, 0)
    _emit(log, "resumed", job=number, step=step, resume_s=time.perf_counter() - start,
          sources=resume.sources if resume else {}, **fields)
    for step in range(step + 1, config.steps + 1):
        begin = time.time()
        loss, times = job.step(position)
        computed = time.time()
        held = checkpointer.held_s()
        position += config.batch_size
        saved = checkpointer.save(step, position) if checkpointer.due(step, config.steps) else None
        tracking = saved.tracking_s if saved else 0.0
        _emit(log, "step", job=number, step=step, loss=loss, begin=begin, computed=computed,
              compute_s=times.compute_s - tracking - held,
              stall_s=held + (saved.stall_s if saved else 0.0), tracking_s=tracking,
              held_s=held)
        if step == halt_at:
            checkpointer.flush()  # the failure strikes after step t's checkpoint committed
            _emit(log, "halted", step=step)
            _wait_for_the_kill()


def _restore_fields(checkpointer: Any) -> dict[str, Any]:
    report = getattr(getattr(checkpointer, "lc", None), "restored", None)
    if report is None:
        return {}
    fields = {"restored": report.step, "plan_s": report.plan_s, "load_s": report.load_s,
              "restore_s": report.restore_s, "bytes": report.bytes}
    if hasattr(checkpointer, "tiers_taken"):  # tiered: how many layers came from each tier
        fields["tiers"] = checkpointer.tiers_taken()
    return fields


@dataclass
class _Initial:
    """The job's state before its first step, to start the next job from."""

    model: dict[str, Any]
    scheduler: dict[str, Any]
    lrs: list[float]

    @classmethod
    def of(cls, job: Any) -> "_Initial":
        import copy
        return cls({k: v.detach().clone() for k, v in job.model.state_dict().items()},
                   copy.deepcopy(job.scheduler.state_dict()),
                   [g["lr"] for g in job.optimizer.param_groups])

    def restore(self, job: Any) -> None:
        job.model.load_state_dict(self.model)
        job.optimizer.state.clear()
        job.scheduler.load_state_dict(self.scheduler)
        for group, lr in zip(job.optimizer.param_groups, self.lrs):
            group["lr"] = lr


def _current(root: Path) -> int:
    path = root / "job.json"
    return int(json.loads(path.read_text())["job"]) if path.exists() else 0


def _finish(root: Path, number: int) -> None:
    """Record durably that job ``number`` is done (a new worker starts the next)."""
    path, tmp = root / "job.json", root / "job.json.tmp"
    root.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as handle:
        handle.write(json.dumps({"job": number + 1}))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _emit(log: TextIO, event: str, **fields: Any) -> None:
    log.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
    log.flush()


def _wait_for_the_kill() -> None:
    while True:
        time.sleep(3600)


class EventReader:
    """Reads a worker's JSON-lines log as it grows (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.events = Path(path), 0, []

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.events.extend(new)
        return new
