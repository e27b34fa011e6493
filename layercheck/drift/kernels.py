"""Drift sums in one streaming pass over w, exp_avg and exp_avg_sq (numba; optional).

Contract. ``FusedPass(extents).run(ptr, eps_c, alpha, phase, threads)`` returns,
for each entry k (one parameter), the two sums that ``DriftTracker`` needs:

    moved[k] = sum |m / (sqrt(v + TINY) + eps_c[k]) + alpha[k] * w|
    size[k]  = sum |w|

over the entry's measured elements, reading each of w, m and v once. The
element arithmetic is strict IEEE fp32 (+TINY, sqrt, +eps_c, m divided by it,
+alpha w; no fast-math). The foreach path takes the reciprocal and then
multiplies by m, two roundings where the division has one, so an element's
value is the foreach path's up to one rounding (about a quarter of MiniLM's
elements differ by one fp32 ulp; the sums agree to rtol 1e-5, test_drift).
Only the summation order is free: fp32 partial sums
over consecutive blocks of at most SUM_BLOCK elements (relative error <=
(SUM_BLOCK-1) u = 3.8e-6 in any order, all terms being >= 0), accumulated in
float64 per segment, and segments summed in a fixed order: the result does
not depend on the number of threads.

Inputs (the caller checks them; nothing here can):
``ptr[k] = (w, m, v)`` addresses of contiguous CPU fp32 tensors of
``extents[k].numel`` elements, alive for the call; ``m = v = 0`` for an entry
that was not updated this step (only ``size`` is computed, ``moved`` is 0).
An extent ``(numel, span, take)`` with ``take < span`` is sampled: of the first
``numel // span * span`` elements, each run of ``span`` contributes ``take``
consecutive elements starting at ``(phase * take) % span`` (a block that
rotates with ``phase``); ``take == span`` measures every element.

Streaming. The pass walks each tensor from start to end in blocks of
SUM_BLOCK elements addressed from the tensor's base (no slices, no per-run
array objects), and each block's loop vectorises: on a 2-core Xeon its
arithmetic (one sqrt and one division per element) runs at about 1.1 cycles
per element, under the time the memory takes to deliver the three tensors,
so the pass costs about one plain read of them.

Threads. A pass of several pieces runs on ``threads`` threads, the caller's
included (``layercheck.drift.parallel``): torch's own OpenMP team as one parallel
region (the body ``_team_work``, a numba C callback), or where torch's runtime
is not loaded, or in a process forked after that module was imported, on up
to ``threads - 1`` helper threads. Pieces are handed out by an atomic ticket
(a shared counter for the helpers), so a thread that starts late takes
fewer. Numba's own parallel layers are not used: their threads are a third
pool on the same cores; the GNU OpenMP layer aborts any process forked after
it ran ("fork() called from a process already using GNU OpenMP"); and a
serial twin compiled from the same function with ``cache=True`` shares the
parallel kernel's cache entry (numba's cache index does not key on
``parallel``). Here there is one
compiled kernel, run by whichever threads; the sums do not depend on which.

Zero-copy: the kernel views the tensors' memory through their addresses (one
call for the whole model, or for a piece of it). This module needs numba;
``layercheck.drift`` imports it on first use and keeps its torch path where
the import fails.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import cfunc, njit, types
from numba.extending import intrinsic

from . import parallel

__all__ = ["CHUNK", "SUM_BLOCK", "TINY", "PER_THREAD", "PREFETCH_RUNS", "Extent", "FusedPass",
           "warm"]

CHUNK = 1 << 16
"""Elements of address range per segment: the unit whose sums are kept apart
(768 KiB of w, m and v when exact)."""
SUM_BLOCK = 64
"""Elements per fp32 partial sum (bounds its relative error by 63 u)."""
TINY = np.float32(1e-30)
"""Added to v before sqrt, as the torch path does (see drift._TINY): no result changes."""
PER_THREAD = 1 << 18
"""Elements a thread must have to read before a pass takes it on: below
that, waking a helper costs more than it saves (a small model's pass stays
on the calling thread)."""
PREFETCH_RUNS = 8
"""Sampled runs requested from memory ahead of the one being summed. A sampled
block is 256 bytes of each 4 KiB page, and the hardware prefetchers stop at
page boundaries: without asking ahead, the pass would wait for memory at
every block (on MiniLM, one thread, asking ahead made the sampled pass about
1.4x faster; asking 32 or 64 runs ahead instead of 8 gained nothing once the
caches were cold, as they are after an optimizer step)."""
_LINE = 64
"""Bytes per cache line."""
_PIECES_PER_THREAD = 4
"""Pieces per thread a pass is cut into, so that a late or preempted thread
leaves work for the others instead of making them wait at the end."""


class Extent(NamedTuple):
    numel: int
    span: int
    take: int


class FusedPass:
    """The segments of a fixed list of extents (built once, run every step).

    One ``run`` at a time per instance (its result buffer is reused); two
    instances may run at once from two threads."""

    def __init__(self, extents: Sequence[tuple[int, int, int]]) -> None:
        extents = [Extent(*e) for e in extents]
        segments = [s for k, e in enumerate(extents) for s in _segments(k, e)]
        self.entries = len(extents)
        self.seg = np.array(segments, dtype=np.int64).reshape(-1, 5)
        read = (self.seg[:, 2] - self.seg[:, 1]) * self.seg[:, 4] // np.maximum(self.seg[:, 3], 1)
        self._cost = np.cumsum(read + SUM_BLOCK)  # a segment's fixed cost counts a little
        self._cuts: dict[int, np.ndarray] = {}
        self._out = np.zeros((len(self.seg), 2))

    def run(self, ptr: np.ndarray, eps_c: np.ndarray, alpha: np.ndarray,
            phase: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
        """(moved, size) per entry, float64; see the module doc. ``threads``: at
        most this many threads, the caller's included (the caller passes
        torch's own count, so the pass never uses more cores than training)."""
        if len(self.seg):
            cuts = self.pieces(threads)
            threads = min(threads, len(cuts) - 1)
            team = parallel.team()
            if threads == 1:
                _sums(ptr, eps_c, alpha, self.seg, 0, len(self.seg), phase, self._out)
            elif team is not None:
                ptr, eps_c, alpha = (np.ascontiguousarray(a) for a in (ptr, eps_c, alpha))
                call = np.array([ptr.ctypes.data, len(ptr), eps_c.ctypes.data, alpha.ctypes.data,
                                 self.seg.ctypes.data, len(self.seg), cuts.ctypes.data,
                                 len(cuts) - 1, phase, self._out.ctypes.data, 0], dtype=np.int64)
                # _team_work's argument block; the arrays outlive the call
                team.run(_team_work.address, call.ctypes.data, threads)
            else:
                def piece(i: int) -> None:
                    _sums(ptr, eps_c, alpha, self.seg, cuts[i], cuts[i + 1], phase, self._out)
                parallel.crew().run(len(cuts) - 1, piece, helpers=threads - 1)
        k = self.seg[:, 0]
        return (np.bincount(k, self._out[:, 0], minlength=self.entries),
                np.bincount(k, self._out[:, 1], minlength=self.entries))

    def pieces(self, threads: int) -> np.ndarray:
        """Segment indices that cut the pass into pieces of about equal cost, for
        ``threads`` threads (fewer where the pass is too small to share; see
        PER_THREAD): piece i is segments ``cuts[i]`` to ``cuts[i + 1] - 1``."""
        total = int(self._cost[-1]) if len(self._cost) else 0
        threads = max(1, min(threads, total // PER_THREAD))
        cuts = self._cuts.get(threads)
        if cuts is None:
            pieces = 1 if threads == 1 else threads * _PIECES_PER_THREAD
            inner = np.searchsorted(self._cost, total * np.arange(1, pieces) / pieces, side="right")
            cuts = self._cuts[threads] = np.unique(np.concatenate(
                [[0], inner, [len(self.seg)]])).astype(np.int64)
        return cuts


def warm() -> None:
    """Compile (or load from the cache) the kernel now, e.g. before forking
    workers, so that no process pays the JIT inside a training step."""
    w = np.ones(SUM_BLOCK, dtype=np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    ptr = np.array([[w.ctypes.data, m.ctypes.data, v.ctypes.data]], dtype=np.int64)
    FusedPass([Extent(w.size, w.size, w.size)]).run(
        ptr, np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32), 0, 1)


def _segments(k: int, e: Extent) -> list[tuple[int, int, int, int, int]]:
    """(entry, lo, hi, span, take) pieces of about CHUNK elements of address range."""
    if e.take >= e.span:
        return [(k, lo, min(lo + CHUNK, e.numel), min(CHUNK, e.numel - lo), min(CHUNK, e.numel - lo))
                for lo in range(0, e.numel, CHUNK)]
    stop = e.numel // e.span * e.span
    step = max(1, CHUNK // e.span) * e.span
    return [(k, lo, min(lo + step, stop), e.span, e.take) for lo in range(0, stop, step)]


# -- the kernel ----------------------------------------------------------------------
def _pointer_at(dtype: types.Type):
    """An intrinsic: the pointer to ``dtype`` at an integer address (a zero-copy view's base)."""
    @intrinsic
    def at(typingctx, address):
        sig = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
        return sig, codegen
    return at


_f32_at = _pointer_at(types.float32)
_f64_at = _pointer_at(types.float64)
_i64_at = _pointer_at(types.int64)


@intrinsic
def _prefetch(typingctx, address):
    """Ask for the cache line at an integer address (a hint: never faults)."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [byte_ptr], ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
        # read, keep in all cache levels, data cache
        builder.call(fn, [builder.inttoptr(args[0], byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True)
def _prefetch_run(pw, pm, pv, nbytes):
    for b in range(0, nbytes, _LINE):
        _prefetch(pw + b)
        if pm:
            _prefetch(pm + b)
            _prefetch(pv + b)


# error_model="numpy": IEEE division (no Python zero-check branch, which
# would keep the loops scalar). No fast-math for the element arithmetic.
@njit(error_model="numpy", cache=True)
def _moved_term(w, m, v, eps_c, alpha):
    return abs((np.float32(1.0) / (np.sqrt(v + TINY) + eps_c)) * m + alpha * w)


# reassoc lets LLVM vectorise the fp32 block sums (in lanes); it applies to
# these additions only: _moved_term is compiled, and keeps its flags, apart.
# Each block is a fresh array view from its own address, indexed from 0: LLVM
# can then prove the indices non-negative and drops the wrap-around checks
# that would keep the loop scalar.
@njit(fastmath={"reassoc"}, error_model="numpy", cache=True)
def _adam_block(pw, pm, pv, n, eps_c, alpha):
    w = numba.carray(_f32_at(pw), n)
    m = numba.carray(_f32_at(pm), n)
    v = numba.carray(_f32_at(pv), n)
    moved = np.float32(0.0)
    size = np.float32(0.0)
    for i in range(n):
        moved += _moved_term(w[i], m[i], v[i], eps_c, alpha)
        size += abs(w[i])
    return moved, size


@njit(fastmath={"reassoc"}, error_model="numpy", cache=True)
def _abs_block(pw, n):
    w = numba.carray(_f32_at(pw), n)
    size = np.float32(0.0)
    for i in range(n):
        size += abs(w[i])
    return size


@njit(error_model="numpy", cache=True)
def _run_sums(pw, pm, pv, n, eps_c, alpha):
    """float64 sums over the n elements at byte addresses pw, pm, pv (pm = 0: |w| only)."""
    moved = 0.0
    size = 0.0
    if pm == 0:
        for b in range(0, n, SUM_BLOCK):
            size += _abs_block(pw + 4 * b, min(SUM_BLOCK, n - b))
        return moved, size
    for b in range(0, n, SUM_BLOCK):
        a, c = _adam_block(pw + 4 * b, pm + 4 * b, pv + 4 * b, min(SUM_BLOCK, n - b), eps_c, alpha)
        moved += a
        size += c
    return moved, size


@njit(error_model="numpy", cache=True, nogil=True)
def _sums(ptr, eps_c, alpha, seg, first, last, phase, out):
    """out[s] = (moved, size) of segments first..last-1 (see the module doc)."""
    for s in range(first, last):
        k, lo, hi, span, take = seg[s, 0], seg[s, 1], seg[s, 2], seg[s, 3], seg[s, 4]
        pw, pm, pv = ptr[k, 0], ptr[k, 1], ptr[k, 2]
        moved = 0.0
        size = 0.0
        first = lo + (phase * take) % span
        ahead = PREFETCH_RUNS * span if take < span else 0  # exact runs stream by themselves
        for r in range(first, min(first + ahead, hi), span):
            _prefetch_run(pw + 4 * r, pm + 4 * r if pm else 0, pv + 4 * r, 4 * take)
        for r in range(first, hi, span):
            if r + ahead < hi and ahead:
                q = r + ahead
                _prefetch_run(pw + 4 * q, pm + 4 * q if pm else 0, pv + 4 * q, 4 * take)
            a, c = _run_sums(pw + 4 * r, pm + 4 * r if pm else 0, pv + 4 * r,
                             min(take, hi - r), eps_c[k], alpha[k])
            moved += a
            size += c
        out[s, 0] = moved
        out[s, 1] = size


@intrinsic
def _next_ticket(typingctx, address):
    """Atomically add 1 to the int64 at an integer address; its value before."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        counter = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", counter, ir.Constant(ir.IntType(64), 1), "monotonic")
    return sig, codegen


# The body of the team's parallel region, on each of its threads (a C callback:
# void fn(void *data), data being the addresses that FusedPass.run packs). Pieces
# are handed out by an atomic ticket, so a thread that starts late takes fewer;
# the region's closing barrier orders the results before GOMP_parallel returns.
@cfunc(types.void(types.int64), nopython=True, error_model="numpy", cache=True)
def _team_work(data):
    call = numba.carray(_i64_at(data), 11)
    entries, segments, pieces = call[1], call[5], call[7]
    ptr = numba.carray(_i64_at(call[0]), (entries, 3))
    eps_c = numba.carray(_f32_at(call[2]), entries)
    alpha = numba.carray(_f32_at(call[3]), entries)
    seg = numba.carray(_i64_at(call[4]), (segments, 5))
    cuts = numba.carray(_i64_at(call[6]), pieces + 1)
    out = numba.carray(_f64_at(call[9]), (segments, 2))
    while True:
        i = _next_ticket(data + 8 * 10)
        if i >= pieces:
            return
        _sums(ptr, eps_c, alpha, seg, cuts[i], cuts[i + 1], call[8], out)
