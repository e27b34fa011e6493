"""The simulator's command line, ``python -m sim``. Bad input is one line on stderr and exit 2.

    python -m sim --mtbf 0.5h                      table for the default preset
    python -m sim --mtbf 30m --json | --csv
    python -m sim --trace traces/NAME --mtbf 1h    the trace's own costs.json
    python -m sim sweep --mtbf 0.01h..3h --points 20 --out runs/sweep
                       [--workers N] [--scheduler tcp://HOST:8786]   where the lanes run
    python -m sim presets [--write]
    python -m sim tune --trace traces/NAME --mtbf 0.5h [--max-gb 500] [--max-staleness 100]
                       [--max-write-share 0.05] [--json]     the best LayerCheck setting
    python -m sim sensitivity --mtbf 0.5h [--figures a,b] [--json | --csv]  what the ranking hangs on
    python -m sim frontier --mtbf 0.5h [--max-host-gb 400] [--json | --csv]
                       each strategy's ratio against durable bytes; the best under each budget
    python -m sim paper [--mtbf 0.5h] [--seeds 10] [--json | --csv]  the paper's figure beside ours
    python -m sim --nodes 2048 --node-mtbf 6350h --failures weibull --shape 0.7
                  [--domain rack:32:3000d]                  a job of N nodes (sim.nodes)
    python -m sim --nodes 1024 --failure-log lanl --system 18   a node record replayed
    python -m sim fit-failures lanl --system 18 [--json]   per-node law fitted to a record
    python -m sim scale --gpus 8..16384 [--json | --csv]  the ratio against job size (sim.scalecli)

This module declares the commands and checks their arguments before anything heavy
is imported (numpy's arrays, pandas, scipy: a bad flag answers at once); each
command's work is in ``sim.commands``. The flags every command shares and the
scenario built from them: ``sim.scenarioargs``. Tables fit 100 columns (``--wide``:
one line a row); a bar on stderr shows the progress of the long commands
(``sim.progress``).
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from typing import Sequence

from layercheck.contract.errors import OneLineParser, one_line, stdout_gone

from . import scalecli
from .errors import SimError
from .scenarioargs import add_budget_args, add_price_args, add_scenario_args
from .scheduler import SCHEDULER_ENV
from .units import DURATION_RANGE, parse_duration, parse_range

__all__ = ["main", "COMMANDS", "PROG"]

PROG = "python -m sim"
COMMANDS = ("run", "sweep", "presets", "tune", "sensitivity", "frontier", "paper", "fit-failures",
            "scale")
RANGES = (f"Every duration (an MTBF, a window, a step, a failure log's time) lies from "
          f"{DURATION_RANGE}, or is 0 where 0 means none; every other number's range, and why: "
          "docs/sim.md, Ranges of the command line's numbers.")
EXAMPLES = {
    "run": ["python -m sim --mtbf 0.5h", "python -m sim --mtbf 30m --csv > run.csv",
            "python -m sim --trace traces/NAME --mtbf 1h --max-gb 500",
            "python -m sim --gpus 16384 --gpu-mtbf 50000h --protocol matched"],
    "sweep": ["python -m sim sweep --mtbf 0.01h..3h --points 20 --out runs/sweep"],
    "presets": ["python -m sim presets", "python -m sim presets --write"],
    "tune": ["python -m sim tune --mtbf 0.5h",
             "python -m sim tune --trace traces/NAME --mtbf 1h --max-gb 500 --max-staleness 100"],
    "sensitivity": ["python -m sim sensitivity --mtbf 0.5h",
                    "python -m sim sensitivity --mtbf 1h --figures persist_gbps,peer_gbps --csv"],
    "frontier": ["python -m sim frontier --mtbf 0.5h",
                 "python -m sim frontier --mtbf 0.5h --max-host-gb 400 --json"],
    "paper": ["python -m sim paper", "python -m sim paper --seeds 3 --csv > paper.csv"],
    "fit-failures": ["python -m sim fit-failures lanl --system 18",
                     "python -m sim fit-failures philly --json"],
    "scale": ["python -m sim scale --gpus 8..16384",
              "python -m sim scale --gpus 16384 --iteration-time 6s --checkpoint-gb 5670 --window 54d"],
}
MTBF_HELP = "mean time between failures of the job, e.g. 0.5h (units ms, s, m, h, d)"


def _grid_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the lanes run (sim/grid.py; the same numbers wherever)")
    g.add_argument("--workers", type=int, help="local processes (default: every CPU, for grids "
                   "large enough to gain)")
    g.add_argument("--scheduler", help=f"a Dask scheduler's address, tcp://HOST:8786 (or "
                   f"{SCHEDULER_ENV}): its workers run the lanes (needs dask[distributed])")


def output_args(p: argparse.ArgumentParser, *, csv: bool = True, wide: bool = True,
                progress: bool = False) -> None:
    """--json, --csv (one of them), --wide and --progress, each with its help line."""
    g = p.add_argument_group("output (default: tables for a person, 100 columns wide)")
    out = g.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the result as JSON on stdout, "
                     "every figure and its source")
    if csv:
        out.add_argument("--csv", action="store_true", help="the rows as CSV on stdout")
    if wide:
        g.add_argument("--wide", action="store_true", help="tables one line a row, however "
                       "wide (default: blocks of columns that fit 100 columns)")
    if progress:
        g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="a progress bar on stderr (default: only where stderr is a terminal)")


def _subparser(sub, name: str, help: str) -> argparse.ArgumentParser:
    lines = "\n".join(f"  {e}" for e in EXAMPLES[name])
    return sub.add_parser(name, help=help, description=(help[:1].upper() + help[1:] + ".").replace("%%", "%"),
                          epilog=f"examples:\n{lines}\n\n{textwrap.fill(RANGES, 78)}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _parser() -> argparse.ArgumentParser:
    every = "\n".join(f"  {e}" for name in ("run", "tune", "sensitivity", "paper", "scale")
                      for e in EXAMPLES[name][:1])
    top = OneLineParser(prog=PROG, description="LayerCheck failure simulator (docs/sim.md). "
                        "Without a command: run.", epilog=f"examples:\n{every}\n\n"
                        f"python -m sim COMMAND --help: a command's flags and examples.",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", parser_class=OneLineParser, metavar="COMMAND")
    run = _subparser(sub, "run", "one MTBF: every strategy at its best setting within the "
                     "budgets, the verdict and the bill; a table, --json or --csv (the "
                     "default command)")
    run.add_argument("--mtbf", help=MTBF_HELP)
    run.add_argument("--no-bands", action="store_true", help="skip the verdict's check of every "
                     "cost figure's band (phi's interval and fresh seeds are still checked)")
    output_args(run, progress=True)
    add_scenario_args(run, fair=True)
    add_budget_args(run)
    add_price_args(run)
    _grid_args(run)
    sw = _subparser(sub, "sweep", "effective ratio against MTBF: CSV, JSON, HTML figure")
    sw.add_argument("--mtbf", default="0.01h..3h", help="LOW..HIGH, e.g. 0.01h..3h")
    sw.add_argument("--points", type=int, default=20, help="MTBF points, log-spaced (at least 2)")
    sw.add_argument("--out", default="runs/sweep", help="output folder")
    add_scenario_args(sw)
    _grid_args(sw)
    tu = _subparser(sub, "tune", "the LayerCheck setting with the best effective ratio "
                    "within your budgets, and the LayerCheckConfig line to paste")
    tu.add_argument("--mtbf", help=MTBF_HELP)
    add_budget_args(tu, staleness=True)
    tu.add_argument("--no-baselines", action="store_true", help="skip the best baseline within "
                    "the same budgets (each at its own best setting, on the same failures)")
    output_args(tu, csv=False, wide=False, progress=True)
    add_scenario_args(tu)
    se = _subparser(sub, "sensitivity", "every figure not measured here varied across its "
                    "band: each strategy's ratio range, and the figures that change the leader")
    se.add_argument("--mtbf", help=MTBF_HELP)
    se.add_argument("--figures", help="comma list of cost figures to vary (default: every one "
                    "with a band)")
    output_args(se, progress=True)
    add_scenario_args(se)
    se.set_defaults(seeds=None, window=None)
    fr = _subparser(sub, "frontier", "effective ratio against durable bytes: each "
                    "strategy's front and which strategy is best under each bytes budget")
    fr.add_argument("--mtbf", help=MTBF_HELP)
    output_args(fr, progress=True)
    add_scenario_args(fr)
    add_budget_args(fr)
    pa = _subparser(sub, "paper", "the paper's MTBF figure (Qwen2.5-7B at 0.5 h) beside ours "
                    "under each protocol and accounting, with the arithmetic of both")
    pa.add_argument("--mtbf", default="0.5h", help="mean time between failures (default 0.5h, "
                    "the paper's; its values exist only there)")
    pa.add_argument("--seeds", type=int, default=10, help="runs per strategy, each on its own "
                    "failures (default 10; the 95%% band needs 2 or more)")
    pa.add_argument("--seed", type=int, default=0, help="the first run's random seed (default "
                    "0; the same seed, the same failures)")
    pa.add_argument("--window", default="30d", help="wall-clock window per run (default 30d)")
    output_args(pa, progress=True)
    fi = _subparser(sub, "fit-failures", "a failure record's per-node rate, Weibull shape "
                    "(with 95%% intervals), co-failures and goodness of fit")
    fi.add_argument("record", help="lanl or philly (shipped: sim/data/failures/) or a file: "
                    "LANL's release, Philly's interruptions, or a CSV of node and time columns")
    fi.add_argument("--system", type=int, help="LANL: the system, e.g. 18")
    fi.add_argument("--cofailure-window", default="0s", help="failures this close count as "
                    "together (default 0s: the same recorded instant)")
    output_args(fi, csv=False)
    sc = _subparser(sub, "scale", "each strategy's ratio against job size, with the perfect "
                    "checkpointer, the 95%% band and where the time goes")
    scalecli.add_arguments(sc)
    output_args(sc, progress=False)
    pr = _subparser(sub, "presets", "list presets; --write regenerates their traces")
    pr.add_argument("--write", action="store_true", help="write traces/<preset>-synthetic/ "
                    "again (deterministic for --seed)")
    pr.add_argument("--seed", type=int, default=0, help="the drift's random seed (default 0)")
    pr.add_argument("--wide", action="store_true", help="the table one line a row, however wide "
                    "(default: blocks of columns that fit 100 columns)")
    return top


NEGATIVE = re.compile(r"^-(\d|\.\d)")
"""A value that reads as a negative number (``-1h``, ``-0.5``, ``-.5``): argparse takes
it for a flag unless it is joined to the flag before it."""


def _join_negatives(argv: list[str]) -> list[str]:
    """``--flag -1h`` as ``--flag=-1h``, so that a negative value reaches its own check (a
    message that names the range) rather than argparse's "expected one argument"."""
    out: list[str] = []
    for token in argv:
        if out and NEGATIVE.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


DURATIONS = (("mtbf", "--mtbf", False), ("window", "--window", False),
             ("gpu_mtbf", "--gpu-mtbf", False), ("node_mtbf", "--node-mtbf", False),
             ("iteration_time", "--iteration-time", False),
             ("checkpoint_cost", "--checkpoint-cost", False), ("restart", "--restart", True),
             ("hang_timeout", "--hang-timeout", False),
             ("comm_init_per_doubling", "--comm-init-per-doubling", True),
             ("cofailure_window", "--cofailure-window", True))


def check(args: argparse.Namespace) -> None:
    """The checks that need nothing heavy, run before any command imports its work: every
    duration, the counts of runs, what a command does not take. The same values are
    checked again where they are used; these make a typo answer at once."""
    for dest, flag, zero in DURATIONS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if dest == "mtbf" and args.command == "sweep":
            if ".." not in value:
                raise SimError(f"--mtbf={value!r}: a sweep takes LOW..HIGH, e.g. 0.01h..3h")
            parse_range(value, what="--mtbf")
        else:
            parse_duration(value, what=flag, allow_zero=zero)
    seeds, seed, points = (getattr(args, d, None) for d in ("seeds", "seed", "points"))
    if isinstance(seeds, int) and seeds < 1:
        raise SimError(f"--seeds {seeds}: give a whole number of runs >= 1 (default 10)")
    if isinstance(seed, int) and seed < 0:
        raise SimError(f"--seed {seed}: give a non-negative integer (default 0)")
    if isinstance(points, int) and points < 2:
        raise SimError(f"--points={points} must be at least 2")
    if args.command == "tune" and args.strategies:
        others = [s for s in args.strategies.split(",") if s.strip() != "layercheck"]
        if others:
            raise SimError(f"--strategies {args.strategies}: tune searches LayerCheck's own "
                           "settings (and finds the best baseline beside it); for every "
                           f"strategy at its own best setting run `python -m sim --strategies "
                           f"{args.strategies}`")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    top = _parser()
    args, extra = top.parse_known_args(_join_negatives(argv))
    if extra:                            # named by the command that did not take them
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        check(args)
        from .commands import COMMAND_RUNS
        COMMAND_RUNS[args.command](args)
    except Exception as exc:
        if not isinstance(exc, _refusals()):
            if stdout_gone(exc):  # `python -m sim ... | head -1`: stop quietly
                return 0
            raise
        print(f"{PROG} {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    return 0


def _refusals() -> tuple[type[Exception], ...]:
    """The errors that are bad input (one line, exit 2): ``SimError``, and a trace's
    ``TraceError`` where the trace's schema was imported (none can be raised before)."""
    schema = sys.modules.get("layercheck.contract.traceschema")
    return (SimError,) + ((schema.TraceError,) if schema is not None else ())
