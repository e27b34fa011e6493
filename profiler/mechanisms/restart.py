"""restart: a training process killed as a failure kills it, and its successor up to a model ready to load.

The validation's supervisor SIGKILLs a training worker's whole process group and at
once starts the next, and its ledger counts the restart from the kill to the new
worker's ``ready``. This probe does the same ``repeats`` times, one after the other:
it starts the validation's own worker (``python -m profiler worker``) training the
job (its own loop, no checkpointing), waits for step ``VICTIM_STEPS`` (the victim
holds the job's model, optimizer state and activations and runs its threads, as at a
failure), SIGKILLs it with its group (``kill_worker``, the supervisor's own kill),
reaps it, and times from the kill to the successor's ``ready`` event: interpreter
start, imports (torch, transformers, layercheck, DeepSpeed where installed), the
corpus and batches, the model built (and, where DeepSpeed is installed, wrapped in
the world-size-1 engine every validation worker builds, so that all strategies
restart alike). Version 1 spawned the probes back to back on an idle machine, and
a real killed run's restarts took 1.5-2 s longer each; timed from a kill, the restart
came out no longer (7.96 s against 8.37 s: docs/results.md), so the kill is not that gap,
but this is how a failure restarts a worker. Nor is it the victim's checkpoints: a
victim that had written DeepSpeed saves every 6 steps restarted no slower than one
that wrote none (``benchmarks/bench_restart.py``, docs/benchmarks.md). Under ZeRO or
FSDP2 the probe is a torchrun of as many ranks as the job, timed from its spawn to
rank 0's ready.

``time_restarts`` chains the probe: each successor but the last trains on and is the
next victim, so ``count`` restarts cost one interpreter start less each than
separate probes; its first victim may train under any strategy's checkpointer, whose
steps it returns, and its first successor may resume from that checkpointer's
folder, a fresh process's load timed as a run's (the validation's probe beside a
run, ``profiler.failures.costprobe``).
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from layercheck.contract.calibration import Figure
from sim.strategies import DeepSpeed

from .base import Bench, Mechanism

__all__ = ["Restart", "Restarts", "spawn_worker", "kill_worker", "worker_env", "time_restart",
           "time_restarts"]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600
VICTIM_STEPS = 3
"""Steps the killed worker trains first: past its first (warm-up) steps, mid-run."""
NEVER = 10 ** 9
"""A checkpoint interval no job reaches: the probe's victim and successor save nothing."""


class Restart(Mechanism):
    name = "restart"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        from ..engine import deepspeed_available
        job = bench.job
        ranks = job.ranks.world_size
        samples = []
        with tempfile.TemporaryDirectory(prefix="layercheck-restart-", dir=bench.folder) as tmp:
            for i in range(bench.repeats):
                folder = Path(tmp) / f"probe{i}"
                folder.mkdir()
                samples.append(_multi_rank(job, folder, ranks) if bench.zero
                               else time_restart(job.config, job.device, folder).seconds)
        engine = ("; the model wrapped in a world-size-1 DeepSpeed engine, as every validation "
                  "worker does" if deepspeed_available() and not bench.zero else "")
        how = (f"torchrun of {ranks} ranks building the {job.setup} job, timed from its "
               "spawn to rank 0's" if bench.zero else
               f"a training `python -m profiler worker` SIGKILLed with its process group "
               f"after step {VICTIM_STEPS}, as the validation's supervisor kills, and a new "
               "one timed from the kill to its")
        return {"restart_s": Figure(
            value=statistics.median(samples), source="measured", samples=tuple(samples),
            seconds=statistics.median(samples),
            method=f"{how} model ready to load (interpreter, imports of torch, "
                   f"transformers and layercheck, corpus and batches, model built{engine}); "
                   f"median of {len(samples)}, one after the other")}


@dataclass(frozen=True)
class Restarted:
    """One timed restart: the kill (wall clock), the successor's ready, the victim's pid."""

    killed: float
    ready: float
    victim: int

    @property
    def seconds(self) -> float:
        return self.ready - self.killed


def time_restart(config, device: str, folder: Path, *, every: int = NEVER,
                 kill_at: int = VICTIM_STEPS) -> Restarted:
    """A worker training the job of ``config`` (a ``CaptureConfig``) on ``device``, with
    a DeepSpeed checkpoint every ``every`` steps (none by default), killed once step
    ``kill_at`` has ended (its save, if it has one, done), and its successor timed to
    ready (module doc), in ``folder``."""
    return time_restarts(config, device, folder, count=1, every=every, kill_at=kill_at).restarts[0]


@dataclass(frozen=True)
class Restarts:
    """``count`` restarts timed one after the other, the first victim's steps, and
    (with ``resume``) the first successor's load of the first victim's checkpoint."""

    restarts: tuple[Restarted, ...]
    victim_steps: tuple[dict, ...]
    """The first victim's ``step`` events (``profiler.failures.worker``) up to the kill:
    what its checkpointer cost it, step by step."""
    resumed: dict | None = None
    """The first successor's ``resumed`` event (``step``: the step it restored, 0: none)."""
    load_s: float | None = None
    """From that successor's ``ready`` to its ``resumed``: a load as the validation's
    ledger counts one."""

    @property
    def samples(self) -> tuple[float, ...]:
        return tuple(r.seconds for r in self.restarts)

    @property
    def seconds(self) -> float:
        """The median restart: one start is one noisy sample of the machine's."""
        return statistics.median(self.samples)


def time_restarts(config, device: str, folder: Path, *, count: int, every: int = NEVER,
                  kill_at: int = VICTIM_STEPS, strategy: str = DeepSpeed.name,
                  options: dict | None = None, resume: bool = False) -> Restarts:
    """``time_restart`` ``count`` times in a chain: the first victim trains under
    ``strategy``'s checkpointer (``profiler.checkpointers.REAL``, with ``options``) every
    ``every`` steps and is killed after step ``kill_at``; each successor but the last
    trains ``VICTIM_STEPS`` steps (saving nothing, but the first with ``resume``) and is
    the next victim; each is timed
    from its predecessor's kill to its ready. The validation probes a chain beside each
    run: the machine's restart, and its checkpoints at the run's cadence inside a
    running job. With ``resume`` the first successor is the run's next worker: under
    the same checkpointer, in the first victim's folder, it loads the newest recovery
    point in a fresh process as a run's worker does after a failure (``Restarts.resumed``)."""
    if every < 1 or kill_at < 1 or count < 1:
        raise ValueError(f"a restart probe needs every >= 1, kill_at >= 1 and count >= 1, "
                         f"not {every}, {kill_at} and {count}")
    victim = _spawn(config, device, folder, "victim", interval=every, probe=False,
                    strategy=strategy, options=options)
    _wait_for(folder / "victim.jsonl", victim, folder / "victim.out",
              lambda e: e["event"] == "step" and int(e["step"]) >= kill_at)
    restarts, steps, resumed, load = [], (), None, None
    for i in range(count):
        name, last = "successor" if i == 0 else f"successor{i}", i == count - 1
        killed = time.time()
        kill_worker(victim)
        if i == 0:
            steps = _steps(folder / "victim.jsonl", killed)
        loads = resume and i == 0
        successor = (_spawn(config, device, folder, name, interval=every, probe=False,
                            strategy=strategy, options=options, root="victim") if loads
                     else _spawn(config, device, folder, name, interval=NEVER, probe=last))
        log, output = folder / f"{name}.jsonl", folder / f"{name}.out"
        ready = _wait_for(log, successor, output, lambda e: e["event"] == "ready")
        restarts.append(Restarted(killed, float(ready["time"]), victim.pid))
        if loads:
            resumed = _wait_for(log, successor, output, lambda e: e["event"] == "resumed")
            load = float(resumed["time"]) - float(ready["time"])
            if last:  # a worker that trains on: it ends as the others, killed
                kill_worker(successor)
                break
        if not last:
            _wait_for(log, successor, output,
                      lambda e: e["event"] == "step" and int(e["step"]) >= VICTIM_STEPS + (
                          int(resumed["step"]) if loads else 0))
            victim = successor
    else:  # the last worker was a probe: it stopped at ready
        if successor.wait(timeout=READY_TIMEOUT_S) != 0:
            raise RuntimeError(f"the restart probe exited with {successor.returncode}: "
                               f"{(folder / f'{name}.out').read_text()[-1500:]}")
    return Restarts(tuple(restarts), steps, resumed, load)


def _steps(log: Path, killed: float) -> tuple[dict, ...]:
    from ..failures.worker import EventReader
    return tuple(e for e in EventReader(log).poll() if e["event"] == "step" and e["time"] <= killed)


def _spawn(config, device: str, folder: Path, name: str, *, interval: int, probe: bool,
           strategy: str = DeepSpeed.name, options: dict | None = None,
           root: str | None = None) -> subprocess.Popen:
    """A worker of the chain, its checkpoints in ``folder/ckpt/<root or name>``."""
    from ..failures.worker import write_job
    spec = write_job(folder / f"{name}.json", config=config, device=device,
                     root=folder / "ckpt" / (root or name), log=folder / f"{name}.jsonl",
                     strategy=strategy,
                     interval=interval, repeat=True, engine=True, probe=probe, options=options)
    return spawn_worker(spec, folder / f"{name}.out", config.threads)


def _wait_for(log: Path, proc: subprocess.Popen, output: Path, wanted) -> dict:
    """The first event of ``log`` that ``wanted`` accepts; RuntimeError with the worker's
    output where it exits first or none comes within ``READY_TIMEOUT_S``."""
    from ..failures.worker import EventReader
    reader, deadline = EventReader(log), time.time() + READY_TIMEOUT_S
    while time.time() < deadline:
        for event in reader.poll():
            if wanted(event):
                return event
        if proc.poll() is not None:
            raise RuntimeError(f"a restart probe's worker exited with {proc.returncode}: "
                               f"{output.read_text()[-1500:]}")
        time.sleep(0.01)
    kill_worker(proc)
    raise RuntimeError(f"a restart probe's worker sent no such event within {READY_TIMEOUT_S} s")


def _multi_rank(job, folder: Path, ranks: int) -> float:
    """A torchrun of the job's ranks, from its spawn to rank 0's ready."""
    from ..failures.worker import EventReader, write_job
    log = folder / "probe.jsonl"
    spec = write_job(folder / "probe.json", config=job.config, device=job.device, root=folder,
                     log=log, engine=True, probe=True, zero_ranks=ranks, fsdp=job.kind == "fsdp")
    start = time.time()
    proc = spawn_worker(spec, folder / "probe.out", job.config.threads, ranks)
    if proc.wait(timeout=READY_TIMEOUT_S) != 0:
        tail = (folder / "probe.out").read_text()[-1500:]
        raise RuntimeError(f"the restart probe exited with {proc.returncode}: {tail}")
    ready = [e for e in EventReader(log).poll() if e["event"] == "ready"]
    return ready[0]["time"] - start


def kill_worker(proc: subprocess.Popen) -> None:
    """SIGKILL a worker's whole process group (it leads one: ``spawn_worker``) and reap it:
    how a failure ends a worker, here and in the validation's supervisor."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def worker_env(threads: int | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)  # a worker is a job of its own, not a rank of the capture's
    return env


def spawn_worker(spec: Path, output: Path, threads: int | None, ranks: int = 1) -> subprocess.Popen:
    """Start ``python -m profiler worker SPEC`` (under torchrun with ``ranks`` > 1)."""
    from ..launch import torchrun_command
    argv = ["worker", str(spec)]
    command = (torchrun_command(argv, ranks) if ranks > 1
               else [sys.executable, "-m", "profiler", *argv])
    with open(output, "w") as out:
        # a session of its own: a torchrun probe's clean-up signals its process group,
        # which must not be the capture's own ranks
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env=worker_env(threads), cwd=str(ROOT), start_new_session=True)
