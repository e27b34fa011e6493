"""A real run under failures: workers started, SIGKILLed at the failure times, restarted.

``supervise`` starts a worker (``profiler.failures.worker``, in validation mode: jobs
back to back under one strategy), waits until it resumes (time 0: its
model is ready and training starts), then at each failure time t_k kills
whatever worker is running with SIGKILL (training, saving, restarting or
loading), with every process it started (its process group: LowDiff's
writer dies with it, as on a failed machine), and at once starts a new one,
which rebuilds the model, loads its newest durable recovery point and
trains on. At ``window_s`` the last worker is killed too.

GEMINI's peer (``profiler.checkpointers.peerstore``) is this process's child, so it
outlives the workers; at a failure whose ``peer_lost`` is true it is killed
too and a new, empty one started (the failure took the peer's memory).

A strategy with a memory tier on its node (``RealStrategy.node_memory``: tiered) keeps
it in a folder this process owns (``profiler.failures.nodes.NodeMemory``, given to every
worker as ``tier``), which outlives the workers as a node's memory outlives its
processes; at each failure, once its worker is dead, the folder loses what the failure
took (``RunSpec.losses``: only processes, the node, or the node and its buddy).

Every spawn and kill is written, with its wall-clock time, to the run's
``supervisor.jsonl`` (``profiler.failures.ledger.SUPERVISOR_LOG``); ``supervise``
returns the run's logs as read back from its folder
(``profiler.failures.ledger.read_run``). What other processes used the machine during
the run, from the first spawn to the last kill (``profiler.contention``: the
machine's busy CPU less this process's, its reaped children's and the
workers' own children's), is written to the folder's ``contention.json``
(``CONTENTION_FILE``): a measured side is only this job's if that is near 0.
"""
from __future__ import annotations

import time
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..checkpointers import real
from ..contention import ContentionMeter, Descendants, summarize
from .ledger import SUPERVISOR_LOG, WorkerLog, read_run
from .nodes import PROCESS, NodeMemory
from ..mechanisms.restart import kill_worker, spawn_worker
from .worker import EventReader, write_job

__all__ = ["supervise", "RunSpec", "CONTENTION_FILE"]

CONTENTION_FILE = "contention.json"
POLL_S = 0.05
SAMPLE_S = 0.5
"""How often the workers' own children's CPU is read (``contention.Descendants``)."""
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
    options: dict[str, Any] = field(default_factory=dict)
    """The checkpointer's own keywords (``profiler.failures.worker.write_job``)."""
    peer_lost: tuple[bool, ...] = ()
    """Per failure: whether it takes GEMINI's peer too (missing: it does not)."""
    losses: tuple[str, ...] = ()
    """Per failure, what it takes from a strategy with a memory tier on its node
    (``profiler.failures.nodes.KINDS``; missing: only processes)."""


class _Worker:
    def __init__(self, spec: RunSpec, index: int, options: dict[str, Any], log: "_Log") -> None:
        root = spec.root
        self.index = index
        self.log = root / f"worker{index}.jsonl"
        self.output = root / f"worker{index}.out"
        job = write_job(root / f"worker{index}.json", config=spec.config, device=spec.device,
                        root=root / "ckpt", log=self.log, strategy=spec.strategy,
                        interval=spec.interval, repeat=True, engine=True, options=options)
        self.spawned = log.write("spawn", worker=index)
        self.proc = spawn_worker(job, self.output, spec.config.threads)
        self.killed: float | None = None

    def kill(self, log: "_Log", **fields: Any) -> None:
        """SIGKILL the worker's whole process group (it leads one: ``spawn_worker``)."""
        self.killed = log.write("kill", worker=self.index, **fields)
        kill_worker(self.proc)

    def check(self) -> None:
        """A worker that exits on its own has failed: say why."""
        code = self.proc.poll()
        if code is not None and self.killed is None:
            tail = self.output.read_text()[-2000:].strip().splitlines()[-6:]
            raise RuntimeError(f"a validation worker exited with {code}: " + " | ".join(tail))


def supervise(spec: RunSpec, *, say: Callable[[str], None] = print) -> list[WorkerLog]:
    """Run ``spec`` for real (module doc)."""
    spec.root.mkdir(parents=True, exist_ok=True)
    log = _Log(spec.root / SUPERVISOR_LOG)
    meter, others = ContentionMeter(children=True), Descendants()
    meter.start()
    peer = _Peer(log) if real(spec.strategy).peer else None
    node = NodeMemory(spec.root / "node") if real(spec.strategy).node_memory else None
    options = lambda: {**spec.options, **({"peer": peer.port} if peer else {}),  # noqa: E731
                       **({"tier": str(node.folder)} if node else {})}
    workers = [_Worker(spec, 0, options(), log)]
    watch = _Watch(others, workers)
    try:
        start = _wait_for_start(workers[0])
        log.write("window", start=start, end=start + spec.window_s)
        for k, t in enumerate([*spec.failures_s, spec.window_s]):
            _sleep_until(start + t, workers[-1], watch)
            watch.sample()  # the newest CPU of the worker's children, just before they die
            if t >= spec.window_s:
                workers[-1].kill(log)
                break
            lost = peer is not None and k < len(spec.peer_lost) and spec.peer_lost[k]
            took = (spec.losses[k] if k < len(spec.losses) else PROCESS) if node else None
            workers[-1].kill(log, peer_lost=lost, **({"lost": took} if node else {}))
            if lost:
                peer.restart()
            if node is not None:
                node.lose(took)
            said = " (and its peer)" if lost else f" ({took} lost)" if node else ""
            say(f"  {spec.strategy}: failure at {t:.1f} s{said}, worker {len(workers)} starts")
            workers.append(_Worker(spec, len(workers), options(), log))
    finally:
        for w in workers:
            if w.killed is None:
                w.kill(log)
        if peer is not None:
            peer.stop()
        if node is not None:
            node.close()
    lap = meter.lap()  # every worker and the peer reaped: their CPU is in os.times()
    record = summarize([lap], [lap.own_s + others.cpu_s])
    (spec.root / CONTENTION_FILE).write_text(json.dumps(record) + "\n")
    return read_run(spec.root)


class _Watch:
    """Samples the running workers' own children every ``SAMPLE_S``."""

    def __init__(self, others: Descendants, workers: list["_Worker"]) -> None:
        self.others, self.workers, self.last = others, workers, 0.0

    def sample(self) -> None:
        self.others.sample({w.proc.pid for w in self.workers if w.killed is None})
        self.last = time.monotonic()

    def due(self) -> None:
        if time.monotonic() - self.last >= SAMPLE_S:
            self.sample()


class _Log:
    """The supervisor's own event log (JSON lines, flushed as written)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> float:
        now = time.time()
        with open(self.path, "a") as out:
            out.write(json.dumps({"event": event, "time": now, **fields}) + "\n")
        return now


class _Peer:
    """GEMINI's peer process, restarted empty when a failure takes it."""

    def __init__(self, log: _Log) -> None:
        from ..checkpointers.peerstore import start_peer
        self.log, self.start = log, start_peer
        self.proc, self.port = start_peer()
        log.write("peer", port=self.port)

    def restart(self) -> None:
        self.stop()
        self.proc, self.port = self.start()
        self.log.write("peer", port=self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


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


def _sleep_until(when: float, worker: _Worker, watch: _Watch) -> None:
    while True:
        left = when - time.time()
        if left <= 0:
            return
        worker.check()
        watch.due()
        time.sleep(min(POLL_S, left))
