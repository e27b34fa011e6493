"""Tiny traces for the dashboard's tests: seeded drift, writes decided by the library's policy."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.policy import Policy, PolicyState, Reason
from layercheck.contract.trace import SCHEMA_VERSION, Trace, write_trace
from sim.presets import preset_calibration


def make_trace(*, name: str = "tiny-captured", kind: str = "captured", steps: int = 400,
               blocks: int = 4, seed: int = 0, drill: bool = True,
               config: LayerCheckConfig | None = None) -> Trace:
    """A valid trace: embed + blocks + norm + head, drift from a seeded generator
    (layers drifting at different rates), writes decided by ``PolicyState``."""
    rng = np.random.default_rng(seed)
    config = config or LayerCheckConfig(base_threshold=1e-3, embedding_threshold=1e-2, smax=150,
                                        warmup_steps=20)
    names = ["embed", *(f"block{i}" for i in range(blocks)), "norm", "head"]
    kinds = ["embedding", *(["block"] * blocks), "norm", "head"]
    params = [5000, *([2000] * blocks), 10, 5000]
    layers = [{"name": n, "kind": k, "params": p, "bytes": 14 * p}
              for n, k, p in zip(names, kinds, params)]
    t = np.arange(1, steps + 1)
    lr_peak = 1e-4
    lr = lr_peak * np.where(t < 30, t / 30, 0.55 + 0.45 * np.cos(np.pi * (t - 30) / steps))
    rates = np.array([2e-4, *np.geomspace(1e-4, 2e-5, blocks), 3e-6, 8e-5])
    drift = rng.gamma(2.0, 0.5, size=(steps, len(names))) * rates
    state = PolicyState(policy=Policy.from_config(config, names, kinds))
    acc = np.zeros_like(drift)
    writes = []
    for step in t:
        decision = state.observe(int(step), drift[step - 1], float(lr[step - 1] / lr_peak))
        acc[step - 1] = state.accumulators
        for layer, reason in zip(decision.layers, decision.reasons):
            writes.append({"step": int(step), "layer": int(layer), "bytes": layers[layer]["bytes"],
                           "reason": Reason(reason).label, "stall_s": 1e-3, "persist_s": 5e-3})
    compute = rng.uniform(0.09, 0.11, size=steps)
    step_frame = pd.DataFrame({"step": t, "forward_s": compute * 0.3, "backward_s": compute * 0.6,
                               "optimizer_s": compute * 0.1, "drift_s": 1e-5, "stall_s": 1e-3,
                               "loss": 2.0 * np.exp(-t / steps) + 0.3, "lr": lr})
    layer_idx = np.tile(np.arange(len(names)), steps)
    drift_frame = pd.DataFrame({"step": np.repeat(t, len(names)), "layer": layer_idx,
                                "drift": drift.reshape(-1), "accumulator": acc.reshape(-1)})
    manifest = {"schema_version": SCHEMA_VERSION, "name": name, "kind": kind,
                "description": f"test trace {name}", "model": "tiny-test", "layers": layers,
                "config": config.to_dict(), "lr_peak": lr_peak, "machine": {"device": "cpu"},
                "sources": ["tests/dashboard/conftest.py"]}
    return Trace(manifest=manifest, steps=step_frame, drift=drift_frame,
                 writes=pd.DataFrame(writes, columns=["step", "layer", "bytes", "reason",
                                                      "stall_s", "persist_s"]),
                 drill=make_drill(steps, seed) if drill else None,
                 staleness=measured_study() if drill else None)


STUDY = Path(__file__).parent / "data" / "staleness-tiny.json"
"""A real staleness study of the tiny Qwen2 (made by ``python -m profiler staleness --model
tiny --steps 36 --threads 1 --eval-every 4 --eval-sequences 48 --horizons 4,12 --resamples
200 --out tests/dashboard/data/staleness-tiny.json``, then ``python -m profiler staleness
--reread tests/dashboard/data/staleness-tiny.json``): the dashboard's tests run without
torch, so they read a measured one rather than measure it."""


def measured_study() -> dict:
    return json.loads(STUDY.read_text())


def make_drill(steps: int, seed: int) -> dict:
    """A drill.json in the profiler's shape: two loss curves that differ after the failure."""
    rng = np.random.default_rng(seed + 1)
    step = np.arange(1, steps + 1)
    free = 2.0 * np.exp(-step / steps) + 0.3 + rng.normal(0, 0.01, steps)
    fail = steps // 2
    recovered = free + np.where(step > fail, rng.normal(0, 0.002, steps), 0.0)
    dev = np.abs(recovered - free)
    return {"failure_steps": [fail], "recovery_seconds": [0.42],
            "max_abs_loss_deviation": float(dev.max()),
            "max_rel_loss_deviation": float((dev / np.abs(free)).max()),
            "final_metric": {"name": "accuracy", "failure_free": 0.81, "recovered": 0.8075},
            "curves": {"step": step.tolist(), "failure_free": free.tolist(),
                       "recovered": recovered.tolist()}}


@pytest.fixture
def trace() -> Trace:
    return make_trace()


@pytest.fixture
def traces_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A traces folder: a captured trace with a drill, a synthetic one, an invalid one.
    $LAYERCHECK_TRACES points at it."""
    root = tmp_path / "traces"
    write_trace(make_trace(), root / "tiny-captured")
    synthetic = make_trace(name="qwen2.5-7b-synthetic", kind="synthetic", steps=300, seed=3,
                           drill=False)
    write_trace(dataclasses.replace(synthetic, costs=preset_calibration("qwen2.5-7b")),
                root / "qwen2.5-7b-synthetic")
    broken = root / "broken"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text(json.dumps({"schema_version": 1, "name": "broken"}))
    monkeypatch.setenv("LAYERCHECK_TRACES", str(root))
    return root


@pytest.fixture(autouse=True)
def answer_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Answers kept on disk (``dashboard.answerstore``) go to the test's own folder, never
    the user's cache."""
    folder = tmp_path / "answers"
    monkeypatch.setenv("LAYERCHECK_DASHBOARD_STORE", str(folder))
    return folder
