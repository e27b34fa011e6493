"""Starting a multi-rank capture: run as one rank under torchrun, or start torchrun.

``python -m profiler capture --deepspeed zero3`` (or ``--fsdp``) outside torchrun starts

    python -m torch.distributed.run --standalone --nproc_per_node R
        -m profiler capture <the same arguments>

(``torch.distributed.run`` is what the ``torchrun`` script runs) with
``DS_ACCELERATOR=cpu``, ``OMP_NUM_THREADS`` = ``--threads`` or the cores
shared out among the ranks, and ``HF_HUB_OFFLINE=1``, waits for it, and
returns its exit status. Typing the torchrun command yourself does the same.
``--standalone``: torchrun's rendezvous binds a port the system gives it, so
captures started at the same time on one machine never race for a port
(choosing a free port first and handing it over would leave that race open).
Inside torchrun (``LOCAL_RANK`` and ``WORLD_SIZE`` set) each process is one rank.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .config import ZeroConfig

__all__ = ["under_torchrun", "world_size", "torchrun", "rank_environment", "torchrun_command",
           "launch", "leave", "release_process_group", "LAUNCHED_BY_PROFILER"]

LAUNCHED_BY_PROFILER = "PROFILER_STARTED_TORCHRUN"
"""Set to 1 in the ranks' environment when the profiler started torchrun itself
(only recorded in the trace: which command the user typed)."""

ROOT = Path(__file__).resolve().parents[1]


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_size() -> int | None:
    """torchrun's world size, or None outside torchrun."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def threads_per_rank(zero: ZeroConfig) -> int:
    """``--threads``, else the machine's cores shared out among the ranks (at least 1)."""
    return zero.capture.threads or max(1, (os.cpu_count() or 1) // zero.ranks)


def torchrun(program: Sequence[str], ranks: int) -> list[str]:
    """The one torchrun command line of this repository: ``program`` (a script and its
    arguments, or ``-m``, a module and its arguments) as ``ranks`` local ranks, by
    this Python (``torch.distributed.run`` is what the ``torchrun`` script runs, so
    no script on PATH is needed). ``--standalone``: see the module doc. The
    profiler's launch, the benchmarks' jobs and the tests' workers start it."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(ranks), *program]


def rank_environment(threads: int, **extra: str) -> dict[str, str]:
    """This process's environment for the ranks of a torchrun job: ``threads`` torch
    CPU threads each (``OMP_NUM_THREADS``), Hugging Face offline, this checkout first
    on ``PYTHONPATH`` (so that the ranks import the code that started them), and
    ``extra`` (``DS_ACCELERATOR="cpu"`` for DeepSpeed on the CPU)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": path, **extra}


def torchrun_command(argv: Sequence[str], ranks: int) -> list[str]:
    """``python -m profiler <argv>`` as ``ranks`` local ranks under torchrun."""
    return torchrun(["-m", "profiler", *argv], ranks)


def launch(argv: Sequence[str], zero: ZeroConfig) -> int:
    """Run ``python -m profiler <argv>`` as ``zero.ranks`` ranks under torchrun;
    their exit status (0 when every rank succeeded)."""
    env = rank_environment(threads_per_rank(zero), DS_ACCELERATOR="cpu",
                           **{LAUNCHED_BY_PROFILER: "1"})
    command = torchrun_command(argv, zero.ranks)
    print(f"profiler: starting {zero.ranks} ranks: torchrun --nproc_per_node {zero.ranks} "
          f"-m profiler {' '.join(argv)}", file=sys.stderr)
    code = subprocess.run(command, env=env).returncode
    if code != 0:
        print(f"profiler: error: the {zero.backend} {argv[0]} failed (torchrun exit status "
              f"{code}); the failing rank's error is above", file=sys.stderr)
    return code



def leave(code: int) -> None:
    """End this process with exit status ``code``. A rank under torchrun ends its default
    process group (where it is still up) and then skips the interpreter's teardown: left
    to it, an FSDP2 rank on gloo aborted about once in 50 runs after its work was written
    and its process group destroyed ("terminate called without an active exception",
    SIGABRT: torch's native threads outliving the interpreter, cf. the discussion in
    pytorch/pytorch#179291), and torchrun then reported the whole job failed. stdout and
    stderr are flushed first; files a caller left open are not (close them)."""
    if not under_torchrun():
        sys.exit(code)
    import gc
    gc.collect()  # modules with hooks are cycles: their collectives' state goes first
    release_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def release_process_group() -> None:
    """End the default process group of this process, where one is up."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
