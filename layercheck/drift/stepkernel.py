"""Adam's step with the drift sums in the same pass (numba; optional).

Contract. ``AdamPass(numels).run(ptr, steps, group, hyper, threads)`` does, for
each entry k (one parameter, its gradient and its two moments: contiguous CPU
fp32 tensors of ``numels[k]`` elements at the addresses ``ptr[k] = (w, g, m,
v)``; its step count, a 0-dim CPU fp32 tensor, at ``steps[k]``), what torch's
Adam/AdamW step does to them, and returns per entry

    moved[k] = sum |w(t) - w(t-1)|,   size[k] = sum |w(t)|

of the values it stored: the drift tracker's two sums, taken from the
registers on the way through, so that the weights are read once per step (by
the update) instead of twice (by the update, then by a drift pass that reads
w, m and v again).

The step, per entry: ``step += 1`` (fp32, as ``step_t += 1``), then with
``hyper[group[k]] = (lr, beta1, beta2, eps, weight_decay, decoupled, maximize)``
the bias corrections in float64 from the new count (``1 - beta ** step``, as
torch's Python and its fused kernel compute them), and per element, in fp32
with correctly rounded sqrt and division and fused multiply-adds exactly
where torch's fused CPU kernel (``torch.optim.AdamW(fused=True)``) has them:

    g  = -g (maximize);  g = fma(w, wd, g) (Adam's L2 decay)
    w1 = w * (1 - lr wd) (AdamW's decoupled decay)
    m  = lerp(m, g, 1 - beta1)  as fma(c, g - m, m) or fma(c - 1, g - m, g)
    v  = fma((1 - beta2) g, g, v beta2)
    w  = w1 + (-lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)

On x86-64 with AVX-512 or AVX2 this is torch's fused step bit for bit
(tests/layercheck/test_fusedstep.py compares every parameter and moment). The
default for-loop and foreach paths round a few of the weights one fp32 ulp
apart from both: their ``torch.sqrt`` is vectorised with a 0.5001-ulp
approximation, not the hardware's correctly rounded square root, so about a
fifth of the square roots differ in the last bit (the moments never differ).

The sums: fp32 partial sums over blocks of SUM_BLOCK elements, float64 per
segment, segments summed in a fixed order (``layercheck.drift.kernels``: the same
bounds and the same independence from the number of threads). The update of
an element does not depend on the pieces or the threads at all.

Threads: as ``layercheck.drift.kernels``' pass, the segments of ``FusedPass`` cut
into pieces and run on torch's OpenMP team (``layercheck.drift.parallel``), else
on helper threads, else on the caller's. The step counts and each entry's
fp32 coefficients are computed first, on the calling thread.
"""
from __future__ import annotations

from typing import Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import cfunc, njit, types
from numba.extending import intrinsic

from . import parallel
from .kernels import SUM_BLOCK, FusedPass, _f32_at, _f64_at, _i64_at, _next_ticket

__all__ = ["AdamPass", "HYPER", "COEFFICIENTS", "warm"]

HYPER = 7
"""Columns of ``hyper``: lr, beta1, beta2, eps, weight_decay, decoupled (0/1),
maximize (0/1); float64, one row per parameter group."""
COEFFICIENTS = 10
"""Columns of an entry's fp32 coefficients (``_coefficients``)."""


class AdamPass:
    """The segments of a fixed list of tensor sizes (built once per list, run every
    step). One ``run`` at a time per instance (its buffers are reused)."""

    def __init__(self, numels: Sequence[int]) -> None:
        self.plan = FusedPass([(n, n, n) for n in numels])
        self.entries = len(numels)
        self._coef = np.zeros((self.entries, COEFFICIENTS), dtype=np.float32)
        self._out = np.zeros((len(self.plan.seg), 2))

    def run(self, ptr: np.ndarray, steps: np.ndarray, group: np.ndarray, hyper: np.ndarray,
            threads: int) -> tuple[np.ndarray, np.ndarray]:
        """Step every entry (see the module doc); (moved, size) per entry, float64.
        ``ptr``: (entries, 4) int64; ``steps``: (entries,) int64 addresses;
        ``group``: (entries,) int64 rows of ``hyper`` ((groups, HYPER) float64)."""
        _coefficients(steps, group, hyper, self._coef)
        seg = self.plan.seg
        if len(seg):
            cuts = self.plan.pieces(threads)
            threads = min(threads, len(cuts) - 1)
            team = parallel.team()
            if threads == 1:
                _step_segments(ptr, self._coef, seg, 0, len(seg), self._out)
            elif team is not None:
                ptr = np.ascontiguousarray(ptr)
                call = np.array([ptr.ctypes.data, len(ptr), self._coef.ctypes.data,
                                 seg.ctypes.data, len(seg), cuts.ctypes.data, len(cuts) - 1,
                                 self._out.ctypes.data, 0], dtype=np.int64)
                team.run(_team_step.address, call.ctypes.data, threads)  # the arrays outlive it
            else:
                def piece(i: int) -> None:
                    _step_segments(ptr, self._coef, seg, cuts[i], cuts[i + 1], self._out)
                parallel.crew().run(len(cuts) - 1, piece, helpers=threads - 1)
        k = seg[:, 0]
        return (np.bincount(k, self._out[:, 0], minlength=self.entries),
                np.bincount(k, self._out[:, 1], minlength=self.entries))


def warm() -> None:
    """Compile (or load from numba's cache) the step's kernels now."""
    n = SUM_BLOCK + 3
    w, g = np.ones(n, dtype=np.float32), np.full(n, 0.5, dtype=np.float32)
    m, v = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
    step = np.zeros(1, dtype=np.float32)
    ptr = np.array([[a.ctypes.data for a in (w, g, m, v)]], dtype=np.int64)
    hyper = np.array([[1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, 0.0]])
    AdamPass([n]).run(ptr, np.array([step.ctypes.data], dtype=np.int64),
                      np.zeros(1, dtype=np.int64), hyper, 1)


# -- the kernel ----------------------------------------------------------------------
@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma.f32; vectorises)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32] * 3))
        return builder.call(fn, args)
    return sig, codegen


@njit(cache=True)
def _coefficients(steps, group, hyper, coef):
    """Each entry's step count += 1 (in its tensor) and its fp32 coefficients:
    decay factor, L2 decay, gradient sign, lerp weight and whether it is small,
    beta2, 1 - beta2, sqrt(bc2), eps, -lr / bc1."""
    for k in range(len(steps)):
        count = numba.carray(_f32_at(steps[k]), 1)
        count[0] += np.float32(1.0)
        t = np.float64(count[0])
        lr, beta1, beta2, eps, wd, decoupled, maximize = (
            hyper[group[k], 0], hyper[group[k], 1], hyper[group[k], 2], hyper[group[k], 3],
            hyper[group[k], 4], hyper[group[k], 5], hyper[group[k], 6])
        bc1 = 1.0 - beta1 ** t
        bc2 = 1.0 - beta2 ** t
        weight = np.float32(1.0 - beta1)
        decays = decoupled != 0.0 and wd != 0.0
        coef[k, 0] = np.float32(1.0 - lr * wd) if decays else np.float32(1.0)
        coef[k, 1] = np.float32(wd) if decoupled == 0.0 else np.float32(0.0)
        coef[k, 2] = np.float32(-1.0) if maximize != 0.0 else np.float32(1.0)
        coef[k, 3] = weight
        coef[k, 4] = np.float32(1.0) if abs(weight) < np.float32(0.5) else np.float32(0.0)
        coef[k, 5] = np.float32(beta2)
        coef[k, 6] = np.float32(1.0 - beta2)
        coef[k, 7] = np.float32(np.sqrt(bc2))
        coef[k, 8] = np.float32(eps)
        coef[k, 9] = np.float32(-(lr / bc1))


# No fast-math flags here: every rounding is the one stated in the module doc
# (numba contracts nothing into an fma by itself; _fma says where).
@njit(error_model="numpy", cache=True)
def _element(w, g, m, v, decay, l2, sign, weight, small, beta2, rest2, bc2s, eps, neg_size):
    """(w', m', v', |w' - w|, |w'|) of one element (see the module doc)."""
    g = g * sign
    if l2 != np.float32(0.0):
        g = _fma(w, l2, g)
    w1 = w * decay
    if small != np.float32(0.0):
        m1 = _fma(weight, g - m, m)
    else:
        m1 = _fma(weight - np.float32(1.0), g - m, g)
    v1 = _fma(rest2 * g, g, v * beta2)
    w2 = w1 + neg_size * m1 / (np.sqrt(v1) / bc2s + eps)
    return w2, m1, v1, abs(w2 - w), abs(w2)


# reassoc for the sums only (the fp32 block sums vectorise in lanes; each block's
# sum then joins its run's float64 total); _element is compiled apart and keeps its
# strict flags (as layercheck.drift.kernels' _moved_term). Each block is an array view
# from its own address, indexed from 0 (see layercheck.drift.kernels: the loop then
# vectorises), and one call steps a whole segment, so the coefficients are put
# into vector registers once per segment, not once per block.
@njit(fastmath={"reassoc"}, error_model="numpy", cache=True)
def _step_run(pw, pg, pm, pv, n, decay, l2, sign, weight, small, beta2, rest2, bc2s, eps,
              neg_size):
    """Step the n elements at byte addresses pw, pg, pm, pv: (moved, size), float64."""
    moved_total = 0.0
    size_total = 0.0
    for b in range(0, n, SUM_BLOCK):
        count = min(SUM_BLOCK, n - b)
        at = 4 * b
        w = numba.carray(_f32_at(pw + at), count)
        g = numba.carray(_f32_at(pg + at), count)
        m = numba.carray(_f32_at(pm + at), count)
        v = numba.carray(_f32_at(pv + at), count)
        moved = np.float32(0.0)
        size = np.float32(0.0)
        for i in range(count):
            w2, m1, v1, d, a = _element(w[i], g[i], m[i], v[i], decay, l2, sign, weight, small,
                                        beta2, rest2, bc2s, eps, neg_size)
            w[i] = w2
            m[i] = m1
            v[i] = v1
            moved += d
            size += a
        moved_total += moved
        size_total += size
    return moved_total, size_total


@njit(error_model="numpy", cache=True, nogil=True)
def _step_segments(ptr, coef, seg, first, last, out):
    """Step segments first..last-1 and put each one's (moved, size) in ``out``."""
    for s in range(first, last):
        k, lo, hi = seg[s, 0], seg[s, 1], seg[s, 2]
        c = coef[k]
        at = 4 * lo
        out[s, 0], out[s, 1] = _step_run(ptr[k, 0] + at, ptr[k, 1] + at, ptr[k, 2] + at,
                                         ptr[k, 3] + at, hi - lo, c[0], c[1], c[2], c[3], c[4],
                                         c[5], c[6], c[7], c[8], c[9])


# The parallel region's body on each thread of torch's team (a C callback, as
# layercheck.drift.kernels' _team_work): pieces by atomic ticket.
@cfunc(types.void(types.int64), nopython=True, error_model="numpy", cache=True)
def _team_step(data):
    call = numba.carray(_i64_at(data), 9)
    entries, segments, pieces = call[1], call[4], call[6]
    ptr = numba.carray(_i64_at(call[0]), (entries, 4))
    coef = numba.carray(_f32_at(call[2]), (entries, COEFFICIENTS))
    seg = numba.carray(_i64_at(call[3]), (segments, 5))
    cuts = numba.carray(_i64_at(call[5]), pieces + 1)
    out = numba.carray(_f64_at(call[7]), (segments, 2))
    while True:
        i = _next_ticket(data + 8 * 8)
        if i >= pieces:
            return
        _step_segments(ptr, coef, seg, cuts[i], cuts[i + 1], out)
