"""``python -m sim``: the command line. Bad input is one line on stderr and exit 2.

    python -m sim --mtbf 0.5h                      table for the default preset
    python -m sim --mtbf 30m --json | --csv
    python -m sim --trace traces/NAME --mtbf 1h    the trace's own costs.json
    python -m sim sweep --mtbf 0.01h..3h --points 20 --out runs/sweep
                       [--workers N] [--scheduler tcp://HOST:8786]   where the lanes run
    python -m sim presets [--write]
    python -m sim tune --trace traces/NAME --mtbf 0.5h [--max-gb 500] [--max-staleness 100]
                       [--max-write-share 0.05] [--json]     the best LayerCheck setting
    python -m sim sensitivity --mtbf 0.5h [--figures a,b] [--json]  what the ranking hangs on
    python -m sim paper [--mtbf 0.5h] [--seeds 10] [--json]      the paper's own figure beside ours
    python -m sim --nodes 2048 --node-mtbf 6350h --failures weibull --shape 0.7
                  [--domain rack:32:3000d]                  a job of N nodes (sim.nodes)
    python -m sim --nodes 1024 --failure-log lanl --system 18   a node record replayed
    python -m sim fit-failures lanl --system 18 [--json]   per-node law fitted to a record
    python -m sim scale --gpus 8..16384 [--json | --csv]  the ratio against job size (sim.scalecli)
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from layercheck.errors import OneLineParser, one_line
from layercheck.contract.trace import TraceError, read_trace

from layercheck.contract.calibration import FIGURES, read_calibration
from layercheck.contract.measurement import age_warning

from . import scalecli
from .api import ENGINES, Scenario, simulate, sweep
from .costs import COST_MODELS, CostModel
from .errors import SimError
from .failures import FailureModel, job_mtbf, read_failure_log
from .grid import SCHEDULER_ENV
from .nodes import Domain, NodeFailures
from .outputs import output_folder, writing
from .presets import DEFAULT_PRESET, PRESET_NAMES, REGIMES
from .report import figure
from .strategies import PROTOCOLS, STRATEGIES
from .units import format_duration, parse_duration, parse_range
from .work import check_runs

__all__ = ["main"]

COMMANDS = ("run", "sweep", "presets", "tune", "sensitivity", "paper", "fit-failures", "scale")
COST_FLAGS = {
    "write_gbps": (("save_gbps", "persist_gbps", "lc_write_gbps"), "storage write bandwidth, GB/s "
                   "(synchronous saves, background persists and LayerCheck's writer)"),
    "read_gbps": (("load_gbps", "async_load_gbps", "lc_load_gbps"), "storage read bandwidth during "
                  "recovery, GB/s (every load)"),
    "host_copy_gbps": (("snapshot_gbps", "host_copy_gbps", "lc_snapshot_gbps"),
                       "copy to host memory, GB/s (every snapshot)"),
    "peer_gbps": (("peer_gbps",), "GEMINI's transfer to a peer's memory, GB/s"),
    "peer_loss_probability": (("peer_loss_probability",), "chance a failure also loses GEMINI's peer copy"),
    "tracking_fraction": (("tracking_fraction",), "LayerCheck's drift tracking as a fraction of compute"),
    "diff_fraction": (("diff_fraction",), "LowDiff's per-step diff as a fraction of a full checkpoint"),
}
"""Convenience overrides, each setting the cost figures it names; ``--cost NAME=VALUE``
sets any one figure."""


def _scenario_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario (default: the qwen2.5-7b preset)")
    g.add_argument("--preset", choices=PRESET_NAMES, help="a built-in preset")
    g.add_argument("--trace", help="a trace folder (traces/NAME) from the profiler or a preset")
    g.add_argument("--iteration-time", help="custom job without a trace: compute per step, e.g. 6s")
    g.add_argument("--iterations", type=int, default=1692, help="custom job: steps per job")
    g.add_argument("--checkpoint-cost", help="custom job: time to write a full checkpoint, e.g. 60s")
    g.add_argument("--checkpoint-gb", type=float, default=106.6, help="custom job: full checkpoint size")
    f = p.add_argument_group("failures")
    f.add_argument("--gpus", type=int, help="GPUs in the job (with --gpu-mtbf or --regime)")
    f.add_argument("--gpu-mtbf", help="MTBF of one GPU; the job's MTBF is this / --gpus")
    f.add_argument("--regime", choices=tuple(REGIMES), help="a published failure regime")
    f.add_argument("--failures", choices=("exponential", "weibull", "log"), default=None,
                   help="the law of the job's gaps, or with --nodes of each node's")
    f.add_argument("--shape", type=float, default=0.7, help="Weibull shape (default 0.7)")
    f.add_argument("--failure-log", help="CSV of the job's failure times (column time or "
                   "time_s); with --nodes a record of nodes replayed: lanl (shipped, with "
                   "--system N) or a CSV of node and time columns")
    f.add_argument("--nodes", type=int, help="a job of N nodes, each failing on its own (the "
                   "job's failures are their superposition): with --node-mtbf, or a record "
                   "(--failure-log)")
    f.add_argument("--node-mtbf", help="with --nodes: one node's MTBF, e.g. 6350h")
    f.add_argument("--domain", action="append", default=[], metavar="KIND:SIZE:MTBF",
                   help="with --nodes: a failure domain taking SIZE nodes at once, one instance "
                   "every MTBF, e.g. rack:32:3000d (repeatable; kind rack or switch)")
    f.add_argument("--system", type=int, help="the LANL system of --failure-log lanl, e.g. 18")
    f.add_argument("--log-once", action="store_true", help="play the failure log once from time 0, "
                   "as written (no cycling, no random start; a real run killed at those times)")
    r = p.add_argument_group("run")
    r.add_argument("--strategies", help=f"comma list from {','.join(STRATEGIES)}")
    r.add_argument("--seeds", type=int, default=10)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--protocol", choices=PROTOCOLS, help="rollback strategies' cadence: matched "
                   "(the paper's matched freshness, default with a trace) or native (each as its "
                   "authors designed it)")
    r.add_argument("--interval", help="override: every rollback strategy every N steps (or young, daly)")
    r.add_argument("--stale-cost", metavar="PHI", help="the stale cost factor phi: the share of "
                   "stale_s (training whose updates stale layers discarded) counted as lost, the "
                   "rest as useful; 0: the paper's accounting, 1: every stale update lost "
                   "(default: the cost model's, with its interval)")
    r.add_argument("--stale-as-useful", action="store_true", help="the paper's accounting: "
                   "the alias of --stale-cost 0")
    r.add_argument("--engine", choices=ENGINES, default="fast", help="fast (default) or simpy "
                   "(every step an event: the model to read and extend; slower)")
    r.add_argument("--window", default="30d", help="wall-clock window per run (default 30d)")
    c = p.add_argument_group("costs (default: the trace's costs.json; presets: paper-a100)")
    c.add_argument("--costs", help=f"a cost model: {', '.join(COST_MODELS)}, or a costs.json file "
                   "(or a trace folder holding one)")
    c.add_argument("--restart", help="restart time before loading, e.g. 30s")
    for name, (_, text) in COST_FLAGS.items():
        c.add_argument("--" + name.replace("_", "-"), type=float, help=text)
    c.add_argument("--cost", action="append", default=[], metavar="FIGURE=VALUE",
                   help=f"set one cost figure (repeatable): {', '.join(FIGURES)}")


def _grid_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the lanes run (sim/grid.py; the same numbers wherever)")
    g.add_argument("--workers", type=int, help="local processes (default: every CPU, for grids "
                   "large enough to gain)")
    g.add_argument("--scheduler", help=f"a Dask scheduler's address, tcp://HOST:8786 (or "
                   f"{SCHEDULER_ENV}): its workers run the lanes (needs dask[distributed])")


def _parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="python -m sim", description="LayerCheck failure simulator (docs/sim.md)")
    sub = top.add_subparsers(dest="command", parser_class=OneLineParser)
    run = sub.add_parser("run", help="one MTBF: a table, --json or --csv (the default command)")
    run.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    out = run.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    _scenario_args(run)
    _grid_args(run)
    sw = sub.add_parser("sweep", help="effective ratio against MTBF: CSV, JSON, HTML figure")
    sw.add_argument("--mtbf", default="0.01h..3h", help="LOW..HIGH, e.g. 0.01h..3h")
    sw.add_argument("--points", type=int, default=20, help="MTBF points, log-spaced")
    sw.add_argument("--out", default="runs/sweep", help="output folder")
    _scenario_args(sw)
    _grid_args(sw)
    tu = sub.add_parser("tune", help="the LayerCheck setting with the best effective ratio "
                        "within your budgets, and the LayerCheckConfig line to paste")
    tu.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    b = tu.add_argument_group("budgets (each optional; an infeasible one is named)")
    b.add_argument("--max-gb", type=float, help="GB written over the run, base checkpoint included")
    b.add_argument("--max-staleness", type=float, help="no layer older than this many steps")
    b.add_argument("--max-write-share", type=float, help="share of the storage's write bandwidth "
                   "(the trace's costs.json, else the capture's measured one), e.g. 0.05")
    tu.add_argument("--json", action="store_true")
    _scenario_args(tu)
    se = sub.add_parser("sensitivity", help="every figure not measured here varied across its "
                        "band: each strategy's ratio range, and the figures that change the leader")
    se.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    se.add_argument("--figures", help="comma list of cost figures to vary (default: every one "
                    "with a band)")
    se.add_argument("--json", action="store_true")
    _scenario_args(se)
    se.set_defaults(seeds=None, window=None)
    pa = sub.add_parser("paper", help="the paper's MTBF figure (Qwen2.5-7B at 0.5 h) beside ours "
                        "under each protocol and accounting, with the arithmetic of both")
    pa.add_argument("--mtbf", default="0.5h", help="mean time between failures (default 0.5h, "
                    "the paper's; its values exist only there)")
    pa.add_argument("--seeds", type=int, default=10)
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--window", default="30d", help="wall-clock window per run (default 30d)")
    pa.add_argument("--json", action="store_true")
    fi = sub.add_parser("fit-failures", help="a failure record's per-node rate, Weibull shape "
                        "(with 95%% intervals), co-failures and goodness of fit")
    fi.add_argument("record", help="lanl or philly (shipped: sim/data/failures/) or a file: "
                    "LANL's release, Philly's interruptions, or a CSV of node and time columns")
    fi.add_argument("--system", type=int, help="LANL: the system, e.g. 18")
    fi.add_argument("--cofailure-window", default="0s", help="failures this close count as "
                    "together (default 0s: the same recorded instant)")
    fi.add_argument("--json", action="store_true")
    scalecli.add_parser(sub)
    pr = sub.add_parser("presets", help="list presets; --write regenerates their traces")
    pr.add_argument("--write", action="store_true")
    pr.add_argument("--seed", type=int, default=0)
    return top


def _costs(args, base: CostModel) -> CostModel:
    """``base`` with the command line's cost overrides (marked given)."""
    changes: dict[str, float] = {}
    for flag, (figures, _) in COST_FLAGS.items():
        if getattr(args, flag) is not None:
            changes.update(dict.fromkeys(figures, getattr(args, flag)))
    if args.restart is not None:
        changes["restart_s"] = parse_duration(args.restart, what="--restart", allow_zero=True)
    for item in args.cost:
        name, _, value = item.partition("=")
        if name.strip() not in FIGURES or not value:
            raise SimError(f"--cost {item!r}: give FIGURE=VALUE with a figure from {', '.join(FIGURES)}")
        try:
            changes[name.strip()] = float(value)
        except ValueError:
            raise SimError(f"--cost {item!r}: {value!r} is not a number") from None
    return base.with_overrides(**changes) if changes else base


def _failure_model(args) -> FailureModel | NodeFailures:
    kind = args.failures or ("log" if args.failure_log else "exponential")
    if args.nodes is not None:
        return _node_failures(args, kind)
    for flag, given in (("--node-mtbf", args.node_mtbf), ("--domain", args.domain),
                        ("--system", args.system is not None)):
        if given:
            raise SimError(f"{flag} describes a job's nodes: give --nodes N too")
    if kind == "log":
        if not args.failure_log:
            raise SimError("--failures log needs --failure-log FILE.csv")
        return FailureModel(kind="log", log_times=read_failure_log(args.failure_log),
                            repeat=not args.log_once)
    return FailureModel(kind=kind, shape=args.shape if kind == "weibull" else 1.0)


def _node_failures(args, kind: str) -> NodeFailures:
    """--nodes N: each node by --node-mtbf and the law, or a record replayed."""
    from .records import InterruptionRecord, read_record
    if args.log_once:
        raise SimError("--log-once plays a job's log as written; a record of nodes replays "
                       "from a random start each seed: drop --log-once")
    domains = tuple(Domain.parse(text) for text in args.domain)
    if kind == "log":
        if not args.failure_log:
            raise SimError("--failures log with --nodes needs --failure-log RECORD (lanl "
                           "--system 18, or a CSV of node and time columns)")
        if args.node_mtbf is not None:
            raise SimError("a record fails at its own rate: drop --node-mtbf (or the record)")
        record = read_record(args.failure_log, system=args.system)
        if isinstance(record, InterruptionRecord):
            raise SimError(f"{record.name} are jobs' interruptions, not nodes' failures (it does "
                           "not say which machine failed): fit it with `python -m sim "
                           "fit-failures philly`, or replay lanl --system N")
        return NodeFailures(nodes=args.nodes, node_law=record, domains=domains)
    if args.failure_log or args.system is not None:
        raise SimError(f"--failures {kind} draws the nodes' failures: drop --failure-log and "
                       "--system, or replay them with --failures log")
    if args.node_mtbf is None:
        raise SimError("--nodes N needs --node-mtbf X (one node's MTBF, e.g. 6350h) or a "
                       "record (--failure-log lanl --system 18)")
    return NodeFailures(nodes=args.nodes, node_law=FailureModel(
        kind=kind, shape=args.shape if kind == "weibull" else 1.0),
        node_mtbf_s=parse_duration(args.node_mtbf, what="--node-mtbf"), domains=domains)


def _stale_cost(args) -> float | None:
    """--stale-cost as a number, --stale-as-useful as 0, else None (the cost model's)."""
    if args.stale_as_useful and args.stale_cost is not None:
        raise SimError("--stale-as-useful is --stale-cost 0: give one of them")
    if args.stale_as_useful:
        return 0.0
    if args.stale_cost is None:
        return None
    try:
        phi = float(args.stale_cost)
    except ValueError:
        phi = math.nan
    if not math.isfinite(phi):
        raise SimError(f"--stale-cost {args.stale_cost!r}: give a number, e.g. 0.5 (0: the "
                       "paper's accounting, 1: every stale update lost)")
    return phi


def _scenario(args) -> Scenario:
    common = {"failures": _failure_model(args), "seed": args.seed,
              "window_s": parse_duration(args.window, what="--window"),
              "stale_cost": _stale_cost(args)}
    if args.interval is not None:
        common["interval"] = args.interval
    if args.protocol is not None:
        common["protocol"] = args.protocol
    named = CostModel.named(args.costs) if args.costs else None
    if sum(x is not None for x in (args.preset, args.trace, args.iteration_time)) > 1:
        raise SimError("give one of --preset, --trace, --iteration-time")
    if args.costs and named.name != "paper-a100":
        _warn_age(read_calibration(args.costs), args.costs)
    if args.trace:
        try:
            trace = read_trace(args.trace)
        except TraceError as exc:
            raise SimError(f"--trace: {exc}") from None
        if named is None and trace.costs is not None:
            _warn_age(trace.costs, args.trace)
        scenario = Scenario.from_trace(trace, costs=named, **common)
    elif args.iteration_time:
        cost = parse_duration(args.checkpoint_cost, what="--checkpoint-cost") \
            if args.checkpoint_cost else None
        scenario = Scenario.custom(iteration_s=parse_duration(args.iteration_time, what="--iteration-time"),
                                   iterations=args.iterations, checkpoint_gb=args.checkpoint_gb,
                                   checkpoint_s=cost, costs=named, **common)
    else:
        extra = {"costs": named} if named else {}
        scenario = Scenario.from_preset(args.preset or DEFAULT_PRESET, **common, **extra)
    return dataclasses.replace(scenario, costs=_costs(args, scenario.costs))


def _warn_age(calibration, where: str) -> None:
    """One line on stderr when the calibration's figures predate the installed mechanisms."""
    folder = where if Path(where).is_dir() else str(Path(where).parent)
    line = age_warning(calibration.code, calibration.figures, folder.rstrip("/"))
    if line:
        print(line, file=sys.stderr)


def _mtbf(args, value: str | None) -> float | None:
    """--mtbf, else --gpu-mtbf / --gpus, else the regime's; None for a failure log or a job
    of nodes (their own rate)."""
    if args.nodes is not None:
        given = [f for f, v in (("--mtbf", value), ("--gpus", args.gpus), ("--gpu-mtbf", args.gpu_mtbf),
                                ("--regime", args.regime)) if v is not None]
        if given:
            raise SimError(f"--nodes sets the job's failures from its nodes: drop {', '.join(given)} "
                           "(or drop --nodes for a job-level MTBF)")
        return None
    if value is not None:
        return parse_duration(value, what="--mtbf")
    regime = REGIMES.get(args.regime) if args.regime else None
    if args.gpu_mtbf is not None or regime:
        gpu = parse_duration(args.gpu_mtbf, what="--gpu-mtbf") if args.gpu_mtbf else regime.gpu_mtbf_s
        gpus = args.gpus if args.gpus is not None else (regime.gpus if regime else None)
        if gpus is None:
            raise SimError("--gpu-mtbf needs --gpus N (GPUs in the job)")
        return job_mtbf(gpu, gpus)
    if args.failure_log:
        return None
    raise SimError("give --mtbf (e.g. 0.5h), --gpus N --gpu-mtbf X, or --regime")


def _strategies(args):
    return args.strategies.split(",") if args.strategies else None


def _cmd_run(args) -> None:
    from .report import header, ranking_note, table, to_csv, to_json
    scenario = _scenario(args)
    mtbf = _mtbf(args, args.mtbf)
    df = simulate(scenario, mtbf_s=mtbf, strategies=_strategies(args), seeds=args.seeds,
                  engine=args.engine, workers=args.workers, scheduler=args.scheduler)
    info = {**scenario.to_dict(), "mtbf_s": mtbf, "seeds": args.seeds, "engine": args.engine}
    if args.json:
        print(to_json(df, info))
    elif args.csv:
        print(to_csv(df), end="")
    else:
        when = format_duration(mtbf) if mtbf is not None else \
            format_duration(scenario.failures.own_mtbf_s) + " (its nodes')" \
            if isinstance(scenario.failures, NodeFailures) else "log"
        print(header(scenario, mtbf=when, seeds=args.seeds))
        print(table(df))
        note = ranking_note(df, scenario.stale_figure())
        if note:
            print(note)


def _cmd_sweep(args) -> None:
    from .report import ranking_notes, to_csv, to_json
    if args.mtbf and ".." not in args.mtbf:
        raise SimError(f"--mtbf={args.mtbf!r}: a sweep takes LOW..HIGH, e.g. 0.01h..3h")
    low, high = parse_range(args.mtbf, what="--mtbf")
    if args.points < 2:
        raise SimError(f"--points={args.points} must be at least 2")
    scenario = _scenario(args)
    check_runs(args.points * args.seeds, seeds=args.seeds, points=args.points)
    out = output_folder(args.out)
    points = np.geomspace(low, high, args.points)
    df = sweep(scenario, mtbf_s=points, strategies=_strategies(args), seeds=args.seeds,
               engine=args.engine, workers=args.workers, scheduler=args.scheduler)
    info = {**scenario.to_dict(), "seeds": args.seeds, "mtbf_s": points.tolist(), "engine": args.engine}
    with writing(out):
        (out / "sweep.csv").write_text(to_csv(df, extra=("mtbf_s",)))
        (out / "sweep.json").write_text(to_json(df, info, extra=("mtbf_s",)) + "\n")
        figure(df, title=f"{scenario.name}: effective ratio vs MTBF").write_html(
            out / "sweep.html", include_plotlyjs="cdn")
    print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, {out / 'sweep.html'} "
          f"({len(points)} MTBFs x {df['strategy'].nunique()} strategies x {args.seeds} seeds)")
    for note in ranking_notes(df, scenario.stale_figure()):
        print(note)


def _cmd_presets(args) -> None:
    from .presets import PUBLISHED, preset_trace, trace_stats, write_presets
    if args.write:
        for folder in write_presets(seed=args.seed):
            print(f"wrote {folder}")
    for name in PRESET_NAMES:
        s, pub = trace_stats(preset_trace(name)), PUBLISHED[name]
        print(f"{name:<13} writes {s['layer_writes']} (paper {pub.layer_writes})  checkpoints "
              f"{s['checkpoints']} (paper {pub.checkpoints})  total {s['total_gb']:.0f} GB (paper "
              f"{pub.total_gb:.0f})  staleness avg {s['staleness']:.0f} max {s['max_staleness']}")


def _cmd_tune(args) -> None:
    import json

    from .tuning import Budgets, recommend
    if args.iteration_time:
        raise SimError("tune replays a trace's drift: give --trace traces/NAME or --preset, "
                       "not --iteration-time")
    budgets = Budgets(max_bytes=None if args.max_gb is None else args.max_gb * 1e9,
                      max_staleness=args.max_staleness, max_write_share=args.max_write_share)
    scenario = _scenario(args)
    trace = _tune_trace(args)
    mtbf = _mtbf(args, args.mtbf)
    if mtbf is None and isinstance(scenario.failures, NodeFailures):
        mtbf = scenario.failures.job_mtbf_s()
    if mtbf is None:
        raise SimError("tune needs --mtbf (a failure log has no single rate to tune for)")
    advice = recommend(trace, scenario, budgets, mtbf_s=mtbf, seeds=args.seeds)
    print(json.dumps(advice.to_dict(), indent=2, default=float) if args.json else advice.text())


def _cmd_sensitivity(args) -> None:
    import json

    from .sensitivity import SEEDS, WINDOW_S, sensitivity
    # a sensitivity run is 1 + 2 x figures runs: smaller defaults than python -m sim's
    seeds = SEEDS if args.seeds is None else args.seeds
    window = WINDOW_S if args.window is None else parse_duration(args.window, what="--window")
    args.window = f"{window}s"
    scenario = _scenario(args)
    figures = [f.strip() for f in args.figures.split(",")] if args.figures else None
    result = sensitivity(scenario, mtbf_s=_mtbf(args, args.mtbf), strategies=_strategies(args),
                         seeds=seeds, window_s=window, figures=figures)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text())


def _cmd_paper(args) -> None:
    import json

    from .paperfigure import paper_figure
    if isinstance(args.seeds, bool) or args.seeds < 1:
        raise SimError(f"--seeds {args.seeds}: give a whole number of runs >= 1 (default 10)")
    if args.seed < 0:
        raise SimError(f"--seed {args.seed}: give a non-negative integer (default 0)")
    result = paper_figure(mtbf_s=parse_duration(args.mtbf, what="--mtbf"), seeds=args.seeds,
                          window_s=parse_duration(args.window, what="--window"), seed=args.seed)
    print(json.dumps(result.to_dict(), indent=2, default=float) if args.json else result.text())


def _cmd_fit_failures(args) -> None:
    import json

    from .fitting import fit_record
    from .records import read_record
    window = parse_duration(args.cofailure_window, what="--cofailure-window", allow_zero=True)
    result = fit_record(read_record(args.record, system=args.system), window_s=window)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text())


def _tune_trace(args):
    from .presets import preset_trace
    if args.trace:
        return read_trace(args.trace)
    return preset_trace(args.preset or DEFAULT_PRESET)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    args = _parser().parse_args(argv)
    try:
        {"run": _cmd_run, "sweep": _cmd_sweep, "presets": _cmd_presets,
         "tune": _cmd_tune, "sensitivity": _cmd_sensitivity, "paper": _cmd_paper,
         "fit-failures": _cmd_fit_failures, "scale": scalecli.run}[args.command](args)
    except (SimError, TraceError) as exc:
        print(f"python -m sim: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0
