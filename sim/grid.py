"""A grid of lanes cut into pieces and run in parallel: a local process pool, or Dask.

Contract. ``run_grid`` returns exactly what ``sim.engine.run_lanes`` returns for the
same lanes, whatever the number of workers or pieces: a lane's totals depend
only on its timeline, its failures and the stacked timelines (``_Stack``), and
every piece is run with all the timelines and its lanes' failure rows, so the
same seeds give the same numbers on one core, on a process pool or on a
cluster (tested). The loop (compiled or numpy) is chosen once, here, and every
piece runs that one, so no worker changes a result by the ulp the two differ by
in ``stale_s``.

Where the pieces run:

- ``scheduler`` (or the environment's ``LAYERCHECK_SIM_SCHEDULER``), an address
  such as ``tcp://10.0.0.5:8786``: on that Dask distributed scheduler's workers
  (``dask[distributed]``, the optional extra ``layercheck[distributed]``; each
  worker needs this package installed). The timelines go to every worker once.
- otherwise a local process pool (``concurrent.futures``) of ``workers``
  processes (default: the CPUs this process may use) when ``workers`` is given
  or the grid has at least ``POOL_MIN_WORK`` lane-segments; a smaller one runs in
  this process, where starting processes would cost more than it saves.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import types
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

from .engine import RESULT_FIELDS, LaneResults, resolve_kernel, run_lanes
from .errors import SimError
from .scheduler import HANDSHAKE_TIMEOUT_S, SCHEDULER_ENV, connect
from .timeline import Timeline

__all__ = ["run_grid", "SCHEDULER_ENV", "POOL_MIN_WORK", "PIECES_PER_WORKER"]

POOL_MIN_WORK = 50_000_000
"""Lane-segments (a lane's failures + 1, summed) below which a grid runs in this
process unless ``workers`` is given: about 3 s of the compiled loop on one core. A
pool costs about 0.3 s to fork and close, and on a shared machine its workers
compete with the load for the same cores: the issue's sweep (19.4 M) took 4.9 s in
one process and 6.7 s on a pool of 2 at load average 10 (docs/benchmarks-sim.md), so
only grids that can save seconds go to a pool by default."""
PIECES_PER_WORKER = 4
"""Pieces per worker, so that a worker held up by other load leaves work to the rest."""
CONNECT_TIMEOUT_S = HANDSHAKE_TIMEOUT_S
"""How long a scheduler's address may take to connect and answer Dask's handshake
before it is named as unreachable or not a scheduler (``sim.scheduler``)."""


def run_grid(timelines: Sequence[Timeline], strategy: np.ndarray, failures: Sequence[np.ndarray],
             row: np.ndarray, uniforms: Sequence[np.ndarray], window_s: float, *,
             workers: int | None = None, scheduler: str | None = None,
             kernel: str | None = None) -> LaneResults:
    """``run_lanes(timelines, strategy, failures, row, uniforms, window_s)``, its lanes in
    pieces on ``scheduler``'s Dask workers or on ``workers`` local processes (see the
    module's docstring); the same totals in every case."""
    strategy, row = np.asarray(strategy, dtype=np.int64), np.asarray(row, dtype=np.int64)
    counts = np.array([len(f) for f in failures], dtype=np.int64)
    kernel = resolve_kernel(kernel, turns=int(counts[row].max()) + 1 if len(row) else 0)
    given, workers = workers, _workers(workers)
    scheduler = scheduler or os.environ.get(SCHEDULER_ENV) or None
    if scheduler is not None:
        return _on_dask(scheduler, timelines, strategy, failures, row, uniforms, window_s, kernel)
    work = int((counts[row] + 1).sum())
    if workers == 1 or (given is None and work < POOL_MIN_WORK) or len(row) < 2:
        return run_lanes(timelines, strategy, failures, row, uniforms, window_s, kernel=kernel)
    # never more pieces than lanes, however many workers were asked for
    pieces = _pieces(row, counts, min(workers * PIECES_PER_WORKER, len(row)))
    if kernel == "compiled":
        # compiled (or loaded from numba's cache) once here, so forked workers inherit it
        run_lanes(timelines, strategy[:0], failures, row[:0], uniforms, window_s, kernel=kernel)
    context = _context()
    global _INHERITED
    with ProcessPoolExecutor(max_workers=min(workers, len(pieces)), mp_context=context) as pool:
        if context.get_start_method() == "fork":
            # forked workers (started at the first submit) inherit the grid: only each
            # piece's lane indices are sent, not its timelines and failures
            _INHERITED = (timelines, strategy, failures, row, uniforms)
            try:
                futures = [pool.submit(_run_inherited, p, window_s, kernel) for p in pieces]
            finally:
                _INHERITED = None
        else:
            with _main_not_rerun():                     # the workers start at these submits
                futures = [pool.submit(_run_piece, timelines,
                                       *_piece_args(p, strategy, failures, row, uniforms),
                                       window_s, kernel)
                           for p in pieces]
        return _assemble(pieces, [f.result() for f in futures], len(row))


def _workers(workers: int | None) -> int:
    if workers is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise SimError(f"workers={workers!r} must be a positive integer (processes to run on)")
    return int(workers)


def _pieces(row: np.ndarray, counts: np.ndarray, wanted: int) -> list[np.ndarray]:
    """Lane indices cut into up to ``wanted`` pieces of about equal work, each piece whole
    failure rows (so it ships only its rows' failures); deterministic."""
    rows = np.unique(row)
    lanes_of = np.argsort(row, kind="stable")
    per_row = np.bincount(row, minlength=len(counts))[rows] * (counts[rows] + 1)
    edges = np.searchsorted(np.cumsum(per_row), np.linspace(0, per_row.sum(), wanted + 1)[1:-1],
                            side="left")
    bounds = np.unique(np.concatenate(([0], edges + 1, [len(rows)])).clip(0, len(rows)))
    starts = np.searchsorted(row[lanes_of], rows)
    ends = np.concatenate((starts[1:], [len(row)]))
    return [lanes_of[starts[a]:ends[b - 1]] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _piece_args(lanes: np.ndarray, strategy, failures, row, uniforms):
    """A piece's lanes with its failure rows only, renumbered."""
    rows, local = np.unique(row[lanes], return_inverse=True)
    return (strategy[lanes], [failures[r] for r in rows], local.astype(np.int64),
            [uniforms[r] for r in rows])


def _run_piece(timelines, strategy, failures, row, uniforms, window_s, kernel) -> LaneResults:
    return run_lanes(timelines, strategy, failures, row, uniforms, window_s, kernel=kernel)


_INHERITED = None
"""The grid a pool of forked workers is started with: (timelines, strategy, failures,
row, uniforms)."""


def _run_inherited(lanes: np.ndarray, window_s: float, kernel: str) -> LaneResults:
    timelines, strategy, failures, row, uniforms = _INHERITED
    return _run_piece(timelines, *_piece_args(lanes, strategy, failures, row, uniforms),
                      window_s, kernel)


def _assemble(pieces: list[np.ndarray], results: list[LaneResults], n: int) -> LaneResults:
    cols = {f: np.zeros(n) for f in RESULT_FIELDS}
    for lanes, res in zip(pieces, results):
        for f in RESULT_FIELDS:
            cols[f][lanes] = getattr(res, f)
    return LaneResults(**cols)


def _context():
    """fork where it is safe (Linux, no other Python thread that could hold a lock the
    child needs): the workers inherit the imported modules and the compiled loop at
    once. Otherwise forkserver (spawn where there is none): each worker imports them."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


@contextlib.contextmanager
def _main_not_rerun():
    """While workers start by forkserver or spawn, ``__main__`` is a bare module.

    Such a worker (and the fork server itself) first runs the parent's main script again
    (``multiprocessing.spawn``'s preparation) unless main is import-safe. A Streamlit page
    is not: Streamlit makes each page script ``__main__``, so a worker would run the page
    again outside any session and crash (BrokenProcessPool). The workers need nothing
    from main: what they run and what they are sent lives in ``sim``. Swapped for the
    submits only, restored whatever happens."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = main


def _on_dask(address: str, timelines, strategy, failures, row, uniforms, window_s, kernel):
    # the address is probed first, the handshake bounded (sim.scheduler)
    client = connect(address, env=SCHEDULER_ENV, timeout=CONNECT_TIMEOUT_S)
    with client:
        cores = sum(client.nthreads().values())
        if cores == 0:
            raise SimError(f"the Dask scheduler at {address} has no workers: start some "
                           f"(`dask worker {address}`, each with this package installed)")
        counts = np.array([len(f) for f in failures], dtype=np.int64)
        pieces = _pieces(row, counts, max(1, min(len(row), cores * PIECES_PER_WORKER)))
        [shared] = client.scatter([list(timelines)], broadcast=True)
        futures = [client.submit(_run_piece, shared, *_piece_args(p, strategy, failures, row,
                                                                  uniforms), window_s, kernel,
                                 pure=False) for p in pieces]
        return _assemble(pieces, client.gather(futures), len(row))

