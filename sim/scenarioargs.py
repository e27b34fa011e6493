"""A scenario from the command line: the flags every ``python -m sim`` command shares.

``add_scenario_args`` declares them (the job, its failures, the run, the costs);
``scenario_of`` builds ``python -m sim``'s scenario from them, ``job_scenario`` the job
alone (the one home of building a job from --preset, --trace or --iteration-time, which
``sim.scalecli`` shares), ``mtbf_of`` the MTBF a command runs at. Bad input is a
``SimError`` whose one line says the fix (``sim.cli`` prints it and exits 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layercheck.contract.measurement import age_warning

from .calibrated import FIGURES, read_calibration
from .costs import COST_MODELS, CostModel
from .engine import ENGINES
from .errors import SimError
from .published import DEFAULT_PRESET, PRESET_NAMES, REGIMES
from .strategies import PROTOCOLS, STRATEGIES
from .units import parse_duration

if TYPE_CHECKING:       # the builders import them when called: declaring the flags stays light
    from .api import Scenario
    from .failures import FailureModel
    from .nodes import NodeFailures

__all__ = ["SEEDS_HELP", "SEED_HELP", "COST_FLAGS", "FAIR", "add_scenario_args", "add_budget_args", "add_price_args",
           "scenario_of", "job_scenario", "failure_model", "cost_overrides", "stale_cost", "warn_age",
           "mtbf_of", "budgets_of", "prices_of", "protocol_of"]

FAIR = "fair"
"""The comparison's default protocol: each strategy at its own best setting within the
budgets (``sim.fair``); ``matched`` and ``native`` fix every cadence by a rule."""

SEEDS_HELP = ("runs per strategy, each on its own failures, every strategy on the same ones "
              "(default 10; sensitivity 5); the 95%% band needs 2 or more")
SEED_HELP = "the first run's random seed (default 0; the same seed, the same failures)"
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


def add_scenario_args(p: argparse.ArgumentParser, *, fair: bool = False) -> None:
    """The shared flags; ``fair``: the command compares under the fair protocol by default
    (``--protocol fair``, the other protocols by name)."""
    g = p.add_argument_group("scenario (default: the qwen2.5-7b preset)")
    g.add_argument("--preset", choices=PRESET_NAMES, help="a built-in preset")
    g.add_argument("--trace", help="a trace folder (traces/NAME) from the profiler or a preset")
    g.add_argument("--iteration-time", help="custom job without a trace: compute per step, e.g. 6s")
    g.add_argument("--iterations", type=int, default=1692, help="custom job: steps per job")
    g.add_argument("--checkpoint-cost", help="custom job: time to write a full checkpoint, e.g. 60s")
    g.add_argument("--checkpoint-gb", type=float, default=106.6, help="custom job: full checkpoint size")
    f = p.add_argument_group("failures")
    f.add_argument("--gpus", type=int, help="GPUs in the job (with --gpu-mtbf or --regime; 1 to 2**53)")
    f.add_argument("--gpu-mtbf", help="MTBF of one GPU; the job's MTBF is this / --gpus")
    f.add_argument("--regime", choices=tuple(REGIMES), help="a published failure regime")
    f.add_argument("--failures", choices=("exponential", "weibull", "log"), default=None,
                   help="the law of the job's gaps, or with --nodes of each node's")
    f.add_argument("--shape", type=float, default=0.7, help="Weibull shape (default 0.7; a "
                   "node's, with --nodes: 0.01 to 20)")
    f.add_argument("--failure-log", help="CSV of the job's failure times (column time or "
                   "time_s); with --nodes a record of nodes replayed: lanl (shipped, with "
                   "--system N) or a CSV of node and time columns")
    f.add_argument("--nodes", type=int, help="a job of N nodes, each failing on its own (the "
                   "job's failures are their superposition; 1 to 1,000,000): with --node-mtbf, "
                   "or a record (--failure-log)")
    f.add_argument("--node-mtbf", help="with --nodes: one node's MTBF, e.g. 6350h")
    f.add_argument("--domain", action="append", default=[], metavar="KIND:SIZE:MTBF",
                   help="with --nodes: a failure domain taking SIZE nodes at once (2 to "
                   "1,000,000), one instance every MTBF, e.g. rack:32:3000d (repeatable; kind "
                   "rack or switch)")
    f.add_argument("--system", type=int, help="the LANL system of --failure-log lanl, e.g. 18")
    f.add_argument("--log-once", action="store_true", help="play the failure log once from time 0, "
                   "as written (no cycling, no random start; a real run killed at those times)")
    r = p.add_argument_group("run")
    r.add_argument("--strategies", help=f"comma list from {','.join(STRATEGIES)}")
    r.add_argument("--seeds", type=int, default=10, help=SEEDS_HELP)
    r.add_argument("--seed", type=int, default=0, help=SEED_HELP)
    if fair:
        r.add_argument("--protocol", choices=(FAIR, *PROTOCOLS), default=FAIR, help="fair (the "
                       "default: every strategy at its own best setting within the budgets), "
                       "matched (the paper's: rollback strategies as often as LayerCheck's mean "
                       "staleness, LayerCheck at its default) or native (each as its authors "
                       "designed it)")
    else:
        r.add_argument("--protocol", choices=PROTOCOLS, help="rollback strategies' cadence: "
                       "matched (the paper's matched freshness, default with a trace) or native "
                       "(each as its authors designed it)")
    r.add_argument("--interval", help="override: every rollback strategy every N steps (or young, daly)")
    r.add_argument("--stale-cost", metavar="PHI", help="the stale cost factor phi: the share of "
                   "stale_s (training whose updates stale layers discarded) counted as lost, the "
                   "rest as useful; 0: the paper's accounting, 1: every stale update lost; -1000 "
                   "to 1000 (default: the cost model's, with its interval)")
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


def cost_overrides(args, base: CostModel) -> CostModel:
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


def failure_model(args) -> FailureModel | NodeFailures:
    from .failures import FailureModel, read_failure_log
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
    from .failures import FailureModel
    from .nodes import Domain, NodeFailures
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


def stale_cost(args) -> float | None:
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


def scenario_of(args) -> Scenario:
    """``python -m sim``'s scenario: the job (``job_scenario``) failing by the failure flags
    (``failure_model``), its cost model with the cost flags' overrides (``cost_overrides``)."""
    scenario = job_scenario(args, failures=failure_model(args))
    return dataclasses.replace(scenario, costs=cost_overrides(args, scenario.costs))


def job_scenario(args, **fields: Any) -> Scenario:
    """The job a command line names, the one home of every command's: one of --preset,
    --trace (read here: a bad one is a ``SimError`` naming the flag) or --iteration-time
    (with --iterations, --checkpoint-gb, --checkpoint-cost), its cost model (--costs, else
    the trace's costs.json or paper-a100), and --seed, --window, --stale-cost (or
    --stale-as-useful), --interval and --protocol; ``fields`` set any other Scenario field
    (``failures``). A calibration measured by older mechanisms than this library's is one
    warning line on stderr (``warn_age``).

    ``args`` holds every dest this vocabulary reads (``add_scenario_args`` declares them
    all; a command without some of the flags sets their defaults: ``sim.scalecli``)."""
    from layercheck.contract.trace import TraceError, read_trace

    from .api import Scenario
    common = {**fields, "seed": args.seed,
              "window_s": parse_duration(args.window, what="--window"),
              "stale_cost": stale_cost(args)}
    if args.interval is not None:
        common["interval"] = args.interval
    if args.protocol not in (None, FAIR):        # fair searches; the scenario keeps its rule
        common["protocol"] = args.protocol
    named = CostModel.named(args.costs) if args.costs else None
    if sum(x is not None for x in (args.preset, args.trace, args.iteration_time)) > 1:
        raise SimError("give one of --preset, --trace, --iteration-time")
    if args.costs and named.name != "paper-a100":
        warn_age(read_calibration(args.costs), args.costs)
    if args.trace:
        try:
            trace = read_trace(args.trace)
        except TraceError as exc:
            raise SimError(f"--trace: {exc}") from None
        if named is None and trace.costs is not None:
            warn_age(trace.costs, args.trace)
        return Scenario.from_trace(trace, costs=named, **common)
    if args.iteration_time:
        cost = parse_duration(args.checkpoint_cost, what="--checkpoint-cost") \
            if args.checkpoint_cost else None
        return Scenario.custom(iteration_s=parse_duration(args.iteration_time, what="--iteration-time"),
                               iterations=args.iterations, checkpoint_gb=args.checkpoint_gb,
                               checkpoint_s=cost, costs=named, **common)
    extra = {"costs": named} if named else {}
    return Scenario.from_preset(args.preset or DEFAULT_PRESET, **common, **extra)


def warn_age(calibration, where: str) -> None:
    """One line on stderr when the calibration's figures predate the installed mechanisms."""
    folder = where if Path(where).is_dir() else str(Path(where).parent)
    line = age_warning(calibration.code, calibration.figures, folder.rstrip("/"))
    if line:
        print(line, file=sys.stderr)


def mtbf_of(args, value: str | None) -> float | None:
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
    from .failures import job_mtbf
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


def protocol_of(args) -> str | None:
    """The protocol a command line asks for (None: the scenario's own)."""
    return getattr(args, "protocol", None)


def add_budget_args(p: argparse.ArgumentParser, *, staleness: bool = False) -> None:
    """The budgets every strategy's setting must meet (``sim.budgets``)."""
    b = p.add_argument_group("budgets (each optional; the same for every strategy)")
    b.add_argument("--max-gb", type=float, help="GB written to durable storage over the job, "
                   "base checkpoint included")
    if staleness:
        b.add_argument("--max-staleness", type=float, help="no layer older than this many steps "
                       "(LayerCheck)")
    b.add_argument("--max-write-share", type=float, help="share of the storage's write bandwidth "
                   "over the job's compute time, e.g. 0.05")
    b.add_argument("--max-host-gb", type=float, help="host memory the checkpoints may hold at "
                   "once, GB")


def budgets_of(args):
    from .budgets import Budgets
    return Budgets.from_flags(max_gb=args.max_gb, max_staleness=getattr(args, "max_staleness", None),
                              max_write_share=args.max_write_share, max_host_gb=args.max_host_gb)


def add_price_args(p: argparse.ArgumentParser) -> None:
    """What the bill in dollars prices (``sim.dollars``; every default with its source)."""
    from .dollars import PRICES
    g = p.add_argument_group("prices (defaults: docs/sim-fair.md, Hours and dollars)")
    g.add_argument("--gpu-hour-usd", type=float, help=f"one GPU-hour, default "
                   f"${PRICES['gpu_hour_usd'].value:g} (AWS on-demand A100 40 GB)")
    g.add_argument("--storage-usd-per-gb-month", type=float, help=f"durable storage, default "
                   f"${PRICES['storage_usd_per_gb_month'].value:g} (S3 Standard)")
    g.add_argument("--write-usd-per-gb", type=float, help=f"writing, default "
                   f"${PRICES['write_usd_per_gb'].value:.3g} (S3 PUTs of 8 MiB parts)")
    g.add_argument("--keep", type=int, help=f"recovery points kept on storage, default "
                   f"{int(PRICES['keep'].value)}")


def prices_of(args):
    """The prices of the command line: each flag given, the rest their defaults; the job's
    GPUs from --gpus where given."""
    from .dollars import Prices
    given = {k: getattr(args, f) for k, f in (("gpu_hour_usd", "gpu_hour_usd"),
                                              ("storage_usd_per_gb_month", "storage_usd_per_gb_month"),
                                              ("write_usd_per_gb", "write_usd_per_gb"),
                                              ("keep", "keep"), ("gpus", "gpus"))
             if getattr(args, f, None) is not None}
    return Prices(**given)
