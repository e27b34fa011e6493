"""How many steps a run is behind another, read off held-out loss curves.

Pure numpy (no torch): the staleness study (``profiler.stalecost``) measures
the curves, this module reads them.

The yardstick is the failure-free run's held-out loss L_ref(s), evaluated
every few steps. It is made non-increasing first (``decreasing_fit``, the
least-squares isotonic fit: a noisy bump must not make one loss value map to
two steps). A run whose loss at step u is g above the reference's there
(g = L_run(u) - L_ref(u), a paired difference on the same sequences) is
**Delta = u - s*** steps behind, where s* is the step nearest u at which the
fitted reference equals fit(u) + g (linear between evaluated steps): the
reference took Delta more steps to get where the run is. Delta < 0: the run
is ahead; a run equal to the reference reads exactly 0. When no evaluated
step of the reference reaches that loss the reading is **censored**: the run
is at least ``last - u`` steps ahead (Delta <= u - last), or at least ``u -
first`` steps behind.

The same reading works on any clock that grows with the steps: ``clock[s]``
the clock at step s (``read_delta(..., clock=...)``). The staleness study
reads on two: the steps themselves, and learning-rate-weighted steps (the
sum of lr / lr_peak over the optimizer steps taken), on which a step late in
a decayed schedule counts as little as it moves the weights.

The evaluation's own noise: held-out sequences are resampled with
replacement (the same resample for both runs: the comparison is paired; and
the same resamples for every run of a study, ``resample_weights``), both
curves recomputed, the reference fitted again and Delta read again. A
reading keeps its resampled values (``Reading.draws``); its ``low`` and
``high`` are their 2.5% and 97.5% quantiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["decreasing_fit", "steps_behind", "Reading", "SequenceLosses", "read_delta",
           "resample_weights"]


def decreasing_fit(y: np.ndarray) -> np.ndarray:
    """The non-increasing sequence nearest ``y`` in least squares (pool adjacent
    violators)."""
    y = np.asarray(y, dtype=np.float64)
    values: list[float] = []
    counts: list[int] = []
    for v in y:
        values.append(float(v))
        counts.append(1)
        while len(values) > 1 and values[-2] < values[-1]:  # a rise: pool the two blocks
            n = counts[-2] + counts[-1]
            values[-2] = (values[-2] * counts[-2] + values[-1] * counts[-1]) / n
            counts[-2] = n
            values.pop()
            counts.pop()
    return np.repeat(values, counts)


def steps_behind(ref_steps: np.ndarray, ref_loss: np.ndarray, step: int,
                 gap: float, *, clock: np.ndarray | None = None) -> tuple[float, str | None]:
    """(Delta, censoring) of a run whose loss at ``step`` (an evaluated step of the
    reference) is ``gap`` above the reference's there. The gap is laid on the
    fitted reference at ``step`` and read off it towards the earlier steps (gap >
    0) or the later ones (gap < 0), so that a run equal to the reference reads 0.
    Censoring is None, ``"ahead"`` (Delta is an upper bound: no evaluated step of
    the reference reaches the loss) or ``"behind"`` (a lower bound). ``clock``
    (increasing, indexed by step): Delta in its units, linear between evaluated
    steps on it; None: in steps."""
    hits = np.flatnonzero(np.asarray(ref_steps) == step)
    if not hits.size:
        raise KeyError(f"the reference has no evaluation at step {step}")
    u = int(hits[0])
    steps = np.asarray(ref_steps if clock is None else np.asarray(clock)[np.asarray(ref_steps)],
                       dtype=np.float64)
    step = steps[u]
    fit = decreasing_fit(ref_loss)
    if gap == 0:
        return 0.0, None
    target = fit[u] + gap
    if gap > 0:  # behind: the last earlier step still at or above the target
        above = np.flatnonzero(fit[:u] >= target)
        if not above.size:
            return float(step - steps[0]), "behind"
        i = int(above[-1])
        s = steps[i] + (fit[i] - target) / (fit[i] - fit[i + 1]) * (steps[i + 1] - steps[i])
        return float(step - s), None
    below = np.flatnonzero(fit[u + 1:] <= target)  # ahead: the first later step at or below
    if not below.size:
        return float(step - steps[-1]), "ahead"
    i = u + 1 + int(below[0])
    s = steps[i - 1] + (fit[i - 1] - target) / (fit[i - 1] - fit[i]) * (steps[i] - steps[i - 1])
    return float(step - s), None


@dataclass(frozen=True)
class SequenceLosses:
    """A run's held-out losses per evaluation and sequence: ``loss[e, q]`` the
    summed token loss of sequence q at evaluation e, ``tokens[q]`` its predicted
    tokens (the same at every evaluation: the held-out masks are fixed), at
    ``steps[e]``."""

    steps: np.ndarray
    loss: np.ndarray
    tokens: np.ndarray

    def __post_init__(self) -> None:
        if self.loss.shape != (len(self.steps), len(self.tokens)):
            raise ValueError(f"loss has shape {self.loss.shape}; expected "
                             f"({len(self.steps)} evaluations, {len(self.tokens)} sequences)")

    def curve(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Mean loss per predicted token at each evaluation (``weights``: how many
        times each sequence is counted, for a resample; a (resamples, sequences)
        matrix gives (evaluations, resamples))."""
        w = np.ones(len(self.tokens)) if weights is None else weights
        return (self.loss @ w.T) / (w @ self.tokens)

    def at(self, step: int) -> int:
        """The index of the evaluation at ``step``."""
        hits = np.flatnonzero(self.steps == step)
        if not hits.size:
            raise KeyError(f"no evaluation at step {step}")
        return int(hits[0])

    def joined(self, later: "SequenceLosses", after: int) -> "SequenceLosses":
        """These evaluations up to step ``after``, then ``later``'s past it: the
        failure-free run whose data after ``after`` is ``later``'s."""
        if not np.array_equal(self.tokens, later.tokens):
            raise ValueError("the runs were evaluated on different held-out sequences")
        mine, theirs = self.steps <= after, later.steps > after
        return SequenceLosses(np.concatenate([self.steps[mine], later.steps[theirs]]),
                              np.concatenate([self.loss[mine], later.loss[theirs]]), self.tokens)

    def rounded(self, decimals: int = 6) -> "SequenceLosses":
        """The losses to ``decimals`` places (what a study document stores)."""
        return SequenceLosses(self.steps, np.round(self.loss, decimals), self.tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps.tolist(), "loss": self.loss.tolist(),
                "tokens": self.tokens.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequenceLosses":
        return cls(np.asarray(data["steps"], dtype=np.int64),
                   np.asarray(data["loss"], dtype=np.float64).reshape(len(data["steps"]), -1),
                   np.asarray(data["tokens"], dtype=np.float64))


def resample_weights(sequences: int, resamples: int, seed: int = 0) -> np.ndarray:
    """(resamples, sequences): how many times each held-out sequence is drawn in each
    bootstrap resample (with replacement), from a generator seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    out = np.zeros((resamples, sequences))
    for b in range(resamples):
        out[b] = np.bincount(rng.integers(0, sequences, sequences), minlength=sequences)
    return out


@dataclass(frozen=True)
class Reading:
    """Delta at one step, with its bootstrap interval and censoring."""

    step: int
    delta: float
    low: float
    high: float
    censored: str | None
    gap: float
    """The run's loss minus the reference's at ``step`` (both measured there)."""
    draws: np.ndarray = field(default_factory=lambda: np.empty(0), compare=False, repr=False)
    """Delta on each resample of the held-out sequences (not stored: read again)."""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "delta": self.delta, "low": self.low, "high": self.high,
                "censored": self.censored, "loss_gap": self.gap}


def read_delta(reference: SequenceLosses, run: SequenceLosses, step: int, *,
               resamples: int = 1000, seed: int = 0, weights: np.ndarray | None = None,
               clock: np.ndarray | None = None) -> Reading:
    """Delta of ``run`` at ``step`` against ``reference`` (both evaluated on the
    same held-out sequences, ``reference`` at every step of its curve up to the
    end), with the paired bootstrap interval (module doc): over ``weights``
    (``resample_weights``), else ``resamples`` drawn from ``seed``. ``clock``: read
    on it (``steps_behind``)."""
    if not np.array_equal(reference.tokens, run.tokens):
        raise ValueError("the runs were evaluated on different held-out sequences")
    e, r = run.at(step), reference.at(step)
    ref_curve = reference.curve()
    gap = float(run.curve()[e] - ref_curve[r])
    delta, censored = steps_behind(reference.steps, ref_curve, step, gap, clock=clock)
    if weights is None:
        weights = resample_weights(len(reference.tokens), resamples, seed)
    ref_w, run_w = reference.curve(weights), run.curve(weights)
    draws = np.array([steps_behind(reference.steps, ref_w[:, b], step,
                                   float(run_w[e, b] - ref_w[r, b]), clock=clock)[0]
                      for b in range(len(weights))])
    low, high = np.quantile(draws, [0.025, 0.975]) if draws.size else (delta, delta)
    return Reading(step, delta, float(min(low, delta)), float(max(high, delta)), censored, gap,
                   draws)
