"""Many policies over one run at once: the replay the tuner and the budget mode use.

``replay_many(policies, drift, lr_ratio)`` decides a whole run under every
policy of a list (a grid of thresholds, Smax values, intervals, write budgets)
exactly as ``layercheck.contract.policy.replay`` decides it under each one
(``tests/layercheck/contract/test_lanes.py``).

A *lane* is one layer under one setting. Without a write budget a layer's
decisions depend only on its own drift and its own threshold, Smax, interval
and base step, so lanes that agree on those are one lane: a grid of 400
settings over 31 layers of which only the embedding has its own threshold
needs ~3,000 lanes, not 12,400. A write budget couples the layers of a setting
(their writes share one account), so each budgeted setting keeps its own
lanes and its own account (a *group*).

The lanes advance together, one step of the run per loop turn, each turn a
dozen numpy operations over all lanes: the same additions, comparisons and
resets as the reference, in the same order, so the answer is exact for any
input (NaN, inf, negative drift too) and the interpreter's work grows with the
run's length, not with the number of settings. For one setting without a
budget ``layercheck.contract.fastreplay`` is faster still (it does not walk the steps);
with a budget the walk is the method itself, since the threshold at t depends
on what was written before t.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import budget
from .replayed import NO_WRITE, Replayed, run_arrays
from .policy import Policy, Reason

__all__ = ["Lanes", "LaneTable", "replay_many"]


@dataclass(frozen=True, kw_only=True)
class Lanes:
    """The decisions of a run under each of several policies.

    ``reasons[t-1, u]``: ``NO_WRITE`` or the ``Reason`` of lane u's write at
    step t; ``lane_of[s, l]``: the lane of layer l under policy s;
    ``k_scale[t-1, s]``: the write budget's factor on policy s's thresholds at
    step t (1 without a budget)."""

    reasons: np.ndarray
    lane_of: np.ndarray
    k_scale: np.ndarray
    base_steps: np.ndarray
    """Per policy: the step of its base checkpoint (a step past the run: none)."""

    @property
    def writes(self) -> np.ndarray:
        """Boolean steps x lanes."""
        return self.reasons != NO_WRITE

    @property
    def num_policies(self) -> int:
        return len(self.lane_of)

    def replayed(self, s: int) -> Replayed:
        """Policy s's decisions in ``layercheck.contract.fastreplay``'s shape."""
        return Replayed(reasons=np.ascontiguousarray(self.reasons[:, self.lane_of[s]]),
                        method="lanes", k_scale=self.k_scale[:, s].copy())


def replay_many(policies: Sequence[Policy], drift: np.ndarray, lr_ratio: np.ndarray) -> Lanes:
    """Every decision of the run ``drift[t-1, l]``, ``lr_ratio[t-1]`` under each policy."""
    if not policies:
        raise ValueError("replay_many needs at least one policy")
    num_layers = policies[0].num_layers
    if any(p.num_layers != num_layers for p in policies):
        raise ValueError("every policy must have one threshold per layer of the same model")
    drift, lr_ratio = run_arrays(num_layers, drift, lr_ratio)
    for p in policies:
        if p.write_budget is not None and p.sizes is None:
            raise ValueError("a policy with a write budget needs sizes (bytes of one version "
                             "of each layer): Policy.from_config(..., sizes=...)")
    table = LaneTable.build(policies)
    with np.errstate(invalid="ignore"):  # inf * 0 and NaN drift: the reference's NaNs, compared alike
        reasons, k_scale = _walk(table, drift, lr_ratio, len(policies))
    return Lanes(reasons=reasons, lane_of=table.lane_of, k_scale=k_scale,
                 base_steps=np.array([p.base_step for p in policies], dtype=np.int64))


@dataclass(frozen=True)
class LaneTable:
    """One entry per lane: its layer, threshold, Smax, interval, base step, LR
    scaling, and its budget group (``groups`` means none); per group its budget."""

    layer: np.ndarray
    base: np.ndarray
    smax: np.ndarray
    interval: np.ndarray
    base_step: np.ndarray
    scaled: np.ndarray
    group: np.ndarray
    size: np.ndarray
    lane_of: np.ndarray
    group_budget: np.ndarray
    group_base: np.ndarray
    group_interval: np.ndarray
    group_policy: np.ndarray

    @classmethod
    def build(cls, policies: Sequence[Policy]) -> "LaneTable":
        count, n = len(policies), policies[0].num_layers
        budgets = np.array([np.nan if p.write_budget is None else p.write_budget for p in policies])
        budgeted = np.flatnonzero(~np.isnan(budgets))
        per_policy = np.array([(p.smax, p.interval, p.base_step, p.lr_scaling) for p in policies],
                              dtype=np.float64)
        sizes = np.stack([p.sizes if p.sizes is not None else np.zeros(n) for p in policies])
        group = np.full(count, len(budgeted))
        group[budgeted] = np.arange(len(budgeted))
        # Unbudgeted lanes with equal rows decide alike (owner -1); budgeted ones never merge.
        owner = np.where(group < len(budgeted), np.arange(count), -1)
        rows = np.column_stack([
            np.tile(np.arange(n), count), np.stack([p.base for p in policies]).ravel(),
            np.repeat(per_policy, n, axis=0), np.repeat(group, n),
            np.where(np.repeat(owner, n) >= 0, sizes.ravel(), 0.0), np.repeat(owner, n)])
        unique, lane_of = np.unique(rows, axis=0, return_inverse=True)
        return cls(layer=unique[:, 0].astype(np.int64), base=unique[:, 1],
                   smax=unique[:, 2].astype(np.int64), interval=unique[:, 3].astype(np.int64),
                   base_step=unique[:, 4].astype(np.int64), scaled=unique[:, 5].astype(bool),
                   group=unique[:, 6].astype(np.int64), size=unique[:, 7],
                   lane_of=lane_of.reshape(count, n),
                   group_budget=budgets[budgeted],
                   group_base=per_policy[budgeted, 2].astype(np.int64),
                   group_interval=per_policy[budgeted, 1].astype(np.int64),
                   group_policy=budgeted)


def _walk(lt: LaneTable, drift: np.ndarray, lr_ratio: np.ndarray,
          num_policies: int) -> tuple[np.ndarray, np.ndarray]:
    """Advance every lane through steps 1..T (the reference's arithmetic, lane-wise).

    Per step: add the drift, compare with K(t) and the Smax deadline, reset what is
    written. What changes only at a few steps (which lanes have an opportunity,
    which are past their base checkpoint) is looked up, not recomputed."""
    steps, lanes = drift.shape[0], len(lt.layer)
    groups = len(lt.group_budget)
    d = np.ascontiguousarray(drift[:, lt.layer])            # row t-1: every lane's d(t)
    written = np.zeros((steps, lanes), dtype=bool)
    by_threshold = np.zeros((steps, lanes), dtype=bool)
    k_scale = np.ones((steps, num_policies))
    acc = np.zeros(lanes)
    due = lt.smax.copy()                                     # the Smax deadline: last write + smax
    level = np.zeros(groups + 1, dtype=np.int64)             # the last entry: no budget, level 0
    spent = np.zeros(groups)
    unscaled, infinite = ~lt.scaled, np.isinf(lt.base)
    any_unscaled, any_infinite = bool(unscaled.any()), bool(infinite.any())
    started = np.zeros(lanes, dtype=bool)                    # past the base checkpoint
    base_steps = set(lt.base_step.tolist())
    openings = _Openings(lt.interval)
    k = np.empty(lanes)
    for t in range(1, steps + 1):
        acc += d[t - 1]
        ratio = lr_ratio[t - 1]
        np.multiply(lt.base, ratio, out=k)
        if any_unscaled:
            k[unscaled] = lt.base[unscaled]
        if any_infinite and not ratio > 0:
            k[infinite] = np.inf                          # inf * 0 -> nan: an infinite K stays infinite
        if groups:
            scale = budget.scale(level)
            k *= scale[lt.group]
        by_drift = acc >= k
        write = (by_drift | (due <= t)) & openings.at(t) & started
        at_base = None
        if t in base_steps:
            at_base = lt.base_step == t
            write |= at_base
            started |= at_base
        written[t - 1] = write
        by_threshold[t - 1] = by_drift
        acc[write] = 0.0
        due[write] = t + lt.smax[write]
        if groups:
            _settle(lt, t, write, at_base, scale, level, spent, k_scale[t - 1])
    reasons = np.where(written, np.where(by_threshold, Reason.THRESHOLD, Reason.SMAX),
                       NO_WRITE).astype(np.int8)
    inside = lt.base_step <= steps
    reasons[lt.base_step[inside] - 1, np.flatnonzero(inside)] = Reason.BASE
    return reasons, k_scale


class _Openings:
    """Which lanes have an opportunity at step t (``t % interval == 0``), cached
    per set of intervals that divide t: a grid has few intervals."""

    def __init__(self, interval: np.ndarray) -> None:
        self.interval = interval
        self.values = sorted(set(interval.tolist()))
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def at(self, t: int) -> np.ndarray:
        key = tuple(v for v in self.values if t % v == 0)
        mask = self.cache.get(key)
        if mask is None:
            mask = self.cache[key] = np.isin(self.interval, key)
        return mask


def _settle(lt: LaneTable, t: int, write: np.ndarray, at_base: np.ndarray | None,
            scale: np.ndarray, level: np.ndarray, spent: np.ndarray, k_row: np.ndarray) -> None:
    """The write budgets' accounts after step t (``layercheck.contract.budget``), in place."""
    groups = len(lt.group_budget)
    k_row[lt.group_policy] = scale[:groups]
    settle = (t % lt.group_interval == 0) & (t > lt.group_base)
    if not settle.any():
        return
    charged = write & (lt.group < groups)
    if at_base is not None:
        charged &= ~at_base                                   # the base is not charged
    spent += np.bincount(lt.group[charged], weights=lt.size[charged], minlength=groups)
    over = budget.debt(spent, lt.group_budget, t - lt.group_base)
    level[:groups] = np.where(settle, budget.next_level(level[:groups], over), level[:groups])
