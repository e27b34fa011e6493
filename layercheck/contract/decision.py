"""The decision model as a trace records it, in one place. Torch-free (numpy, pandas).

A layer l is written at an opportunity t when its accumulated drift reaches

    K_l(t) = base_l * lr(t) / lr_peak * k_scale(t)

``base_l`` is the config's threshold for the layer (its per-layer override, else
the embedding or the base threshold), ``lr(t) / lr_peak`` applies only with
``lr_scaling``, and ``k_scale(t)`` is the write budget's factor (1 without a
budget; a trace records it per step, ``steps.k_scale``). The arithmetic is
``Policy.thresholds``, the one function the live policy and every replay call;
this module is everything a reader of a trace adds to it, so that the library's
tests, the simulator's frontier, the dashboard's what-if and the profiler's
heatmap read a trace the same way:

- ``recorded_config``: the config the trace was recorded with, and the one error
  rule for it (below);
- ``policy_for``: the library's ``Policy`` of a config on the trace's layers, the
  recorded per-layer overrides kept;
- ``threshold_matrix``: K_l(t) of the recorded run, ``k_scale`` included;
- ``paper_schedule``, ``paper_default``: the paper's settings scaled to a run's length.

The error rule. A trace's recorded config is the ground truth of what was
decided; a reader that quietly put the defaults in its place would show another
run's thresholds as the recorded ones. So a recorded config that is not a JSON
object, does not validate as a ``LayerCheckConfig`` or overrides layers the trace
does not have raises ``TraceError`` (the trace readers' one error: the sim CLI
exits 2 with it, the dashboard shows it as an unreadable trace). Two things are
not errors, by the trace format's version rule: a field the config lacks is at
the library's default (a field the format added later gets the value it had
before), and a key this library does not know is ignored (one a newer library
added).
"""
from __future__ import annotations

import dataclasses
import numpy as np

from .config import ConfigError, LayerCheckConfig
from .policy import Policy
from .trace import Trace, TraceError

__all__ = ["PAPER", "PAPER_STEPS", "EMBEDDING_FACTOR", "paper_scale", "paper_schedule", "paper_default",
           "recorded_config", "policy_for", "lr_ratio", "threshold_matrix"]

PAPER = LayerCheckConfig()
"""The paper's settings (LayerCheck, IEEE CLUSTER 2026; ``LayerCheckConfig``'s
defaults): K 1e-3, embeddings 1e-2, Smax 1000, warm-up 200, every step."""
PAPER_STEPS = 1692
"""The paper's run length: its warm-up and Smax are for runs this long."""
EMBEDDING_FACTOR = PAPER.embedding_threshold / PAPER.base_threshold
"""The paper's embedding threshold over its base threshold (10)."""


def paper_scale(num_steps: int) -> float:
    """``num_steps / 1692`` for runs shorter than the paper's, else 1."""
    return min(1.0, num_steps / PAPER_STEPS)


def paper_schedule(num_steps: int, *, warmup_steps: int | None = None,
                   smax: int | None = None) -> tuple[int, int]:
    """(warm-up, Smax) of the paper for a run of ``num_steps``: each scaled by
    ``paper_scale`` (so that they keep their share of a shorter run), at least 1,
    and a derived Smax at least the warm-up (which the library requires). A value
    given is kept as it is (not checked: the config that takes it checks it)."""
    scale = paper_scale(num_steps)
    warmup = max(1, round(PAPER.warmup_steps * scale)) if warmup_steps is None else warmup_steps
    return warmup, max(warmup, 1, round(PAPER.smax * scale)) if smax is None else smax


def paper_default(num_steps: int, *, base_threshold: float | None = None,
                  warmup_steps: int | None = None, smax: int | None = None) -> LayerCheckConfig:
    """The paper's LayerCheckConfig for a run of ``num_steps``: ``paper_schedule``'s
    warm-up and Smax, the paper's threshold, embeddings at ``EMBEDDING_FACTOR`` times
    it. Values given are kept and the rest derived around them. The profiler's
    default capture records exactly this (``profiler.config.CaptureConfig``)."""
    warmup, smax = paper_schedule(num_steps, warmup_steps=warmup_steps, smax=smax)
    k = PAPER.base_threshold if base_threshold is None else float(base_threshold)
    return LayerCheckConfig(base_threshold=k, embedding_threshold=k * EMBEDDING_FACTOR,
                            warmup_steps=warmup, smax=smax)


def recorded_config(trace: Trace) -> LayerCheckConfig:
    """The LayerCheckConfig ``trace`` was recorded with (missing fields at their
    defaults, unknown keys ignored); ``TraceError`` with the fix when it cannot be
    (the module doc's error rule)."""
    raw = trace.manifest.get("config")
    where = f"trace {trace.name!r}: its recorded config (manifest.json \"config\")"
    if not isinstance(raw, dict):
        raise TraceError(f"{where} is {type(raw).__name__}, not a JSON object of "
                         "LayerCheckConfig fields: restore it from the capture, or capture again")
    known = {f.name for f in dataclasses.fields(LayerCheckConfig)}
    data = {k: v for k, v in raw.items() if k in known}
    for key in ("base_threshold", "embedding_threshold"):
        try:  # JSON holds an infinite threshold as "inf"; from_dict converts, unnamed
            float(data.get(key, 0.0))
        except (TypeError, ValueError):
            raise TraceError(f"{where}: {key}={data[key]!r} is not a number: correct it there "
                             "(\"inf\" for an infinite threshold), or capture again") from None
    try:
        config = LayerCheckConfig.from_dict(data)
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:
        raise TraceError(f"{where} is not valid ({exc}): correct that field there, "
                         "or capture again") from None
    unknown = sorted(set(config.thresholds) - set(trace.layer_names))
    if unknown:
        raise TraceError(f"{where} overrides the thresholds of layers {unknown} that the trace "
                         f"does not have (its layers: {trace.layer_names}): correct "
                         "\"thresholds\" there, or capture again")
    return config


def policy_for(trace: Trace, config: LayerCheckConfig | None = None) -> Policy:
    """The library's Policy of ``config`` (default: the recorded one) on the trace's
    layers and budget sizes. The recorded per-layer overrides are kept: they belong
    to the layers, not to the setting tried; ``config``'s own overrides win."""
    recorded = recorded_config(trace)
    config = recorded if config is None else config
    config = dataclasses.replace(config, thresholds={**recorded.thresholds, **config.thresholds})
    kinds = [layer["kind"] for layer in trace.manifest["layers"]]   # trace.layers' column, no frame
    return Policy.from_config(config, trace.layer_names, kinds, sizes=trace.budget_sizes)


def lr_ratio(trace: Trace) -> np.ndarray:
    """lr(t) / lr_peak per step; 1 (thresholds at their base values) where the trace
    measured no learning rate: ``Trace.lr_ratio``, which is ``policy.lr_ratio``."""
    return trace.lr_ratio()


def threshold_matrix(trace: Trace) -> np.ndarray:
    """K_l(t) of the recorded run, steps x layers: the recorded config's thresholds
    at each step's LR ratio, times the write budget's factor the run recorded."""
    return policy_for(trace).thresholds(lr_ratio(trace), trace.k_scale())

