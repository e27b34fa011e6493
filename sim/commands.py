"""The work of each ``python -m sim`` command, run after ``sim.cli`` has checked its
arguments: build the scenario, simulate, print a table (100 columns; ``--wide``) with a
verdict line under it, or ``--json`` / ``--csv`` on stdout. Progress goes to stderr
(``sim.progress``). Bad input is a ``SimError``; ``sim.cli`` prints it as one line.
"""
from __future__ import annotations

import json
import time

import numpy as np

from . import scalecli
from .errors import SimError
from .nodes import NodeFailures
from .outputs import output_folder, writing
from .progress import Progress, shown
from .published import DEFAULT_PRESET, PRESET_NAMES
from .report import (RUN_TAIL, bill_table, figure, header, json_clean, leader_line, ranking_notes,
                     table, to_csv, to_json)
from .scenarioargs import FAIR, budgets_of, mtbf_of, prices_of, scenario_of
from .tables import WIDTH, Column, render
from .units import format_duration, parse_duration, parse_range
from .workbound import check_runs

__all__ = ["COMMAND_RUNS"]


def _strategies(args):
    return args.strategies.split(",") if args.strategies else None


def _width(args) -> int | None:
    return None if getattr(args, "wide", False) else WIDTH


def _progress(args, unit: str = "run") -> Progress:
    return Progress(f"python -m sim {args.command}", enabled=shown(getattr(args, "progress", None)),
                    unit=unit)


def run(args) -> None:
    from .api import simulate
    from .fair import compare, fixed
    from .verdict import judge
    start = time.perf_counter()
    scenario = scenario_of(args)
    mtbf = mtbf_of(args, args.mtbf)
    budgets, prices = budgets_of(args), prices_of(args)
    with _progress(args, unit="stage") as bar:
        bar.stage("searching each strategy's settings", 0, 2)
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
        if args.engine == "simpy":      # the same model event by event: its table, the verdict's runs
            ref = simulate(scenario, mtbf_s=mtbf, strategies=list(df["strategy"]), seeds=args.seeds,
                           engine="simpy")
            df = df.copy()
            for column in ref.columns:
                df[column] = ref[column].to_numpy()
        bar.stage("checking the verdict (phi, bands, fresh seeds)", 1, 2)
        verdict = judge(result, bands=not args.no_bands)
        bar(2, 2)
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
        print(table(df, width=_width(args)))
        print(verdict.text())
        print()
        print(bill_table(df, width=_width(args)))
        rated = sum(result.to_dict()["settings_rated"].values()) + sum(result.screened.values())
        print(f"({rated} settings simulated, {seconds:.1f} s)")


def sweep(args) -> None:
    from .api import sweep as run_sweep
    low, high = parse_range(args.mtbf, what="--mtbf")
    scenario = scenario_of(args)
    check_runs(args.points * args.seeds, seeds=args.seeds, points=args.points)
    out = output_folder(args.out)
    points = np.geomspace(low, high, args.points)
    df = run_sweep(scenario, mtbf_s=points, strategies=_strategies(args), seeds=args.seeds,
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


def presets(args) -> None:
    from .presets import PUBLISHED, preset_trace, trace_stats, write_presets
    if args.write:
        for folder in write_presets(seed=args.seed):
            print(f"wrote {folder}")
    rows = []
    for name in PRESET_NAMES:
        s, pub = trace_stats(preset_trace(name)), PUBLISHED[name]
        rows.append([name, str(s["layer_writes"]), str(pub.layer_writes), str(s["checkpoints"]),
                     str(pub.checkpoints), f"{s['total_gb']:.0f}", f"{pub.total_gb:.0f}",
                     f"{s['staleness']:.0f}", str(s["max_staleness"])])
    print("each preset's synthetic trace (the writes it records) beside the paper's figures")
    print(render([Column("preset", 13, left=True), Column("writes", 6), Column("paper", 6),
                  Column("checkpoints", 11), Column("paper", 6), Column("total GB", 8),
                  Column("paper", 6), Column("mean stale", 10), Column("max stale", 9)], rows,
                 width=_width(args)))


def tune(args) -> None:
    from layercheck.contract.trace import read_trace

    from .presets import preset_trace
    from .tuning import recommend
    if args.iteration_time:
        raise SimError("tune replays a trace's drift: give --trace traces/NAME or --preset, "
                       "not --iteration-time")
    budgets = budgets_of(args)
    scenario = scenario_of(args)
    trace = read_trace(args.trace) if args.trace else preset_trace(args.preset or DEFAULT_PRESET)
    mtbf = mtbf_of(args, args.mtbf)
    if mtbf is None and isinstance(scenario.failures, NodeFailures):
        mtbf = scenario.failures.job_mtbf_s()
    if mtbf is None:
        raise SimError("tune needs --mtbf (a failure log has no single rate to tune for)")
    with _progress(args, unit="stage") as bar:
        advice = recommend(trace, scenario, budgets, mtbf_s=mtbf, seeds=args.seeds,
                           baselines=not args.no_baselines, progress=bar.stage)
    print(json.dumps(advice.to_dict(), indent=2, default=float) if args.json else advice.text())


def sensitivity(args) -> None:
    from .sensitivity import SEEDS, WINDOW_S, sensitivity as vary
    # a sensitivity run is 1 + 2 x figures runs: smaller defaults than python -m sim's
    seeds = SEEDS if args.seeds is None else args.seeds
    window = WINDOW_S if args.window is None else parse_duration(args.window, what="--window")
    args.window = f"{window}s"
    scenario = scenario_of(args)
    figures = [f.strip() for f in args.figures.split(",")] if args.figures else None
    with _progress(args) as bar:
        result = vary(scenario, mtbf_s=mtbf_of(args, args.mtbf), strategies=_strategies(args),
                      seeds=seeds, window_s=window, figures=figures, progress=bar)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif args.csv:
        print(result.frame().to_csv(index=False), end="")
    else:
        print(result.text(width=_width(args)))


def frontier(args) -> None:
    from .bytefront import best_by_budget, budget_text, front_table, front_text
    from .fair import compare
    if args.protocol is not None:
        raise SimError("the frontier is every strategy's settings searched (the fair protocol): "
                       "drop --protocol")
    scenario = scenario_of(args)
    mtbf = mtbf_of(args, args.mtbf)
    with _progress(args, unit="stage") as bar:
        bar.stage("searching each strategy's settings", 0, 1)
        result = compare(scenario, mtbf_s=mtbf, budgets=budgets_of(args),
                         strategies=_strategies(args), seeds=args.seeds, front=True)
        bar(1, 1)
    front, ranges = front_table(result), best_by_budget(result)
    if args.json:
        print(json.dumps(json_clean({
            "front": front.to_dict("records"), "best_by_budget": ranges,
            "scenario": {**scenario.to_dict(), "mtbf_s": mtbf, "seeds": args.seeds,
                         "budgets": result.budgets.to_dict()}}), indent=2, default=str,
            allow_nan=False))
    elif args.csv:
        print(front.to_csv(index=False), end="")
    else:
        print(f"{scenario.name}: MTBF {format_duration(mtbf)}, {args.seeds} seeds, phi "
              f"{scenario.stale_figure().value:.3g}; each strategy's front of effective ratio "
              "against durable bytes over one job")
        print(front_text(front, width=_width(args)))
        best = front[front["front"]].groupby("strategy")["effective_ratio"].max()
        print(leader_line(best.to_dict(), what="the highest ratio on its front"))
        print()
        print("best under a budget of durable bytes a job:")
        print(budget_text(ranges))


def paper(args) -> None:
    from .paperfigure import paper_figure
    with _progress(args) as bar:
        result = paper_figure(mtbf_s=parse_duration(args.mtbf, what="--mtbf"), seeds=args.seeds,
                              window_s=parse_duration(args.window, what="--window"),
                              seed=args.seed, progress=bar)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=float))
    elif args.csv:
        print(result.frame().to_csv(index=False), end="")
    else:
        print(result.text(width=_width(args)))


def fit_failures(args) -> None:
    from .fitting import fit_record
    from .records import read_record
    window = parse_duration(args.cofailure_window, what="--cofailure-window", allow_zero=True)
    result = fit_record(read_record(args.record, system=args.system), window_s=window)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text(width=_width(args)))


COMMAND_RUNS = {"run": run, "sweep": sweep, "presets": presets, "tune": tune,
                "sensitivity": sensitivity, "paper": paper, "frontier": frontier,
                "fit-failures": fit_failures, "scale": scalecli.run}
