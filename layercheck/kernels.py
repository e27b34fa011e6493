"""Fused drift sums: one pass over w, exp_avg and exp_avg_sq (numba; optional).

Contract. ``FusedPass(extents).run(ptr, eps_c, alpha, phase)`` returns, for
each entry k (one parameter), the two sums that ``DriftTracker`` needs:

    moved[k] = sum |(1 / (sqrt(v + TINY) + eps_c[k])) * m + alpha[k] * w|
    size[k]  = sum |w|

over the entry's measured elements, reading each of w, m and v once. The
element arithmetic is strict IEEE fp32 in the same order as the foreach path
(+TINY, sqrt, +eps_c, reciprocal, *m, +alpha w; no fast-math), so an element's
value is the one the foreach path computes up to one rounding (torch may fuse
the last multiply-add). Only the summation order is free: fp32 partial sums
over runs of at most SUM_BLOCK elements (relative error <= (SUM_BLOCK-1) u =
3.8e-6 in any order, all terms being >= 0), accumulated in float64 per
segment, and segments summed in a fixed order: the result does not depend on
the number of threads.

Inputs (the caller checks them; nothing here can):
``ptr[k] = (w, m, v)`` addresses of contiguous CPU fp32 tensors of
``extents[k].numel`` elements, alive for the call; ``m = v = 0`` for an entry
that was not updated this step (only ``size`` is computed, ``moved`` is 0).
An extent ``(numel, span, take)`` with ``take < span`` is sampled: of the first
``numel // span * span`` elements, each run of ``span`` contributes ``take``
consecutive elements starting at ``(phase * take) % span`` (a block that
rotates with ``phase``); ``take == span`` measures every element.

Zero-copy: the kernel views the tensors' memory through their addresses (one
call for the whole model; a call per tensor would cost a parallel launch
each). This module needs numba; ``layercheck.drift`` imports it on first use
and keeps its torch path where the import fails.
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple, Sequence

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

if "NUMBA_THREADING_LAYER" not in os.environ:
    # numba's GNU OpenMP layer aborts any process forked after it ran ("fork() called
    # from a process already using GNU OpenMP"), which would kill DataLoader workers
    # and forked trainers; the workqueue layer is fork-safe (one caller at a time,
    # which a training loop's hook is)
    numba.config.THREADING_LAYER = "workqueue"

__all__ = ["CHUNK", "SUM_BLOCK", "TINY", "Extent", "FusedPass"]

CHUNK = 1 << 16
"""Elements per segment: 768 KiB of w, m and v, a unit of work for one thread."""
SUM_BLOCK = 64
"""Elements per fp32 partial sum (bounds its relative error by 63 u)."""
TINY = np.float32(1e-30)
"""Added to v before sqrt, as the torch path does (see drift._TINY): no result changes."""


class Extent(NamedTuple):
    numel: int
    span: int
    take: int


class FusedPass:
    """Segment and job tables for a fixed list of extents (built once, run every step)."""

    def __init__(self, extents: Sequence[tuple[int, int, int]]) -> None:
        extents = [Extent(*e) for e in extents]
        segments = [s for k, e in enumerate(extents) for s in _segments(k, e)]
        self.entries = len(extents)
        self.numel = np.array([e.numel for e in extents], dtype=np.int64)
        self.seg = np.array(segments, dtype=np.int64).reshape(-1, 5)
        self.jobs = _jobs(self.seg)
        self._out = np.zeros((len(self.seg), 2))

    def run(self, ptr: np.ndarray, eps_c: np.ndarray, alpha: np.ndarray,
            phase: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
        """(moved, size) per entry, float64; see the module doc."""
        _parallel_or_serial()(ptr, self.numel, eps_c, alpha, self.seg, self.jobs, phase,
                              self._out, threads)
        k = self.seg[:, 0]
        return (np.bincount(k, self._out[:, 0], minlength=self.entries),
                np.bincount(k, self._out[:, 1], minlength=self.entries))


_PARALLEL_PID: int | None = None
"""The process whose numba threads ran the parallel kernel (None: not yet)."""


def _parallel_or_serial():
    """The parallel kernel, or in a process forked after its parent ran it, the
    serial twin: numba's threading layers are not fork-safe (a forked child
    that re-enters them can hang), and a child must never hang in a hook.
    Both compute the same sums: summation order is fixed per segment."""
    global _PARALLEL_PID
    if _PARALLEL_PID is None:
        _PARALLEL_PID = os.getpid()
    if _PARALLEL_PID != os.getpid():
        return _run_serial
    return _run_parallel


_PARALLEL_LOCK = threading.Lock()
"""The workqueue layer takes one parallel call at a time: two trackers stepping
from two threads must queue, not crash the process."""


def _run_parallel(ptr, numel, eps_c, alpha, seg, jobs, phase, out, threads):
    with _PARALLEL_LOCK:
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        _fused_sums(ptr, numel, eps_c, alpha, seg, jobs, phase, out)


def _run_serial(ptr, numel, eps_c, alpha, seg, jobs, phase, out, threads):
    _fused_sums_serial(ptr, numel, eps_c, alpha, seg, jobs, phase, out)


def warm() -> None:
    """Compile (or load from the cache) both kernels now, e.g. before forking
    workers, so that no process pays the JIT inside a training step."""
    w = np.ones(64, dtype=np.float32)
    m, v = np.zeros(64, dtype=np.float32), np.zeros(64, dtype=np.float32)
    ptr = np.array([[w.ctypes.data, m.ctypes.data, v.ctypes.data]], dtype=np.int64)
    plan = FusedPass([Extent(64, 64, 64)])
    args = (ptr, plan.numel, np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32),
            plan.seg, plan.jobs, 0, plan._out)
    _fused_sums(*args)
    _fused_sums_serial(*args)


def _segments(k: int, e: Extent) -> list[tuple[int, int, int, int, int]]:
    """(entry, lo, hi, span, take) pieces of about CHUNK elements of address range."""
    if e.take >= e.span:
        return [(k, lo, min(lo + CHUNK, e.numel), min(CHUNK, e.numel - lo), min(CHUNK, e.numel - lo))
                for lo in range(0, e.numel, CHUNK)]
    stop = e.numel // e.span * e.span
    step = max(1, CHUNK // e.span) * e.span
    return [(k, lo, min(lo + step, stop), e.span, e.take) for lo in range(0, stop, step)]


def _jobs(seg: np.ndarray) -> np.ndarray:
    """Consecutive segments grouped into jobs of about CHUNK elements read, so that
    threads get equal work however small the tensors (job j = seg[jobs[j]:jobs[j+1]])."""
    cost = (seg[:, 2] - seg[:, 1]) * seg[:, 4] // np.maximum(seg[:, 3], 1) + 256
    starts, acc = [0], 0
    for i, c in enumerate(cost.tolist()):
        acc += c
        if acc >= CHUNK:
            starts.append(i + 1)
            acc = 0
    if starts[-1] != len(seg):
        starts.append(len(seg))
    return np.array(starts, dtype=np.int64)


@intrinsic
def _f32_at(typingctx, address):
    """The fp32 pointer at an integer address (the zero-copy view's base)."""
    sig = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


# error_model="numpy": IEEE division (no Python zero-check branch, which
# would keep the loops scalar). No fast-math for the element arithmetic.
@njit(error_model="numpy", cache=True)
def _moved_term(w, m, v, eps_c, alpha):
    return abs((np.float32(1.0) / (np.sqrt(v + TINY) + eps_c)) * m + alpha * w)


# reassoc lets LLVM vectorise the fp32 block sums (in lanes); it applies to
# these additions only: _moved_term is compiled, and keeps its flags, apart.
# Loops index slices from 0: indices LLVM can prove non-negative need no
# wrap-around check, which would otherwise keep the loops scalar.
@njit(fastmath={"reassoc"}, error_model="numpy", cache=True)
def _adam_run(w, m, v, eps_c, alpha):
    moved = 0.0
    size = 0.0
    for b in range(0, w.size, SUM_BLOCK):
        bm = np.float32(0.0)
        bs = np.float32(0.0)
        for i in range(b, min(b + SUM_BLOCK, w.size)):
            bm += _moved_term(w[i], m[i], v[i], eps_c, alpha)
            bs += abs(w[i])
        moved += bm
        size += bs
    return moved, size


@njit(fastmath={"reassoc"}, error_model="numpy", cache=True)
def _abs_run(w):
    size = 0.0
    for b in range(0, w.size, SUM_BLOCK):
        bs = np.float32(0.0)
        for i in range(b, min(b + SUM_BLOCK, w.size)):
            bs += abs(w[i])
        size += bs
    return size


@njit(parallel=True, error_model="numpy", cache=True, nogil=True)
def _fused_sums(ptr, numel, eps_c, alpha, seg, jobs, phase, out):
    for j in prange(jobs.size - 1):
        for s in range(jobs[j], jobs[j + 1]):
            k, lo, hi, span, take = seg[s, 0], seg[s, 1], seg[s, 2], seg[s, 3], seg[s, 4]
            w = numba.carray(_f32_at(ptr[k, 0]), numel[k])
            first = lo + (phase * take) % span
            moved = 0.0
            size = 0.0
            if ptr[k, 1] == 0:
                for r in range(first, hi, span):
                    size += _abs_run(w[r:min(r + take, hi)])
            else:
                m = numba.carray(_f32_at(ptr[k, 1]), numel[k])
                v = numba.carray(_f32_at(ptr[k, 2]), numel[k])
                for r in range(first, hi, span):
                    end = min(r + take, hi)
                    a, b = _adam_run(w[r:end], m[r:end], v[r:end], eps_c[k], alpha[k])
                    moved += a
                    size += b
            out[s, 0] = moved
            out[s, 1] = size


_fused_sums_serial = njit(error_model="numpy", cache=True, nogil=True)(_fused_sums.py_func)
"""The same kernel on one thread, without numba's threading layer (fork-safe)."""
