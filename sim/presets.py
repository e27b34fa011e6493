"""Presets from the paper's published figures, and their synthetic drift traces.

Each preset is a model (layer table from ``architectures``), the paper's
setting (1,692 iterations, per-iteration time from its end-to-end times, the
LayerCheck defaults) and a *synthetic* drift trace: per-layer drift drawn so
that ``layercheck.contract.policy.replay`` with the paper's thresholds writes about as
many layers, checkpoints and bytes as the paper's storage table reports. The
trace is labelled kind="synthetic" and never stands in for a measurement.

``python -m sim presets --write`` regenerates traces/<preset>-synthetic/
(deterministic for a seed), each with a costs.json of the paper's server
(``paper-a100``, LowDiff's diff size from that model's storage figures);
``calibrate(name)`` re-fits the drift rates below.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.policy import Policy, Reason, replay
from layercheck.contract.calibration import Figure
from .calibrated import FIGURES, Calibration
from layercheck.contract.trace import (SCHEMA_VERSION, Trace, TraceError, last_written, read_trace,
                              weighted_staleness, write_trace)

from .architectures import ARCHITECTURES, BYTES_PER_PARAM
from .composite import embedding_share, transfer_stale_cost
from .costs import GB, PAPER_A100, CostModel
from .errors import SimError
from .published import DEFAULT_PRESET, PAPER, PRESET_NAMES, PUBLISHED, REGIMES, Published, Regime
from .workload import Workload

__all__ = ["PRESET_NAMES", "DEFAULT_PRESET", "PUBLISHED", "REGIMES", "Regime", "build_trace",
           "preset_trace", "preset_scenario_fields", "TRACES_DIR", "trace_stats"]

ITERATIONS = 1692
"""Training iterations per run in every experiment of the paper."""
CHECKPOINT_SHARE = 0.1135
"""LayerCheck's checkpoint share of end-to-end runtime: the paper reports
10.7-12.0% across models; we take the midpoint."""
TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"
LR_PEAK = 1e-5
"""ASSUMPTION (synthetic traces only): a typical SFT peak learning rate; the
policy only sees lr / lr_peak. Schedule: linear warm-up over 50 steps, cosine
decay to 10% of the peak."""
PHASES = {"forward_s": 0.3, "backward_s": 0.6, "optimizer_s": 0.1}
"""ASSUMPTION (synthetic traces only): split of a step's compute; the simulator
uses only the sum."""

# Mean steps between threshold writes per layer kind, fitted by `--calibrate`
# so that replay matches PUBLISHED (writes, bytes; staleness where reported).
DRIFT_INTERVALS: dict[str, dict[str, float]] = {
    "qwen2.5-7b": {"block": 215.1, "head": 25.3, "embedding": 1318.6, "norm": 1365.2},
    "qwen2.5-3b": {"block": 195.7, "embedding": 862.2, "norm": 700.0},
    "llama-3.2-1b": {"block": 106.8, "embedding": 112.4, "norm": 700.0},
}
NOISE_SIGMA = 0.5
"""Log-normal spread of a layer's per-step drift around its mean."""


def compute_seconds(name: str) -> float:
    """Per-iteration compute (forward + backward + optimizer) of a preset: the paper's
    LayerCheck end-to-end time x (1 - checkpoint share) / 1,692. Qwen2.5-3B has no
    published time: interpolated linearly in parameter count between 1B and 7B."""
    def measured(n: str) -> float:
        return PUBLISHED[n].layercheck_minutes * 60 * (1 - CHECKPOINT_SHARE) / ITERATIONS
    if PUBLISHED[name].layercheck_minutes is not None:
        return measured(name)
    lo, hi = "llama-3.2-1b", "qwen2.5-7b"
    p = {n: ARCHITECTURES[n].total_params() for n in (lo, hi, name)}
    return measured(lo) + (p[name] - p[lo]) / (p[hi] - p[lo]) * (measured(hi) - measured(lo))


def costs_for(name: str) -> CostModel:
    """The paper's server, with LowDiff's diff size from this model's storage figures
    (total minus its full checkpoints every 106 steps, per iteration)."""
    full_gb = ARCHITECTURES[name].total_params() * BYTES_PER_PARAM / GB
    fulls = len(range(106, ITERATIONS, 106))
    pub = PUBLISHED[name].lowdiff_total_gb
    diff = round((pub - fulls * full_gb) / ITERATIONS / full_gb, 4)
    paper = CostModel.paper_a100()
    record = Figure(value=diff, source="derived", method=(
        f"{PAPER}: LowDiff wrote {pub:,.0f} GB for {name} in {ITERATIONS} iterations; minus "
        f"{fulls} full checkpoints of {full_gb:.1f} GB, per iteration, over a full checkpoint"))
    return CostModel(**{**_values(paper), "diff_fraction": diff},
                     provenance={**paper.provenance, "diff_fraction": record})


def _values(costs: CostModel) -> dict[str, float]:
    return {n: getattr(costs, n) for n in FIGURES}


def preset_calibration(name: str, written: np.ndarray | None = None) -> Calibration:
    """The costs.json of a preset: the paper's server (``costs_for``), its stale cost
    factor carried over by the composition of the preset's writes (``written``, steps x
    layers; ``sim.composite.transfer_stale_cost``), or as measured where none is given."""
    costs = costs_for(name)
    figures = dict(costs.provenance)
    if written is not None:
        layers = ARCHITECTURES[name].layers()
        share = embedding_share(written, np.array([l["params"] for l in layers], dtype=np.float64),
                                np.array([l["kind"] == "embedding" for l in layers]))
        figures["stale_cost"] = transfer_stale_cost(share, f"{name}-synthetic")
    return Calibration(name=PAPER_A100, description=costs.description,
                       figures=figures,
                       model={"name": name, "hf_id": ARCHITECTURES[name].hf_id},
                       machine={"description": costs.description})


def _lr_ratio(steps: int) -> np.ndarray:
    t = np.arange(1, steps + 1, dtype=np.float64)
    warm = 50
    cosine = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * (t - warm) / (steps - warm)))
    return np.where(t <= warm, t / warm, cosine)


def _drift(name: str, intervals: dict[str, float], rng: np.random.Generator,
           policy: Policy, kinds: list[str], lr: np.ndarray) -> np.ndarray:
    """d_l(t) = base_l / I_l * lr(t)/lr_peak * lognormal noise (mean 1): the LR
    scaling of the threshold cancels, so layer l crosses K about every I_l steps."""
    depth = rng.uniform(0.75, 1.35, len(kinds))  # blocks differ in how fast they move
    mean = np.array([policy.base[i] / (intervals[k] * (depth[i] if k == "block" else 1.0))
                     for i, k in enumerate(kinds)])
    noise = rng.lognormal(-NOISE_SIGMA ** 2 / 2, NOISE_SIGMA, (len(lr), len(kinds)))
    return mean[None, :] * lr[:, None] * noise


def build_trace(name: str, *, seed: int = 0, intervals: dict[str, float] | None = None) -> Trace:
    """The synthetic trace of preset ``name``: drift drawn with ``seed``, writes decided
    by ``layercheck.contract.policy.replay`` with the paper's LayerCheck defaults."""
    if name not in ARCHITECTURES:
        raise SimError(f"unknown preset {name!r}; choose from {', '.join(PRESET_NAMES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SimError(f"--seed {seed!r}: a preset's drift is drawn from a seed, a non-negative "
                       "integer (default 0)")
    arch, config = ARCHITECTURES[name], LayerCheckConfig(lr_peak=LR_PEAK)
    layers = arch.layers()
    names, kinds = [l["name"] for l in layers], [l["kind"] for l in layers]
    policy = Policy.from_config(config, names, kinds)
    lr = _lr_ratio(ITERATIONS)
    rng = np.random.default_rng(np.random.SeedSequence([seed, PRESET_NAMES.index(name)]))
    drift = _drift(name, intervals or DRIFT_INTERVALS[name], rng, policy, kinds, lr)
    decisions = replay(policy, drift, lr)
    return _assemble(name, arch, layers, config, drift, lr, decisions, seed,
                     intervals or DRIFT_INTERVALS[name])


def _assemble(name, arch, layers, config, drift, lr, decisions, seed, intervals) -> Trace:
    n, n_layers = drift.shape
    step_s = compute_seconds(name)
    steps = pd.DataFrame({"step": np.arange(1, n + 1),
                          **{k: np.full(n, step_s * f) for k, f in PHASES.items()},
                          "drift_s": 0.0, "stall_s": np.nan, "loss": np.nan, "lr": lr * LR_PEAK})
    written = np.zeros((n, n_layers), dtype=bool)
    rows = []
    for d in decisions:
        written[d.step - 1, d.layers] = True
        rows += [(d.step, int(l), layers[l]["bytes"], Reason(r).label) for l, r in zip(d.layers, d.reasons)]
    writes = pd.DataFrame(rows, columns=["step", "layer", "bytes", "reason"])
    writes["stall_s"], writes["persist_s"] = np.nan, np.nan
    acc = np.zeros_like(drift)
    running = np.zeros(n_layers)
    for t in range(n):
        running = np.where(written[t], 0.0, running + drift[t])
        acc[t] = running
    grid_step, grid_layer = np.divmod(np.arange(n * n_layers), n_layers)
    drift_df = pd.DataFrame({"step": grid_step + 1, "layer": grid_layer,
                             "drift": drift.ravel(), "accumulator": acc.ravel()})
    manifest = _manifest(name, arch, layers, config, seed, written, intervals)
    return Trace(manifest=manifest, steps=steps, drift=drift_df, writes=writes,
                 costs=preset_calibration(name, written))


def _manifest(name, arch, layers, config, seed, written, intervals) -> dict[str, Any]:
    stats = _stats(written, layers)
    return {
        "schema_version": SCHEMA_VERSION, "name": f"{name}-synthetic", "kind": "synthetic",
        "description": (f"SYNTHETIC drift trace for {arch.hf_id}: drift drawn (seed {seed}) so that "
                        "LayerCheck's policy with the paper's defaults writes about as much as "
                        "the paper reports (OpenThoughts). Not a measurement."),
        "model": {"name": name, **dataclasses.asdict(arch)},
        "layers": layers, "config": config.to_dict(), "lr_peak": LR_PEAK,
        "machine": {"description": "the paper's server: 1 node, 8x A100 40 GB, Lustre, ZeRO-3",
                    "compute_s_per_step": compute_seconds(name)},
        "sources": {"paper": PAPER, "published": dataclasses.asdict(PUBLISHED[name]),
                    "architecture": f"https://huggingface.co/{arch.hf_id}/blob/main/config.json",
                    "compute": "LayerCheck end-to-end time x (1 - 0.1135 checkpoint share) / 1692",
                    "synthetic": {"seed": seed, "intervals": intervals,
                                  "noise_sigma": NOISE_SIGMA, "achieved": stats}},
    }


def _stats(written: np.ndarray, layers: list[dict]) -> dict[str, float]:
    nbytes = np.array([l["bytes"] for l in layers], dtype=np.float64)
    params = np.array([l["params"] for l in layers], dtype=np.float64)
    series = weighted_staleness(written, params)
    defined = ~np.isnan(series)
    age = np.arange(1, written.shape[0] + 1)[:, None] - last_written(written)
    return {"layer_writes": int(written.sum()), "checkpoints": int(written.any(axis=1).sum()),
            "total_gb": float((written * nbytes).sum() / GB),
            "staleness": float(series[defined].mean()) if defined.any() else 0.0,
            "max_staleness": int(age[defined].max()) if defined.any() else 0}


def trace_stats(trace: Trace) -> dict[str, float]:
    """Layer writes, checkpoints, total GB, weighted and max staleness of a trace."""
    return _stats(trace.write_matrix(), trace.manifest["layers"])


def preset_trace(name: str) -> Trace:
    """The shipped trace folder of preset ``name``, or (if absent) the same trace built
    in memory with seed 0."""
    if name not in PUBLISHED:
        raise SimError(f"unknown preset {name!r}; choose from {', '.join(PRESET_NAMES)}")
    folder = TRACES_DIR / f"{name}-synthetic"
    if (folder / "manifest.json").exists():
        try:
            return read_trace(folder)
        except TraceError as exc:
            raise SimError(f"preset trace {folder} is damaged ({exc}); regenerate it with "
                           "`python -m sim presets --write`") from None
    return build_trace(name)


def preset_scenario_fields(name: str) -> dict[str, Any]:
    """Scenario fields of a preset: its synthetic trace, the paper's costs, the
    matched-freshness interval (the paper's comparison)."""
    key = name.lower()
    if key.endswith("-synthetic"):
        key = key[: -len("-synthetic")]
    trace = preset_trace(key)
    costs = CostModel.from_calibration(trace.costs) if trace.costs is not None else costs_for(key)
    return {"name": key, "workload": Workload.from_trace(trace), "costs": costs,
            "protocol": "matched", "description": trace.manifest["description"]}


def write_presets(seed: int = 0, names: tuple[str, ...] = PRESET_NAMES) -> list[Path]:
    """Write traces/<name>-synthetic/ for every preset; returns the folders."""
    return [write_trace(build_trace(n, seed=seed), TRACES_DIR / f"{n}-synthetic") for n in names]


def calibrate(name: str, *, seed: int = 0, iterations: int = 60) -> dict[str, float]:
    """Fit DRIFT_INTERVALS[name] (the norm's only where a maximum staleness is
    published) to PUBLISHED by Nelder-Mead on
    the relative errors of layer writes, total GB and (where published) staleness."""
    from scipy.optimize import minimize
    pub, start = PUBLISHED[name], DRIFT_INTERVALS[name]
    free = [k for k in start if k != "norm" or pub.max_staleness]

    def loss(x: np.ndarray) -> float:
        intervals = {**start, **{k: float(math.exp(v)) for k, v in zip(free, x)}}
        s = trace_stats(build_trace(name, seed=seed, intervals=intervals))
        err = [(s["layer_writes"] / pub.layer_writes - 1), (s["total_gb"] / pub.total_gb - 1)]
        if pub.staleness:
            err.append(s["staleness"] / pub.staleness - 1)
        if pub.max_staleness:
            err.append(s["max_staleness"] / pub.max_staleness - 1)
        return float(np.sum(np.square(err)))
    x0 = np.log([start[k] for k in free])
    best = minimize(loss, x0, method="Nelder-Mead", options={"maxfev": iterations})
    return {**start, **{k: round(float(math.exp(v)), 1) for k, v in zip(free, best.x)}}
