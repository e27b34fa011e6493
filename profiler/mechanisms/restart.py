"""restart: a new training process up to a model ready to load, as a failure would need.

Spawns the validation's own worker (``python -m profiler worker``, in probe
mode) ``repeats`` times, one after the other, and times each from the spawn
to its ``ready`` event: interpreter start, imports (torch, transformers,
layercheck, DeepSpeed where installed), the corpus and batches, the model
built (and, where DeepSpeed is installed, wrapped in the world-size-1
engine every validation worker builds, so that all strategies restart
alike). Under ZeRO or FSDP2 the probe is a torchrun of as many ranks as the job,
timed to rank 0's ready.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from layercheck.contract.calibration import Figure

from .base import Bench, Mechanism

__all__ = ["Restart", "spawn_worker", "worker_env"]

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600


class Restart(Mechanism):
    name = "restart"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        from ..engine import deepspeed_available
        from ..failures.worker import EventReader, write_job
        job = bench.job
        ranks = job.ranks.world_size
        samples = []
        with tempfile.TemporaryDirectory(prefix="layercheck-restart-", dir=bench.folder) as tmp:
            for i in range(bench.repeats):
                log = Path(tmp) / f"probe{i}.jsonl"
                spec = write_job(Path(tmp) / f"probe{i}.json", config=job.config, device=job.device,
                                 root=Path(tmp), log=log, engine=True, probe=True,
                                 zero_ranks=ranks if bench.zero else None,
                                 fsdp=job.kind == "fsdp")
                start = time.time()
                proc = spawn_worker(spec, Path(tmp) / f"probe{i}.out", job.config.threads, ranks)
                if proc.wait(timeout=READY_TIMEOUT_S) != 0:
                    tail = (Path(tmp) / f"probe{i}.out").read_text()[-1500:]
                    raise RuntimeError(f"the restart probe exited with {proc.returncode}: {tail}")
                ready = [e for e in EventReader(log).poll() if e["event"] == "ready"]
                samples.append(ready[0]["time"] - start)
        engine = ("; the model wrapped in a world-size-1 DeepSpeed engine, as every validation "
                  "worker does" if deepspeed_available() and not bench.zero else "")
        how = (f"torchrun of {ranks} ranks building the {job.setup} job, to rank 0's ready"
               if bench.zero else "a new `python -m profiler worker` process")
        return {"restart_s": Figure(
            value=statistics.median(samples), source="measured", samples=tuple(samples),
            seconds=statistics.median(samples),
            method=f"{how}: spawn to a model ready to load (interpreter, imports of torch, "
                   f"transformers and layercheck, corpus and batches, model built{engine}); "
                   f"median of {len(samples)} spawns one after the other")}


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
