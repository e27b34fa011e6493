"""LowDiff's writer process: a queue in front of one writer, as its code runs it.

In LowDiff's code (Chenxuan-Yao/TPDS-LowDiff, communicator/lowdiff_topk.py) rank 0
puts each step's compressed gradient on a ``torch.multiprocessing.Queue`` (no
maxsize) read by a separate process that writes the batches to storage one
after another; training goes on at once. ``queued_writer`` lays that out for a
failure-free run so that a ``Schedule`` can carry it (``sim.strategies.LowDiff``).
"""
from __future__ import annotations

import sys
from collections import deque

import numpy as np

__all__ = ["queued_writer"]

_KERNEL = f"{__name__.split('.')[0]}.kernel"
"""``sim.kernel``, the compiled walks (``sim.engine.compiled_kernel`` loads it)."""


def queued_writer(compute: np.ndarray, snap: np.ndarray, write: np.ndarray, full: np.ndarray,
                  full_s: float, slots: int | None) -> tuple[np.ndarray, int]:
    """LowDiff's writer process, failure-free, step by step (arrays of N+1, index i = after
    step i; ``compute`` has N). After step i training stalls ``snap[i]`` (compression and
    hand-off), then hands the batch ``write[i] > 0`` to the queue, waiting first only while
    ``slots`` batches are pending; the writer writes them in order. A full save
    (``full[i]``) is synchronous and the storage serves it after the writer's backlog.
    Adds those waits to ``snap`` (in place) and returns, per batch, the seconds from the
    end of its stall to its durability (NaN elsewhere): the second, non-blocking tier;
    and the most batches ever in the queue at once, the one being written included (what
    the queue holds in host memory).

    Simplification: the engines read these durable times for every run, so after a
    failure (the writer restarts empty) the first writes look as late as in the
    failure-free run; this delays LowDiff's recovery points only where its writer has a
    backlog, that is where it is write-bound.

    Where the compiled walks are loaded (``sim.engine.compiled_kernel``) they run this
    one: the same float64 operations in order (tested equal)."""
    kernel = sys.modules.get(_KERNEL)    # loaded by the engine, never here
    if kernel is not None:
        out, most = kernel.queued_writer_walk(
            np.ascontiguousarray(compute, dtype=np.float64), snap,
            np.ascontiguousarray(write, dtype=np.float64), np.ascontiguousarray(full, dtype=np.bool_),
            float(full_s), -1 if slots is None else int(slots))
        return out, int(most)
    n = compute.size
    out = np.full(n + 1, np.nan)
    t, free, pending = 0.0, 0.0, deque()        # pending: durable times, ascending (FIFO)
    most = 0
    for i in range(1, n + 1):
        t += compute[i - 1]                      # step i's compute has ended
        stall = 0.0
        if full[i]:                              # served after the writer's backlog
            stall = max(free - t, 0.0) + full_s
            free = t + stall
        stall += snap[i]
        end = t + stall
        if write[i] > 0:
            while pending and pending[0] <= end:
                pending.popleft()
            if slots is not None and len(pending) >= slots:
                wait = pending[len(pending) - slots] - end   # until a slot frees
                stall, end = stall + wait, end + wait
                while pending and pending[0] <= end:
                    pending.popleft()
            free = max(free, end) + write[i]
            pending.append(free)
            most = max(most, len(pending))
            out[i] = free - end
        snap[i] = stall
        t = end
    return out, most
