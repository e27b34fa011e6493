"""Starting a multi-rank capture: run as one rank under torchrun, or start torchrun.

``python -m profiler capture --deepspeed zero3`` (or ``--fsdp``) outside torchrun starts

    python -m torch.distributed.run --nproc_per_node R --master_addr 127.0.0.1
        --master_port <free port> -m profiler capture <the same arguments>

(``torch.distributed.run`` is what the ``torchrun`` script runs) with
``DS_ACCELERATOR=cpu``, ``OMP_NUM_THREADS`` = ``--threads`` or the cores
shared out among the ranks, and ``HF_HUB_OFFLINE=1``, waits for it, and
returns its exit status. Typing the torchrun command yourself does the same.
Inside torchrun (``LOCAL_RANK`` and ``WORLD_SIZE`` set) each process is one rank.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .config import ZeroConfig

__all__ = ["under_torchrun", "world_size", "torchrun_command", "launch", "LAUNCHED_BY_PROFILER"]

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


def torchrun_command(argv: Sequence[str], ranks: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
            "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "profiler", *argv]


def launch(argv: Sequence[str], zero: ZeroConfig) -> int:
    """Run ``python -m profiler <argv>`` as ``zero.ranks`` ranks under torchrun;
    their exit status (0 when every rank succeeded)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": str(threads_per_rank(zero)),
           "HF_HUB_OFFLINE": "1", LAUNCHED_BY_PROFILER: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    command = torchrun_command(argv, zero.ranks, _free_port())
    print(f"profiler: starting {zero.ranks} ranks: torchrun --nproc_per_node {zero.ranks} "
          f"-m profiler {' '.join(argv)}", file=sys.stderr)
    code = subprocess.run(command, env=env).returncode
    if code != 0:
        print(f"profiler: error: the {zero.backend} {argv[0]} failed (torchrun exit status "
              f"{code}); the failing rank's error is above", file=sys.stderr)
    return code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
