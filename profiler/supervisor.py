"""A real run under failures: workers started, SIGKILLed at the failure times, restarted.

``supervise`` starts a worker (``profiler.worker``, in validation mode: jobs
back to back under one strategy), waits until it resumes (time 0: its
model is ready and training starts), then at each failure time t_k kills
whatever worker is running with SIGKILL (training, saving, restarting or
loading) and at once starts a new one, which rebuilds the model, loads its
newest durable recovery point and trains on. At ``window_s`` the last
worker is killed too. Returns every worker's event log for
``profiler.ledger.account``.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .ledger import WorkerLog
from .mechanisms.restart import spawn_worker
from .worker import EventReader, write_job

__all__ = ["supervise", "RunSpec"]

POLL_S = 0.05
START_TIMEOUT_S = 600


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    strategy: str
    config: Any
    """The job's CaptureConfig."""
    device: str
    interval: int
    """Steps between checkpoints of a rollback strategy."""
    failures_s: tuple[float, ...]
    window_s: float
    root: Path
    """Scratch: the checkpoint folders and the workers' logs."""


class _Worker:
    def __init__(self, spec: RunSpec, index: int) -> None:
        root = spec.root
        self.log = root / f"worker{index}.jsonl"
        self.output = root / f"worker{index}.out"
        job = write_job(root / f"worker{index}.json", config=spec.config, device=spec.device,
                        root=root / "ckpt", log=self.log, strategy=spec.strategy,
                        interval=spec.interval, repeat=True, engine=True)
        self.spawned = time.time()
        self.proc = spawn_worker(job, self.output, spec.config.threads)
        self.killed: float | None = None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.killed = time.time()
        self.proc.wait()

    def check(self) -> None:
        """A worker that exits on its own has failed: say why."""
        code = self.proc.poll()
        if code is not None and self.killed is None:
            tail = self.output.read_text()[-2000:].strip().splitlines()[-6:]
            raise RuntimeError(f"a validation worker exited with {code}: " + " | ".join(tail))

    def record(self) -> WorkerLog:
        return WorkerLog(self.spawned, self.killed, EventReader(self.log).poll())


def supervise(spec: RunSpec, *, say: Callable[[str], None] = print) -> list[WorkerLog]:
    """Run ``spec`` for real (module doc)."""
    spec.root.mkdir(parents=True, exist_ok=True)
    workers = [_Worker(spec, 0)]
    try:
        start = _wait_for_start(workers[0])
        for t in [*spec.failures_s, spec.window_s]:
            _sleep_until(start + t, workers[-1])
            workers[-1].kill()
            if t < spec.window_s:
                say(f"  {spec.strategy}: failure at {t:.1f} s, worker {len(workers)} starts")
                workers.append(_Worker(spec, len(workers)))
    finally:
        for w in workers:
            if w.killed is None:
                w.kill()
    return [w.record() for w in workers]


def _wait_for_start(worker: _Worker) -> float:
    reader = EventReader(worker.log)
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        for event in reader.poll():
            if event["event"] == "resumed":
                return float(event["time"])
        worker.check()
        time.sleep(POLL_S)
    raise RuntimeError(f"the first worker did not start training within {START_TIMEOUT_S} s")


def _sleep_until(when: float, worker: _Worker) -> None:
    while True:
        left = when - time.time()
        if left <= 0:
            return
        worker.check()
        time.sleep(min(POLL_S, left))
