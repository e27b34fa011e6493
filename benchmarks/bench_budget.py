"""Budget mode: does the realised write rate stay within the budget, and what does it
do to staleness?

    python benchmarks/bench_budget.py [--trace traces/qwen2.5-7b-synthetic] [--captured DIR]

Replay: the trace's drift under its recorded setting with ``write_budget`` at a
quarter, half, one and two times what that setting writes per step (after the
base checkpoint, the base not counted), decided by the library's own policy
(``layercheck.contract.policy.replay``, equal to the vectorised replays). For each: the
realised bytes per step against the budget, the staleness, and the staleness of
fixed thresholds that write no more (every threshold scaled by one constant,
the best of 481 constants from 1/1000 to 1000, 3% apart, replayed at once by
``layercheck.contract.lanes``): what the controller's moving K costs or buys at equal bytes.

``--captured DIR``: a trace captured in budget mode (``python -m profiler capture
--config '{..., "write_budget": B}'``): the realised rate on disk (file bytes,
headers included) and as the controller counted it (tensor bytes), against B.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layercheck.contract.config import LayerCheckConfig  # noqa: E402
from layercheck.contract.lanes import replay_many  # noqa: E402
from layercheck.contract.policy import Policy, replay  # noqa: E402
from layercheck.contract.trace import read_trace  # noqa: E402

FACTORS = np.geomspace(1e-3, 1e3, 481)


def staleness(trace, written):
    series = trace.weighted_staleness(written)
    steps = np.arange(1, len(written) + 1)
    defined = ~np.isnan(series)
    from layercheck.contract.trace import last_written
    oldest = steps[defined] - last_written(written)[defined].min(axis=1)
    return series[defined].mean(), series[defined].max(), oldest.max()


def per_step(trace, written, base, sizes):
    return (written[base:] @ sizes).sum() / (trace.num_steps - base)


def replayed(trace, config):
    policy = Policy.from_config(config, trace.layer_names, list(trace.layers["kind"]),
                                sizes=trace.budget_sizes)
    ratio = np.nan_to_num(trace.lr_ratio(), nan=1.0)
    written = np.zeros((trace.num_steps, len(trace.layer_names)), dtype=bool)
    for d in replay(policy, trace.drift_matrix(), ratio):
        written[d.step - 1, d.layers] = True
    return policy, written


def report_replays(trace) -> None:
    base_config = LayerCheckConfig.from_dict(trace.manifest["config"])
    policy, free = replayed(trace, base_config)
    base, sizes = policy.base_step, trace.budget_sizes
    rate = per_step(trace, free, base, sizes)
    scaled = [Policy(base=policy.base * f, smax=policy.smax, warmup_steps=policy.warmup_steps,
                     interval=policy.interval, lr_scaling=policy.lr_scaling) for f in FACTORS]
    lanes = replay_many(scaled, trace.drift_matrix(), np.nan_to_num(trace.lr_ratio(), nan=1.0))
    fixed = [lanes.writes[:, lanes.lane_of[i]] for i in range(len(FACTORS))]
    fixed_rate = np.array([per_step(trace, w, base, sizes) for w in fixed])
    mean, peak, oldest = staleness(trace, free)
    print(f"{trace.name}: {trace.num_steps:,} steps, recorded setting writes {rate / 1e6:,.2f} MB "
          f"per step after the base (step {base}); staleness mean {mean:.1f}, peak {peak:.1f}, "
          f"max {oldest}\n")
    print("| budget (x recorded) | MB/step budget | MB/step realised | realised / budget | K factor "
          "range | mean / peak / max staleness | fixed K writing no more: factor, MB/step, mean / "
          "peak / max |")
    print("|---|---|---|---|---|---|---|")
    for share in (0.25, 0.5, 1.0, 2.0):
        budget = share * rate
        config = dataclasses.replace(base_config, write_budget=budget)
        _, written = replayed(trace, config)
        got = per_step(trace, written, base, sizes)
        k = _k_scales(trace, config)
        mean, peak, oldest = staleness(trace, written)
        ok = np.flatnonzero(fixed_rate <= got)
        best = ok[np.argmin(FACTORS[ok])] if ok.size else len(FACTORS) - 1
        f_mean, f_peak, f_oldest = staleness(trace, fixed[best])
        print(f"| {share:g} | {budget / 1e6:,.2f} | {got / 1e6:,.2f} | {got / budget:.3f} | "
              f"{k.min():.3g}-{k.max():.3g} | {mean:.1f} / {peak:.1f} / {oldest} | "
              f"x{FACTORS[best]:.3g}, {fixed_rate[best] / 1e6:,.2f}: {f_mean:.1f} / {f_peak:.1f} / "
              f"{f_oldest} |")


def _k_scales(trace, config):
    policy = Policy.from_config(config, trace.layer_names, list(trace.layers["kind"]),
                                sizes=trace.budget_sizes)
    return np.array([d.k_scale for d in replay(policy, trace.drift_matrix(),
                                                np.nan_to_num(trace.lr_ratio(), nan=1.0))])


def report_captured(path: str) -> None:
    trace = read_trace(path)
    config = LayerCheckConfig.from_dict(trace.manifest["config"])
    if config.write_budget is None:
        sys.exit(f"{path}: not captured in budget mode (its config has no write_budget)")
    w = trace.writes
    base = int(w.loc[w["reason"] == "base", "step"].max())
    after = w[w["step"] > base]
    steps = trace.num_steps - base
    on_disk = after["bytes"].sum() / steps
    counted = trace.write_matrix()[base:] @ trace.budget_sizes
    mean, peak, oldest = staleness(trace, trace.write_matrix())
    k = trace.k_scale()
    print(f"\n{trace.name} (captured in budget mode): write_budget {config.write_budget / 1e6:,.2f} "
          f"MB/step; after the base (step {base}) it wrote {on_disk / 1e6:,.3f} MB/step on disk "
          f"({on_disk / config.write_budget:.3f} of the budget; tensor bytes as the controller "
          f"counts: {counted.sum() / steps / 1e6:,.3f} MB/step, "
          f"{counted.sum() / steps / config.write_budget:.3f}); {len(w)} layer writes; staleness "
          f"mean {mean:.1f}, peak {peak:.1f}, max {oldest}; K factor {k.min():.3g}-{k.max():.3g}")
    worst = max(np.cumsum(counted) - config.write_budget * np.arange(1, steps + 1))
    print(f"largest running excess over the budget line: {worst / 1e6:,.1f} MB "
          f"({worst / config.write_budget:.1f} steps of budget)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", help="trace(s) to replay (default: the 7B preset "
                    "and the MiniLM capture)")
    ap.add_argument("--captured", help="a trace captured in budget mode")
    args = ap.parse_args()
    for path in args.trace or ["traces/qwen2.5-7b-synthetic", "traces/minilm-1000steps"]:
        report_replays(read_trace(path))
        print()
    if args.captured:
        report_captured(args.captured)


if __name__ == "__main__":
    main()
