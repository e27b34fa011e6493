"""The simulator's command line, ``python -m sim``. Bad input is one line on stderr and exit 2.

    python -m sim --mtbf 0.5h                      table for the default preset
    python -m sim --mtbf 30m --json | --csv
    python -m sim --trace traces/NAME --mtbf 1h    the trace's own costs.json
    python -m sim sweep --mtbf 0.01h..3h --points 20 --out runs/sweep
                       [--workers N] [--scheduler tcp://HOST:8786]   where the lanes run
    python -m sim presets [--write]
    python -m sim tune --trace traces/NAME --mtbf 0.5h [--max-gb 500] [--max-staleness 100]
                       [--max-write-share 0.05] [--json]     the best LayerCheck setting
    python -m sim sensitivity --mtbf 0.5h [--figures a,b] [--json]  what the ranking hangs on
    python -m sim frontier --mtbf 0.5h [--max-host-gb 400] [--json | --csv]
                       each strategy's ratio against durable bytes; the best under each budget
    python -m sim paper [--mtbf 0.5h] [--seeds 10] [--json]      the paper's own figure beside ours
    python -m sim --nodes 2048 --node-mtbf 6350h --failures weibull --shape 0.7
                  [--domain rack:32:3000d]                  a job of N nodes (sim.nodes)
    python -m sim --nodes 1024 --failure-log lanl --system 18   a node record replayed
    python -m sim fit-failures lanl --system 18 [--json]   per-node law fitted to a record
    python -m sim scale --gpus 8..16384 [--json | --csv]  the ratio against job size (sim.scalecli)

The flags every command shares and the scenario built from them: ``sim.scenarioargs``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from layercheck.contract.errors import OneLineParser, one_line, stdout_gone
from layercheck.contract.trace import TraceError, read_trace

from . import scalecli
from .api import simulate, sweep
from .errors import SimError
from .grid import SCHEDULER_ENV
from .nodes import NodeFailures
from .outputs import output_folder, writing
from .presets import DEFAULT_PRESET, PRESET_NAMES
from .report import figure
from .scenarioargs import (FAIR, add_budget_args, add_price_args, add_scenario_args, budgets_of,
                           mtbf_of, prices_of, scenario_of)
from .units import DURATION_RANGE, format_duration, parse_duration, parse_range
from .workbound import check_runs

__all__ = ["main"]

COMMANDS = ("run", "sweep", "presets", "tune", "sensitivity", "frontier", "paper", "fit-failures",
            "scale")
RANGES = (f"Every duration (an MTBF, a window, a step, a failure log's time) lies from "
          f"{DURATION_RANGE}, or is 0 where 0 means none; every other number's range, and why: "
          "docs/sim.md, Ranges of the command line's numbers.")


def _grid_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the lanes run (sim/grid.py; the same numbers wherever)")
    g.add_argument("--workers", type=int, help="local processes (default: every CPU, for grids "
                   "large enough to gain)")
    g.add_argument("--scheduler", help=f"a Dask scheduler's address, tcp://HOST:8786 (or "
                   f"{SCHEDULER_ENV}): its workers run the lanes (needs dask[distributed])")


def _parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="python -m sim", description="LayerCheck failure simulator (docs/sim.md)")
    sub = top.add_subparsers(dest="command", parser_class=OneLineParser)
    run = sub.add_parser("run", help="one MTBF: every strategy at its best setting within the "
                         "budgets, the verdict and the bill; a table, --json or --csv (the "
                         "default command)")
    run.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    out = run.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    run.add_argument("--no-bands", action="store_true", help="skip the verdict's check of every "
                     "cost figure's band (phi's interval and fresh seeds are still checked)")
    add_scenario_args(run, fair=True)
    add_budget_args(run)
    add_price_args(run)
    _grid_args(run)
    sw = sub.add_parser("sweep", help="effective ratio against MTBF: CSV, JSON, HTML figure")
    sw.add_argument("--mtbf", default="0.01h..3h", help="LOW..HIGH, e.g. 0.01h..3h")
    sw.add_argument("--points", type=int, default=20, help="MTBF points, log-spaced")
    sw.add_argument("--out", default="runs/sweep", help="output folder")
    add_scenario_args(sw)
    _grid_args(sw)
    tu = sub.add_parser("tune", help="the LayerCheck setting with the best effective ratio "
                        "within your budgets, and the LayerCheckConfig line to paste")
    tu.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    add_budget_args(tu, staleness=True)
    tu.add_argument("--no-baselines", action="store_true", help="skip the best baseline within "
                    "the same budgets (each at its own best setting, on the same failures)")
    tu.add_argument("--json", action="store_true")
    add_scenario_args(tu)
    se = sub.add_parser("sensitivity", help="every figure not measured here varied across its "
                        "band: each strategy's ratio range, and the figures that change the leader")
    se.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    se.add_argument("--figures", help="comma list of cost figures to vary (default: every one "
                    "with a band)")
    se.add_argument("--json", action="store_true")
    add_scenario_args(se)
    se.set_defaults(seeds=None, window=None)
    fr = sub.add_parser("frontier", help="effective ratio against durable bytes: each "
                        "strategy's front and which strategy is best under each bytes budget")
    fr.add_argument("--mtbf", help="mean time between failures of the job, e.g. 0.5h")
    out = fr.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    add_scenario_args(fr)
    add_budget_args(fr)
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
    for command in sub.choices.values():
        command.epilog = RANGES
    return top


def _strategies(args):
    return args.strategies.split(",") if args.strategies else None


def _cmd_run(args) -> None:
    import time

    from .fair import compare, fixed
    from .report import RUN_TAIL, bill_table, header, table, to_csv, to_json
    from .verdict import judge
    start = time.perf_counter()
    scenario = scenario_of(args)
    mtbf = mtbf_of(args, args.mtbf)
    budgets, prices = budgets_of(args), prices_of(args)
    if args.protocol == FAIR:
        if args.engine != "fast":
            raise SimError("the fair comparison searches on the fast engine: drop --engine "
                           "simpy, or give --protocol matched or native")
        result = compare(scenario, mtbf_s=mtbf, budgets=budgets, strategies=_strategies(args),
                         seeds=args.seeds, workers=args.workers, scheduler=args.scheduler)
    else:
        if budgets.any():
            raise SimError(f"budgets ({budgets.text()}) choose settings: they apply to the fair "
                           "protocol (the default), not to a fixed one; drop them or --protocol")
        result = fixed(scenario, mtbf_s=mtbf, strategies=_strategies(args), seeds=args.seeds,
                       workers=args.workers, scheduler=args.scheduler)
    df = result.bills(prices)
    if args.engine == "simpy":          # the same model event by event: its table, the verdict's runs
        df = _simpy_table(scenario, mtbf, args, df)
    verdict = judge(result, bands=not args.no_bands)
    seconds = time.perf_counter() - start
    protocol = FAIR if args.protocol == FAIR else scenario.protocol
    info = {**scenario.to_dict(), "protocol": protocol, "mtbf_s": mtbf, "seeds": args.seeds,
            "engine": args.engine, "budgets": budgets.to_dict(), "prices": prices.sources(),
            "search": result.to_dict()}
    if args.json:
        print(to_json(df, info, tail=RUN_TAIL, verdict=verdict.to_dict(), seconds=seconds))
    elif args.csv:
        print(to_csv(df, tail=RUN_TAIL), end="")
    else:
        when = format_duration(mtbf) if mtbf is not None else \
            format_duration(scenario.failures.own_mtbf_s) + " (its nodes')" \
            if isinstance(scenario.failures, NodeFailures) else "log"
        print(header(scenario, mtbf=when, seeds=args.seeds, protocol=protocol, budgets=budgets,
                     prices=prices))
        print(table(df))
        print(verdict.text())
        print()
        print(bill_table(df))
        rated = sum(result.to_dict()["settings_rated"].values()) + sum(result.screened.values())
        print(f"({rated} settings simulated, {seconds:.1f} s)")


def _simpy_table(scenario, mtbf, args, df):
    """``df`` with its result columns from the SimPy reference (the same model, event by
    event), its setting and bill kept."""
    ref = simulate(scenario, mtbf_s=mtbf, strategies=list(df["strategy"]), seeds=args.seeds,
                   engine="simpy")
    out = df.copy()
    for column in ref.columns:
        out[column] = ref[column].to_numpy()
    return out


def _cmd_sweep(args) -> None:
    from .report import ranking_notes, to_csv, to_json
    if args.mtbf and ".." not in args.mtbf:
        raise SimError(f"--mtbf={args.mtbf!r}: a sweep takes LOW..HIGH, e.g. 0.01h..3h")
    low, high = parse_range(args.mtbf, what="--mtbf")
    if args.points < 2:
        raise SimError(f"--points={args.points} must be at least 2")
    scenario = scenario_of(args)
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

    from .tuning import recommend
    if args.iteration_time:
        raise SimError("tune replays a trace's drift: give --trace traces/NAME or --preset, "
                       "not --iteration-time")
    budgets = budgets_of(args)
    scenario = scenario_of(args)
    trace = _tune_trace(args)
    mtbf = mtbf_of(args, args.mtbf)
    if mtbf is None and isinstance(scenario.failures, NodeFailures):
        mtbf = scenario.failures.job_mtbf_s()
    if mtbf is None:
        raise SimError("tune needs --mtbf (a failure log has no single rate to tune for)")
    advice = recommend(trace, scenario, budgets, mtbf_s=mtbf, seeds=args.seeds,
                       baselines=not args.no_baselines)
    print(json.dumps(advice.to_dict(), indent=2, default=float) if args.json else advice.text())


def _cmd_sensitivity(args) -> None:
    import json

    from .sensitivity import SEEDS, WINDOW_S, sensitivity
    # a sensitivity run is 1 + 2 x figures runs: smaller defaults than python -m sim's
    seeds = SEEDS if args.seeds is None else args.seeds
    window = WINDOW_S if args.window is None else parse_duration(args.window, what="--window")
    args.window = f"{window}s"
    scenario = scenario_of(args)
    figures = [f.strip() for f in args.figures.split(",")] if args.figures else None
    result = sensitivity(scenario, mtbf_s=mtbf_of(args, args.mtbf), strategies=_strategies(args),
                         seeds=seeds, window_s=window, figures=figures)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text())


def _cmd_frontier(args) -> None:
    import json

    from .bytefront import best_by_budget, budget_text, front_table, front_text
    from .fair import compare
    from .report import json_clean
    if args.protocol is not None:
        raise SimError("the frontier is every strategy's settings searched (the fair protocol): "
                       "drop --protocol")
    scenario = scenario_of(args)
    mtbf = mtbf_of(args, args.mtbf)
    result = compare(scenario, mtbf_s=mtbf, budgets=budgets_of(args), strategies=_strategies(args),
                     seeds=args.seeds, front=True)
    table, ranges = front_table(result), best_by_budget(result)
    if args.json:
        print(json.dumps(json_clean({
            "front": table.to_dict("records"), "best_by_budget": ranges,
            "scenario": {**scenario.to_dict(), "mtbf_s": mtbf, "seeds": args.seeds,
                         "budgets": result.budgets.to_dict()}}), indent=2, default=str,
            allow_nan=False))
    elif args.csv:
        print(table.to_csv(index=False), end="")
    else:
        print(f"{scenario.name}: MTBF {format_duration(mtbf)}, {args.seeds} seeds, phi "
              f"{scenario.stale_figure().value:g}; each strategy's front of effective ratio "
              "against durable bytes over one job")
        print(front_text(table))
        print()
        print("best under a budget of durable bytes a job:")
        print(budget_text(ranges))


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
         "frontier": _cmd_frontier,
         "fit-failures": _cmd_fit_failures, "scale": scalecli.run}[args.command](args)
    except (SimError, TraceError) as exc:
        print(f"python -m sim: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError as exc:  # `python -m sim ... | head -1`: stop quietly
        if not stdout_gone(exc):
            raise
    return 0
