"""``python -m sim scale``: each strategy's ratio against job size (``sim.scale``).

    python -m sim scale --gpus 8..16384                 the qwen2.5-7b preset, doubling sizes
    python -m sim scale --gpus 16384 --iteration-time 6s --checkpoint-gb 5670 --window 54d
    python -m sim scale --gpus 8..1024 --spares 0 --domain rack:16:59700d --json | --csv
"""
from __future__ import annotations

import json

from .api import PRESETS, Scenario
from .errors import SimError
from .nodes import Domain
from .peers import PLACEMENTS
from .recovery import NO_SPARE, RECOVERY_FIGURES, RecoveryModel
from .scale import LLAMA3_NODE_MTBF_S, WHERE, ScaleModel, gpu_steps, scale_curve, shares
from .scenarioargs import job_scenario
from .strategies import PROTOCOLS
from .units import format_duration, parse_duration
from .workbound import MAX_DRAINED_WRITES

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    sc = sub.add_parser("scale", help="each strategy's ratio against job size, with the perfect "
                        "checkpointer, the 95%% band and where the time goes")
    sc.add_argument("--gpus", default="8..16384", help="LOW..HIGH (doubling from LOW) or one "
                    "size, multiples of 8 GPUs (default 8..16384)")
    out = sc.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--csv", action="store_true")
    j = sc.add_argument_group("job (default: the qwen2.5-7b preset, trained data-parallel)")
    j.add_argument("--preset", choices=PRESETS)
    j.add_argument("--trace", help="a trace folder (traces/NAME)")
    j.add_argument("--iteration-time", help="custom job: compute per step, e.g. 6s")
    j.add_argument("--iterations", type=int, default=1692, help="custom job: steps per job")
    j.add_argument("--checkpoint-gb", type=float, default=106.6, help="custom job: full checkpoint GB")
    j.add_argument("--costs", help="a cost model (paper-a100) or a costs.json: one node's figures")
    j.add_argument("--strategies", help="comma list")
    j.add_argument("--protocol", choices=PROTOCOLS)
    j.add_argument("--interval", help="every rollback strategy every N steps (or young, daly)")
    j.add_argument("--stale-cost", type=float, metavar="PHI", help="the stale cost factor phi "
                   "(-1000 to 1000)")
    j.add_argument("--seeds", type=int, default=10)
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--window", default="30d", help="wall-clock window per run (default 30d)")
    f = sc.add_argument_group("failures and recovery (defaults and sources: docs/sim-scale.md)")
    f.add_argument("--node-mtbf", help=f"one node's MTBF (default {format_duration(LLAMA3_NODE_MTBF_S)}: "
                   "Llama 3 405B's 419 interruptions in 54 days on 2,048 nodes)")
    f.add_argument("--node-shape", type=float, default=1.0, help="a node's Weibull shape, 0.01 "
                   "to 20 (1: exponential)")
    f.add_argument("--domain", action="append", default=[], metavar="KIND:SIZE:MTBF",
                   help="a failure domain taking SIZE nodes at once, one instance every MTBF, "
                   "e.g. rack:16:59700d (Alibaba HPN's 0.051%% of top-of-rack switches failing "
                   "a month; repeatable; kind rack or switch); the first rack sets the placement")
    f.add_argument("--spares", type=int, help="hot spare nodes (default: a pool that never runs out)")
    f.add_argument("--no-spare", choices=NO_SPARE, default="wait",
                   help="without a spare: wait for repair or restart smaller")
    f.add_argument("--hang-share", type=float, help="share of failures that hang "
                   f"(default {RECOVERY_FIGURES['hang_share'].value:g}, ByteRobust)")
    f.add_argument("--hang-timeout", help="the collective's timeout a hang costs (default 10m)")
    f.add_argument("--comm-init-per-doubling", help="communicator init per doubling of nodes "
                   "(default 2.59s, nccl#534)")
    f.add_argument("--placement", choices=PLACEMENTS, default="cross-rack",
                   help="where GEMINI keeps each node's peer copy")
    s = sc.add_argument_group("shared storage")
    s.add_argument("--aggregate-gbps", type=float, default=2000.0,
                   help="the file system's aggregate write GB/s (default 2000: Llama 3's 2 TB/s)")
    s.add_argument("--read-aggregate-gbps", type=float, default=2000.0)
    s.add_argument("--tenants", type=int, default=0, help="other jobs like this one on the same "
                   f"file system, at random phases (the job's writes x (1 + tenants) at most "
                   f"{MAX_DRAINED_WRITES:,}: docs/sim.md, Work limits)")
    # the rest of the job vocabulary sim.scenarioargs.job_scenario reads: flags scale lacks
    sc.set_defaults(checkpoint_cost=None, stale_as_useful=False)


def _sizes(text: str) -> list[int]:
    low, sep, high = str(text).partition("..")
    try:
        values = [int(low)] + ([int(high)] if sep else [])
    except ValueError:
        raise SimError(f"--gpus {text!r}: write LOW..HIGH in GPUs, e.g. 8..16384, or one size "
                       "such as 16384") from None
    return gpu_steps(values[0], values[-1])


def _model(args) -> ScaleModel:
    changes = {}
    if args.hang_share is not None:
        changes["hang_share"] = args.hang_share
    if args.hang_timeout is not None:
        changes["hang_timeout_s"] = parse_duration(args.hang_timeout, what="--hang-timeout")
    if args.comm_init_per_doubling is not None:
        changes["comm_init_per_doubling_s"] = parse_duration(
            args.comm_init_per_doubling, what="--comm-init-per-doubling", allow_zero=True)
    recovery = RecoveryModel(spares=args.spares, no_spare=args.no_spare, **changes)
    domains = tuple(Domain.parse(text) for text in args.domain)
    node = parse_duration(args.node_mtbf, what="--node-mtbf") if args.node_mtbf else LLAMA3_NODE_MTBF_S
    return ScaleModel(node_mtbf_s=node, node_shape=args.node_shape, domains=domains,
                      recovery=recovery, aggregate_gbps=args.aggregate_gbps,
                      read_aggregate_gbps=args.read_aggregate_gbps, tenants=args.tenants,
                      placement=args.placement)


def run(args) -> None:
    sizes = _sizes(args.gpus)
    model = _model(args)
    scenario = job_scenario(args)     # its failures are the model's nodes'
    strategies = args.strategies.split(",") if args.strategies else None
    frame = scale_curve(scenario, model, gpus=sizes, seeds=args.seeds, strategies=strategies)
    if args.json:
        print(json.dumps({"scenario": scenario.to_dict(), "scale": model.to_dict(),
                          "seeds": args.seeds, "rows": frame.to_dict("records")},
                         indent=2, default=float))
    elif args.csv:
        print(frame.to_csv(index=False), end="")
    else:
        print(_text(scenario, model, shares(frame, scenario.window_s), args.seeds))


def _text(scenario: Scenario, model: ScaleModel, frame, seeds: int) -> str:
    lines = [f"{scenario.name}: {format_duration(scenario.window_s)} window x {seeds} seeds, "
             f"node MTBF {format_duration(model.node_mtbf_s)}, storage {model.aggregate_gbps:g} GB/s "
             f"aggregate, spares {'unlimited' if model.recovery.spares is None else model.recovery.spares}"
             f", placement {model.placement}",
             "ratio +-95%; then shares of the window: " + ", ".join(WHERE.values())]
    for gpus, group in frame.groupby("gpus", sort=False):
        first = group.iloc[0]
        lines.append(f"\n{gpus:,} GPUs ({first.nodes:,} nodes): job MTBF "
                     f"{format_duration(first.job_mtbf_s)}, {first.failures:.1f} failures a run")
        for row in group.itertuples():
            parts = "  ".join(f"{getattr(row, c):6.2%}" for c in WHERE)
            lines.append(f"  {row.strategy:<16}{row.effective_ratio:.4f} +-{row.ci95:.4f}  {parts}")
    return "\n".join(lines)
