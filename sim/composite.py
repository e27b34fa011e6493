"""LayerCheck's composite recovery point: which copy of each layer a recovery loads, and what its stale layers discard.

A recovery at position c loads, per layer, the newest copy written at or before
c. Which copies those are depends on when the run last resumed (at j): from a
job's start (j = 0) the run writes as the trace recorded (``last``); after a
restore of j > 0 the library's policy starts again there (every layer counted
as written at j, every accumulator at 0: ``layercheck.contract.resumed``), so
its writes follow ``restarted`` from j, not the uninterrupted run's. A layer
not rewritten since j still holds the copy it was restored from, which equalled
it at j: its updates since j are what a recovery discards.

    composite.since(c, j)            # per layer: the step after which updates are lost
    composite.stale_s(work, c, j)    # the compute they discard, parameter-weighted

The engines (``sim.engine``, the compiled ``sim.kernel``, the SimPy reference
through ``Schedule.stale_s``) and the first-order form all ask this module, the
compiled loop by the same walk written out.

What the discarded updates cost is the stale cost factor phi (the ``stale_cost``
figure): measured on one job (``python -m profiler staleness``) for the composite
and for its parts, it is carried to another job by that job's composition
(``embedding_share``, ``transfer_stale_cost``): the embedding's layers and the rest
(blocks, head, norms) are stale at different rates and cost differently.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from layercheck.contract.figure import STALE_COST_CAPTURE, STALE_COST_PARTS, Figure

__all__ = ["Composite", "UNKNOWN", "embedding_share", "transfer_stale_cost"]

UNKNOWN = -1
"""A ``restarted`` entry where the resumed run's writes are not known: it is taken
to write as the uninterrupted one (``last``)."""


@dataclass(frozen=True)
class Composite:
    """One job's tables (or several jobs' stacked, positions shifted by ``off``)."""

    last: np.ndarray
    """positions x layers: the newest step <= the position that wrote each layer in the
    uninterrupted run (row 0: zeros)."""
    lifts: np.ndarray
    """levels x positions x layers: ``lifts[0]`` the step a layer reset at step s is next
    written at (past the job: its steps + 1), ``lifts[k]`` that followed 2^k times (a
    walk from j to c takes one look per level); ``UNKNOWN`` rows follow ``last``."""
    weights: np.ndarray
    """Each layer's share of the parameters."""

    @classmethod
    def of(cls, last: np.ndarray, restarted: np.ndarray | None, weights: np.ndarray) -> "Composite":
        """A job's, from ``LayerWrites``' ``last`` and ``restarted`` (None: not known, a
        workload without drift)."""
        last = np.asarray(last, dtype=np.int64)
        steps = last.shape[0] - 1
        if restarted is None:
            return cls(last, _unknown(last.shape), np.asarray(weights, dtype=np.float64))
        lifts = [np.asarray(restarted, dtype=np.int64)]
        layer = np.arange(last.shape[1])
        while (1 << len(lifts)) <= steps:  # 2^levels > steps: any walk fits
            step = lifts[-1]
            lifts.append(np.where(step <= steps, step[np.minimum(step, steps), layer], step))
        return cls(last, np.stack(lifts), np.asarray(weights, dtype=np.float64))

    @classmethod
    def consistent(cls, steps: int, layers: int, weights: np.ndarray) -> "Composite":
        """A consistent recovery point's: every layer from c, nothing stale."""
        return cls.of(np.repeat(np.arange(steps + 1)[:, None], layers, axis=1), None, weights)

    @property
    def restarted(self) -> np.ndarray:
        return self.lifts[0]

    @staticmethod
    def stack(parts: list["Composite"]) -> "Composite":
        """Jobs one after the other (an engine's stacked timelines), positions local."""
        levels = max(p.lifts.shape[0] for p in parts)

        def padded(p: "Composite") -> np.ndarray:
            if p.lifts.shape[0] == levels:
                return p.lifts
            # beyond a job's own levels every walk has left the job (or is unknown)
            top = np.where(p.lifts[-1] == UNKNOWN, UNKNOWN, p.last.shape[0])
            return np.concatenate([p.lifts] + [top[None]] * (levels - p.lifts.shape[0]))
        return Composite(np.concatenate([p.last for p in parts]),
                         np.concatenate([padded(p) for p in parts], axis=1), parts[0].weights)

    @staticmethod
    def stack_tables(parts: list["Composite"]) -> tuple[np.ndarray, np.ndarray]:
        """``stack(parts)``'s ``last`` and ``restarted`` alone (what the compiled walk reads),
        without stacking the other levels of ``lifts``."""
        return (np.concatenate([p.last for p in parts]),
                np.concatenate([p.lifts[0] for p in parts]))

    def since(self, c: np.ndarray, j: np.ndarray, off: np.ndarray | int = 0) -> np.ndarray:
        """c.shape + (layers,): per layer, the step after which a recovery at c discards
        its updates when the run last resumed at j (c and j broadcast; ``off``: the
        job's first row). From a job's start, its copy's step; after a restore of j,
        the newest write of the resumed run at or before c, or j itself."""
        c, j, off = np.broadcast_arrays(np.asarray(c, dtype=np.int64),
                                        np.asarray(j, dtype=np.int64),
                                        np.asarray(off, dtype=np.int64))
        low = np.minimum(j, c)[..., None]
        layer = np.arange(self.weights.size)
        rows = off[..., None]
        static = np.maximum(self.last[rows + c[..., None], layer], low)
        walk = (low > 0) & (self.restarted[rows + low, layer] != UNKNOWN)
        if not walk.any():
            return static
        at = np.broadcast_to(low, static.shape).copy()
        cap = c[..., None]
        for lift in self.lifts[::-1]:  # the largest step of the walk at or before c
            nxt = lift[rows + at, layer]
            at = np.where(walk & (nxt <= cap), nxt, at)
        return np.where(walk, at, static)

    def stale_s(self, work: np.ndarray, c: np.ndarray, j: np.ndarray,
                off: np.ndarray | int = 0) -> np.ndarray:
        """c.shape: the compute whose updates the stale layers discard (``work``: the
        cumulative compute by position, stacked as the tables), summed layer by layer
        in order, as the compiled loop sums (a BLAS dot's order depends on the build)."""
        c, j, off = np.broadcast_arrays(np.asarray(c, dtype=np.int64),
                                        np.asarray(j, dtype=np.int64),
                                        np.asarray(off, dtype=np.int64))
        since = self.since(c, j, off)
        gone = work[(off + c)[..., None]] - work[off[..., None] + since]
        return np.cumsum(gone * self.weights, axis=-1)[..., -1]


@lru_cache(maxsize=8)
def _unknown(shape: tuple[int, int]) -> np.ndarray:
    """A ``restarted`` table of a job whose resumed writes are not known: every entry
    ``UNKNOWN``, one read-only array per shape (a search builds hundreds of such jobs)."""
    table = np.full((1, *shape), UNKNOWN, dtype=np.int64)
    table.setflags(write=False)
    return table


def embedding_share(written: np.ndarray, params: np.ndarray, embedding: np.ndarray) -> float:
    """The embedding layers' share of the parameter-weighted staleness of a run: S(t)
    (``layercheck.contract.trace.weighted_staleness``) split by layer and summed over
    the steps from the base checkpoint on (every layer written once). ``written``: steps
    x layers, ``params`` and ``embedding`` (bool) per layer. 0 for a run that is never
    stale."""
    from layercheck.contract.trace import last_written   # pandas and pyarrow: only here
    last = last_written(written)
    steps = np.arange(1, last.shape[0] + 1)
    based = (last > 0).all(axis=1)
    age = (steps[based, None] - last[based]) * np.asarray(params, dtype=np.float64)
    total = age.sum()
    return float(age[:, np.asarray(embedding, dtype=bool)].sum() / total) if total > 0 else 0.0


def transfer_stale_cost(share: float, target: str) -> Figure:
    """The stale cost factor of a job whose embedding makes ``share`` of its staleness
    (``embedding_share``), carried from the measured parts (``STALE_COST_PARTS``):
    phi = share x phi_embedding + (1 - share) x phi_blocks, its interval the same
    mixture of the parts' bounds (as wide as theirs: the parts' errors may go
    together). ``target`` names the job in the figure's method."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share {share!r}: the embedding's share of the staleness is a "
                         "fraction in [0, 1]")
    blocks, embedding = STALE_COST_PARTS["blocks"], STALE_COST_PARTS["embedding"]

    def mix(a: float, b: float) -> float:
        return (1 - share) * a + share * b
    (b_low, b_high), (e_low, e_high) = blocks.interval, embedding.interval
    method = (f"carried over from {STALE_COST_CAPTURE} by composition: on {target} the "
              f"embedding makes {share:.1%} of the parameter-weighted staleness and the other "
              f"layers (blocks, head, norms) {1 - share:.1%}, so phi = {1 - share:.3f} x "
              f"{blocks.value:.3f} (the composite with only its non-embedding layers stale) + "
              f"{share:.3f} x {embedding.value:.3f} (only its embedding stale), the interval the "
              f"same mixture of theirs. The parts as measured: blocks: {blocks.method}; "
              f"embedding: {embedding.method}")
    return Figure(value=mix(blocks.value, embedding.value), low=mix(b_low, e_low),
                  high=mix(b_high, e_high), source="transferred", method=method)
