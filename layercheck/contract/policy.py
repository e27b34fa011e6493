"""The write policy: which layers to persist at a step. Pure, deterministic, no I/O.

Importable without torch (numpy only): the dashboard's vectorised what-if
replay is tested against ``replay`` below.

Contract, per optimizer step t = 1, 2, ... (after the step's update):

1. ``A_l += d_l(t)`` for every layer (``observe``).
2. If t is an opportunity (``t % interval == 0``):
   - before the base checkpoint exists: when ``t >= warmup_steps`` every
     layer is written (reason ``base``); otherwise nothing;
   - after it: layer l is written when ``A_l >= K_l(t)`` (reason
     ``threshold``) or when ``t - last_l >= smax`` (reason ``smax``), with
     ``K_l(t) = base_l * lr(t) / lr_peak * k_scale`` (no LR factor without LR
     scaling; ``k_scale`` the write budget's factor, 1 without one:
     ``Policy.thresholds``; what a trace records of it: ``layercheck.contract.decision``).
3. A written layer gets ``A_l = 0`` and ``last_l = t``.

(A fourth reason, ``retry``, is LayerCheck's own: under ``on_error="warn"``
it rewrites at the next opportunity the layers whose write failed.)

Staleness of layer l at step t is ``t - last_l`` (``last_l = 0`` before the
base). It never exceeds ``smax + interval - 1`` because ``warmup_steps <=
smax``.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import budget
from .config import ConfigError, LayerCheckConfig

__all__ = ["Policy", "PolicyState", "Decision", "Reason", "replay", "lr_peak", "lr_ratio"]


class Reason(enum.IntEnum):
    """Why a layer was written. ``Decision.reasons`` and the dashboard's replays
    hold these values; traces and manifests hold their ``label``."""

    BASE = 0
    THRESHOLD = 1
    SMAX = 2
    RETRY = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The static part of the policy: per-layer base thresholds and the schedule."""

    base: np.ndarray
    """Base threshold per layer (float64, may hold 0 and inf)."""
    smax: int
    warmup_steps: int
    interval: int
    lr_scaling: bool
    write_budget: float | None = None
    """Bytes per step after the base checkpoint (``layercheck.contract.budget``); None: fixed thresholds."""
    sizes: np.ndarray | None = None
    """Bytes of one version of each layer, as a write budget counts them. Needed
    only with a budget, from its first opportunity after the base checkpoint on
    (``LayerCheck`` takes them from the base checkpoint's snapshots)."""

    def __post_init__(self) -> None:
        if self.sizes is not None:
            sizes = np.array(self.sizes, dtype=np.float64)
            if sizes.shape != self.base.shape or not (np.isfinite(sizes).all() and (sizes >= 0).all()
                                                      and (sizes == np.round(sizes)).all()):
                raise ValueError(f"sizes must hold one whole byte count >= 0 per layer "
                                 f"({len(self.base)}), got {self.sizes!r}")
            sizes.setflags(write=False)
            object.__setattr__(self, "sizes", sizes)

    @classmethod
    def from_config(cls, config: LayerCheckConfig, names: Sequence[str],
                    kinds: Sequence[str], sizes: Sequence[float] | None = None) -> "Policy":
        """Thresholds for layers ``names`` of ``kinds`` ('embedding' gets the
        embedding threshold), per-layer overrides applied; unknown override
        names are an error that lists the real ones. ``sizes``: see the field."""
        unknown = sorted(set(config.thresholds) - set(names))
        if unknown:
            raise KeyError(f"thresholds name layers {unknown} that the model does not have; "
                           f"its layers are {list(names)}")
        base = np.array([
            config.thresholds.get(name, config.embedding_threshold if kind == "embedding"
                                  else config.base_threshold)
            for name, kind in zip(names, kinds)], dtype=np.float64)
        return cls(base=base, smax=config.smax, warmup_steps=config.warmup_steps,
                   interval=config.interval, lr_scaling=config.lr_scaling,
                   write_budget=config.write_budget,
                   sizes=None if sizes is None else np.asarray(sizes, dtype=np.float64))

    @property
    def num_layers(self) -> int:
        return len(self.base)

    def is_opportunity(self, step: int) -> bool:
        return step % self.interval == 0

    @property
    def base_step(self) -> int:
        """The step of the base checkpoint of a run that starts at step 0: the
        first opportunity at or after the warm-up."""
        k = self.interval
        return max(k, -(-self.warmup_steps // k) * k)

    def thresholds(self, lr_ratio: "float | np.ndarray",
                   k_scale: "float | np.ndarray" = 1.0) -> np.ndarray:
        """K_l(t) = base_l * lr_ratio * k_scale (``lr_ratio = lr(t) / lr_peak``, 1 without
        LR scaling; ``k_scale`` the write budget's factor, ``Decision.k_scale``): one
        per layer for numbers; steps x layers for arrays of one value per step (the
        same products). The one formula of K (``layercheck.contract.decision``)."""
        ratio = np.asarray(lr_ratio, dtype=np.float64)[..., None]
        if not self.lr_scaling:
            k = np.broadcast_to(self.base, ratio.shape[:-1] + self.base.shape)
        else:
            with np.errstate(invalid="ignore"):  # inf * 0 -> nan: an infinite K stays infinite
                k = np.where(np.isinf(self.base), np.inf, self.base * ratio)
        return k * np.asarray(k_scale, dtype=np.float64)[..., None]


@dataclass(frozen=True)
class Decision:
    """Layers to write at ``step`` (indices, ascending) and why (``Reason`` values);
    ``k_scale``: the write budget's factor on every threshold at this step (1
    without a budget)."""

    step: int
    layers: np.ndarray
    reasons: np.ndarray
    k_scale: float = 1.0

    @property
    def is_full(self) -> bool:
        return bool(self.reasons.size) and bool((self.reasons == Reason.BASE).all())


@dataclass(kw_only=True)
class PolicyState:
    """The running state of a Policy: accumulators, the step each layer was last
    written, and the write budget's account (``level``, ``spent``)."""

    policy: Policy
    accumulators: np.ndarray = field(default=None)  # type: ignore[assignment]
    last_written: np.ndarray = field(default=None)  # type: ignore[assignment]
    base_step: int | None = None
    level: int = 0
    """The write budget's level: thresholds are scaled by ``budget.scale(level)``."""
    spent: float = 0.0
    """Bytes the write budget has charged since the base checkpoint."""

    def __post_init__(self) -> None:
        n = self.policy.num_layers
        if self.accumulators is None:
            self.accumulators = np.zeros(n, dtype=np.float64)
        if self.last_written is None:
            self.last_written = np.zeros(n, dtype=np.int64)

    @classmethod
    def at(cls, policy: Policy, step: int, *, base_taken: bool) -> "PolicyState":
        """The state of a timeline that begins after ``step`` (0: a run's start; else a
        restore of step ``step``): every layer equals its copy, so each accumulator is 0
        and each layer counts as written at ``step``; ``base_taken``: the base checkpoint
        exists (a restore), so the next opportunity decides by drift and age. What
        ``LayerCheck`` continues from, and what ``layercheck.contract.resumed`` replays."""
        state = cls(policy=policy)
        state.last_written[:] = step
        state.base_step = step if base_taken else None
        return state

    def observe(self, step: int, drift: np.ndarray, lr_ratio: float) -> Decision:
        """Add step ``step``'s drift and decide what to write (contract in the module doc)."""
        self.accumulators += drift
        empty = np.empty(0, dtype=np.int64)
        policy = self.policy
        k_scale = self.k_scale
        if not policy.is_opportunity(step):
            return Decision(step, empty, empty, k_scale)
        if self.base_step is None:
            if step < policy.warmup_steps:
                return Decision(step, empty, empty, k_scale)
            self.base_step = step
            chosen = np.arange(policy.num_layers)
            reasons = np.full(policy.num_layers, Reason.BASE, dtype=np.int64)
        else:
            by_drift = self.accumulators >= policy.thresholds(lr_ratio, k_scale)
            by_age = (step - self.last_written) >= policy.smax
            mask = by_drift | by_age
            chosen = np.flatnonzero(mask)
            reasons = np.where(by_drift[chosen], Reason.THRESHOLD, Reason.SMAX).astype(np.int64)
        self.mark_written(step, chosen)
        if policy.write_budget is not None and step > self.base_step:
            self._settle(step, chosen)
        return Decision(step, chosen, reasons, k_scale)

    @property
    def k_scale(self) -> float:
        """The factor on every threshold now (1.0 without a write budget)."""
        return float(budget.scale(self.level)) if self.policy.write_budget is not None else 1.0

    def _settle(self, step: int, chosen: np.ndarray) -> None:
        """Charge this opportunity's writes to the budget and move its level."""
        sizes = self.policy.sizes
        if sizes is None:
            raise ValueError("a write budget needs the layers' sizes (Policy.sizes): give "
                             "Policy.from_config(..., sizes=bytes of one version of each layer)")
        # Whole byte counts: every partial sum is exact, so any replay's order gives this total.
        self.spent += float(sizes[chosen].sum())
        over = budget.debt(self.spent, self.policy.write_budget, step - self.base_step)
        self.level = int(budget.next_level(self.level, over))

    def mark_written(self, step: int, layers: Iterable[int]) -> None:
        idx = np.asarray(list(layers) if not isinstance(layers, np.ndarray) else layers,
                         dtype=np.int64)
        self.accumulators[idx] = 0.0
        self.last_written[idx] = step

    def staleness(self, step: int) -> np.ndarray:
        return step - self.last_written


def lr_peak(configured: float | None, groups: Iterable[Mapping[str, Any]], *,
            scaling: bool) -> float | None:
    """The LR at which thresholds equal their base values (``K = base * lr / lr_peak``):
    ``configured`` (``LayerCheckConfig.lr_peak``), else the largest ``initial_lr``
    (which torch LR schedulers set to the LR they scale, so a warm-up from 0 still
    gives its peak) or ``lr`` of the optimizer's parameter ``groups``.

    An optimizer made with lr=0 and no scheduler says nothing of the LR training
    will reach, and no ratio ``lr / 0`` is defined: ConfigError with the fix (give
    ``lr_peak``, or ``lr_scaling=False``) rather than a made-up peak, which would
    write every layer at every step, or never, as the LR rose. Without scaling
    the peak divides nothing: None then where the groups give no positive one."""
    if configured is not None:
        return configured
    peak = max((float(g.get("initial_lr", g["lr"])) for g in groups), default=math.nan)
    if math.isfinite(peak) and peak > 0:
        return peak
    if not scaling:
        return None
    raise ConfigError(
        f"the optimizer's learning rate is {peak!r} in every parameter group, so lr_peak (the LR "
        "at which thresholds equal their base values) cannot be taken from it: give "
        "LayerCheckConfig(lr_peak=<the peak LR your warm-up reaches>), or lr_scaling=False "
        "for thresholds that do not follow the LR")


def lr_ratio(lr: "float | np.ndarray", peak: float | None) -> "float | np.ndarray":
    """``lr / peak``, what ``Policy.thresholds`` scales by; 1 where there is none (no
    step measured an LR: NaN; no peak: thresholds are not scaled). The one definition:
    a live step's (a float) and a trace's steps (an array, ``Trace.lr_ratio``) alike."""
    if np.ndim(lr) == 0:
        return lr / peak if peak is not None and math.isfinite(lr) else 1.0
    lr = np.asarray(lr, dtype=np.float64)
    if peak is None:
        return np.ones_like(lr)
    return np.where(np.isfinite(lr), lr / peak, 1.0)


def replay(policy: Policy, drift: np.ndarray, lr_ratio: np.ndarray) -> list[Decision]:
    """Reference replay over a whole run: ``drift[t-1, l]`` and ``lr_ratio[t-1]``
    for steps t = 1..T. Returns the decision at every step (empty when nothing
    is written). Plain and step by step: the yardstick for faster twins
    (``layercheck.contract.fastreplay``, ``layercheck.contract.lanes``)."""
    drift = np.asarray(drift, dtype=np.float64)
    if drift.ndim != 2 or drift.shape[1] != policy.num_layers:
        raise ValueError(f"drift must be steps x {policy.num_layers} layers, got {drift.shape}")
    state = PolicyState(policy=policy)
    return [state.observe(t, drift[t - 1], float(lr_ratio[t - 1]))
            for t in range(1, drift.shape[0] + 1)]
