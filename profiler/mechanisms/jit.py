"""jit: how long the survivors of a data-parallel job take to notice a dead peer.

Just-in-time checkpointing (``sim.strategies.jit``) starts its checkpoint once the
surviving replicas learn of the failure. Measured here: two processes form a gloo
group over a FileStore in the scratch folder, both finish one all-reduce, then rank 0
enters a second all-reduce that rank 1 never joins and the measuring side SIGKILLs
rank 1; the figure is the time from the kill to rank 0's collective raising (both
clocks are this host's ``time.time``). That is a crash seen through the dead peer's
closed connection; a hung GPU, whose connection stays open, is caught only by the
collective's timeout (the figure's band says so). The replicas' loss and the
steady-state overhead cannot be measured on one machine: they are the declared
defaults, said so in their method.

Both processes stop by themselves: rank 1 exits after twice the timeout if nobody kills
it, rank 0 after its collective raises or times out; the measuring side kills whatever
outlives ``JIT_TIMEOUT_S``.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from layercheck.contract.calibration import Figure

from ..errors import ProfilerError
from .base import Bench, Mechanism
from .restart import ROOT, worker_env

__all__ = ["JitDetection", "detection_seconds", "JIT_TIMEOUT_S"]

JIT_TIMEOUT_S = 60.0
"""The collective's timeout and the most one measurement may take; past it, killed."""

_RANK = r"""
import datetime, sys, time
import torch
import torch.distributed as dist
rank, store, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=timeout))
t = torch.ones(1)
dist.all_reduce(t)
print("ready", flush=True)
if rank == 1:
    time.sleep(2 * timeout)
    sys.exit(0)
try:
    dist.all_reduce(t)
    print("undetected", flush=True)
except Exception as exc:
    print(f"detected {time.time():.6f} {type(exc).__name__}", flush=True)
"""


def detection_seconds(folder: Path, repeats: int) -> tuple[list[float], str]:
    """``repeats`` measurements (module doc), one after the other, and the error the
    survivor saw; no process is left running, whatever happened."""
    samples, error = [], ""
    for i in range(repeats):
        store = Path(folder) / f"store-{i}"
        procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(rank), str(store),
                                   str(JIT_TIMEOUT_S)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=worker_env(1),
                                  cwd=str(ROOT)) for rank in (0, 1)]
        try:
            for proc in procs:
                if proc.stdout.readline().strip() != "ready":
                    raise ProfilerError("jit detection: a rank did not start (gloo on a "
                                        f"FileStore in {folder}); run it alone to see why")
            time.sleep(0.2)                      # rank 0 inside its second all-reduce
            killed = time.time()
            procs[1].kill()
            out, _ = procs[0].communicate(timeout=JIT_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            raise ProfilerError(f"jit detection: the survivor saw nothing within "
                                f"{JIT_TIMEOUT_S + 10:.0f} s of its peer's death") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stdout.close()
        fields = out.split()
        if len(fields) < 3 or fields[0] != "detected":
            raise ProfilerError(f"jit detection: the survivor's collective did not raise "
                                f"({out.strip()!r}) after its peer was killed")
        samples.append(float(fields[1]) - killed)
        error = fields[2]
    return samples, error


class JitDetection(Mechanism):
    """jit: a dead peer's detection by the survivor's collective, and the figures one
    machine cannot measure (their declared defaults)."""

    name = "jit detection"
    stated = ("jit_replica_loss_probability", "jit_overhead_fraction")

    def measure(self, bench: Bench) -> dict[str, Figure]:
        samples, error = detection_seconds(bench.scratch("jit"), bench.repeats)
        seconds = statistics.median(samples)
        out = {"jit_detect_s": Figure(value=seconds, source="measured", samples=tuple(samples), method=(
            "two gloo processes on this host, one SIGKILLed while the other waits in an "
            f"all-reduce it never joins: kill to the survivor's {error}; median of "
            f"{len(samples)}, {seconds:.3f} s (a crash seen through the closed connection; a "
            f"hang would wait for the collective's timeout, {JIT_TIMEOUT_S:.0f} s here)"))}
        out.update(self.stated_figures())
        return out
