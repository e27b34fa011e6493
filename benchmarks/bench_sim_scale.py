"""The fast engine at exploration sizes, against its references in the same run (issue 26, section 4).

    python benchmarks/bench_sim_scale.py [--repeat 3] [--part sweep,scale] [--out FILE.json]

1. **sweep**: the issue's sweep (``bench_sim.py``'s: 20 MTBFs log-spaced 36 s..3 h
   x every strategy (7) x 10 seeds, 30-day windows, the default preset, plus the
   perfect checkpointer), as ``sim.sweep`` runs it by default (the compiled loop,
   ``sim/kernel.py``, in this process: the sweep is under ``sim.grid.POOL_MIN_WORK``). Reference: the same
   call on the numpy loop in this process (``LAYERCHECK_SIM_KERNEL=numpy``,
   ``workers=1``: the engine as it was before, 16-20 s). The two tables must be
   equal; target under 5 s. Also timed: the same on a pool of every CPU
   (``workers=N``, ``sim/grid.py``).
2. **scale**: a 16,384-GPU job (2,048 nodes of 8 GPUs) over 54 days, every strategy x
   10 seeds, failing at Llama 3 405B's reported rate (419 unexpected interruptions
   in 54 days on 16,384 GPUs, ../shared/design/SCALE.md): with ``sim.nodes``
   present, as the superposition of 2,048 exponential nodes of node MTBF 2,048 x
   54 d / 419 (``NodeFailures``); without it, the job-level process at that job MTBF
   (the superposition's exact rate). Reference: the same model in SimPy
   (``--engine simpy``, every step an event), one lane per repeat (strategy i mod 7,
   seed 0), which must equal the fast engine's lane to 1e-9; the ratio reported is
   the SimPy lane's time x the scenario's lanes (70) over the fast engine's time for
   all of them. Target under 10 s.

Variant and reference alternate which goes first. The first fast call of the
process imports numba and loads the compiled loop from its cache (or compiles it):
it is reported apart ("cold"), and every repeat after it is warm. Prints min and
median of each and of the per-repeat ratios, with the load average at the start
and the end (the machine is shared).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's sim

from sim import DAY, Scenario, simulate, sweep  # noqa: E402
from sim.api import COLUMNS  # noqa: E402

SWEEP_MTBFS = np.geomspace(36.0, 10800.0, 20)
GPUS, GPUS_PER_NODE = 16_384, 8
WINDOW_S = 54 * DAY
INTERRUPTIONS = 419
"""Llama 3 405B: unexpected interruptions in 54 days on 16,384 GPUs (SCALE.md)."""
JOB_MTBF_S = WINDOW_S / INTERRUPTIONS


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _numpy_loop(fn):
    """``fn()`` on the numpy loop (the engine before the compiled one), in this process."""
    old = os.environ.get("LAYERCHECK_SIM_KERNEL")
    os.environ["LAYERCHECK_SIM_KERNEL"] = "numpy"
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["LAYERCHECK_SIM_KERNEL"]
        else:
            os.environ["LAYERCHECK_SIM_KERNEL"] = old


def scale_scenario() -> tuple[Scenario, float | None, str]:
    """The 16,384-GPU scenario: per-node failure processes where ``sim.nodes`` exists."""
    base = Scenario.from_preset("qwen2.5-7b", window_s=WINDOW_S)
    nodes = GPUS // GPUS_PER_NODE
    try:
        from sim.nodes import NodeFailures
    except ImportError:
        return base, JOB_MTBF_S, (f"job-level exponential failures at the job MTBF of {nodes:,} "
                                  f"nodes, {JOB_MTBF_S:,.0f} s (sim.nodes not present)")
    failures = NodeFailures(nodes=nodes, node_mtbf_s=nodes * JOB_MTBF_S)
    return (Scenario.from_preset("qwen2.5-7b", window_s=WINDOW_S, failures=failures), None,
            f"{nodes:,} exponential nodes, node MTBF {nodes * JOB_MTBF_S / 3600:,.0f} h (sim.nodes)")


def bench_sweep(repeat: int) -> dict:
    scenario = Scenario.from_preset("qwen2.5-7b")
    run = lambda: sweep(scenario, mtbf_s=SWEEP_MTBFS, seeds=10)  # noqa: E731
    cold, expected = _timed(run)
    cpus = len(os.sched_getaffinity(0))
    times = {"fast": [], "pool": [], "ref": []}
    for i in range(repeat):
        order = [("fast", run),
                 ("pool", lambda: sweep(scenario, mtbf_s=SWEEP_MTBFS, seeds=10, workers=cpus)),
                 ("ref", lambda: _numpy_loop(lambda: sweep(scenario, mtbf_s=SWEEP_MTBFS, seeds=10,
                                                           workers=1)))]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            seconds, df = _timed(fn)
            assert df[["mtbf_s", *COLUMNS]].equals(expected[["mtbf_s", *COLUMNS]]), name
            times[name].append(seconds)
        print(f"  sweep repeat {i + 1}: fast {times['fast'][-1]:.2f} s (a pool of {cpus}: "
              f"{times['pool'][-1]:.2f} s), numpy loop {times['ref'][-1]:.2f} s, ratio "
              f"{times['ref'][-1] / times['fast'][-1]:.1f}x, load {os.getloadavg()[0]:.1f}")
    return {"cold_s": cold, "fast_s": times["fast"], "pool_s": times["pool"],
            "reference_s": times["ref"], "events": expected.attrs["events"]}


def bench_scale(repeat: int) -> dict:
    scenario, mtbf, model = scale_scenario()
    names = list(scenario.available())
    run = lambda: simulate(scenario, mtbf_s=mtbf, seeds=10)  # noqa: E731
    cold, table = _timed(run)
    fast, ref, lanes = [], [], []
    for i in range(repeat):
        name = names[i % len(names)]
        one = lambda: simulate(scenario, mtbf_s=mtbf, seeds=1, strategies=[name],  # noqa: E731
                               engine="simpy")
        order = [("fast", run), ("ref", one)]
        for which, fn in order if i % 2 == 0 else order[::-1]:
            seconds, df = _timed(fn)
            (fast if which == "fast" else ref).append(seconds)
            if which == "ref":
                lane = simulate(scenario, mtbf_s=mtbf, seeds=1, strategies=[name])
                for col in ("effective_ratio", "useful_s", "lost_work_s", "recovery_s", "failures"):
                    assert np.isclose(df[col].iloc[0], lane[col].iloc[0], rtol=1e-9), (name, col)
        lanes.append(name)
        print(f"  scale repeat {i + 1}: fast {fast[-1]:.2f} s (70 lanes), SimPy {ref[-1]:.1f} s "
              f"({name}, 1 lane), ratio {ref[-1] * 70 / fast[-1]:.0f}x, "
              f"load {os.getloadavg()[0]:.1f}")
    return {"model": model, "cold_s": cold, "fast_s": fast, "reference_s": ref,
            "reference_lanes": lanes, "failures_per_run": float(table["failures"].mean())}


def _summary(name: str, res: dict, scale_ref: float) -> None:
    fast, ref = res["fast_s"], res["reference_s"]
    ratios = [r * scale_ref / f for f, r in zip(fast, ref)]
    pool = res.get("pool_s")
    alone = f" (a pool of every CPU: min {min(pool):.2f} s median {statistics.median(pool):.2f} s)" \
        if pool else ""
    print(f"{name}: cold {res['cold_s']:.2f} s; fast min {min(fast):.2f} s median "
          f"{statistics.median(fast):.2f} s{alone}; reference min {min(ref):.2f} s median "
          f"{statistics.median(ref):.2f} s; ratio min {min(ratios):.1f}x median "
          f"{statistics.median(ratios):.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--part", default="sweep,scale", help="comma list of sweep, scale")
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    parts = [p.strip() for p in args.part.split(",")]
    try:
        import numba
        numba_version = numba.__version__
    except ImportError:
        numba_version = None
    load_start = os.getloadavg()
    print(f"python {platform.python_version()}, numpy {np.__version__}, numba {numba_version}, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
          f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    out = {"python": platform.python_version(), "numpy": np.__version__, "numba": numba_version,
           "cpus": os.cpu_count(), "load_start": load_start}
    if "sweep" in parts:
        out["sweep"] = bench_sweep(args.repeat)
    if "scale" in parts:
        out["scale"] = bench_scale(args.repeat)
    out["load_end"] = os.getloadavg()
    print()
    if "sweep" in out:
        _summary("sweep (target < 5 s; ratio: numpy loop / fast)", out["sweep"], 1)
    if "scale" in out:
        print(f"scale model: {out['scale']['model']}; {out['scale']['failures_per_run']:.0f} "
              "failures a run")
        _summary("scale (target < 10 s; ratio: SimPy lane x 70 / fast)", out["scale"], 70)
    print(f"load average at the start {load_start[0]:.2f}, at the end {out['load_end'][0]:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
