"""``python -m sim scale``: each strategy's ratio against job size (``sim.scale``).

    python -m sim scale --gpus 8..16384                 the qwen2.5-7b preset, doubling sizes
    python -m sim scale --gpus 16384 --iteration-time 6s --checkpoint-gb 5670 --window 54d
    python -m sim scale --gpus 8..1024 --spares 0 --domain rack:16:59700d --json | --csv
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .errors import SimError
from .peers import PLACEMENTS
from .published import PRESET_NAMES, REGIMES
from .recovery import GPUS_PER_NODE, NO_SPARE, RECOVERY_FIGURES, RecoveryModel
from .scenarioargs import SEED_HELP, SEEDS_HELP, job_scenario
from .strategies import PROTOCOLS, STRATEGIES
from .tables import WIDTH, Column, render
from .units import format_duration, parse_duration

if TYPE_CHECKING:       # run() imports them: declaring the flags stays light
    from .api import Scenario
    from .scale import ScaleModel

__all__ = ["add_arguments", "run"]


def add_arguments(sc) -> None:
    """``scale``'s flags on its parser ``sc`` (``sim.cli`` adds the output flags)."""
    sc.add_argument("--gpus", default="8..16384", help="LOW..HIGH (doubling from LOW) or one "
                    "size, multiples of 8 GPUs (default 8..16384)")
    j = sc.add_argument_group("job (default: the qwen2.5-7b preset, trained data-parallel)")
    j.add_argument("--preset", choices=PRESET_NAMES, help="a built-in preset")
    j.add_argument("--trace", help="a trace folder (traces/NAME)")
    j.add_argument("--iteration-time", help="custom job: compute per step, e.g. 6s")
    j.add_argument("--iterations", type=int, default=1692, help="custom job: steps per job")
    j.add_argument("--checkpoint-gb", type=float, default=106.6, help="custom job: full checkpoint GB")
    j.add_argument("--costs", help="a cost model (paper-a100) or a costs.json: one node's figures")
    j.add_argument("--strategies", help=f"comma list from {','.join(STRATEGIES)}")
    j.add_argument("--protocol", choices=PROTOCOLS, help="rollback strategies' cadence: matched "
                   "(the paper's matched freshness) or native (each as its authors designed it)")
    j.add_argument("--interval", help="every rollback strategy every N steps (or young, daly)")
    j.add_argument("--stale-cost", type=float, metavar="PHI", help="the stale cost factor phi "
                   "(-1000 to 1000)")
    j.add_argument("--seeds", type=int, default=10, help=SEEDS_HELP)
    j.add_argument("--seed", type=int, default=0, help=SEED_HELP)
    j.add_argument("--window", default="30d", help="wall-clock window per run (default 30d)")
    f = sc.add_argument_group("failures and recovery (defaults and sources: docs/sim-scale.md)")
    f.add_argument("--node-mtbf", help=f"one node's MTBF (default "
                   f"{format_duration(REGIMES['llama3-405b'].node_mtbf_s(GPUS_PER_NODE))}: "
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
    s.add_argument("--read-aggregate-gbps", type=float, default=2000.0,
                   help="the file system's aggregate read GB/s during recoveries (default 2000)")
    s.add_argument("--tenants", type=int, default=0, help="other jobs like this one on the same "
                   "file system, at random phases (the job's writes x (1 + tenants) are "
                   "bounded: docs/sim.md, Work limits)")
    # the rest of the job vocabulary sim.scenarioargs.job_scenario reads: flags scale lacks
    sc.set_defaults(checkpoint_cost=None, stale_as_useful=False)


def _sizes(text: str) -> list[int]:
    from .scale import gpu_steps
    low, sep, high = str(text).partition("..")
    try:
        values = [int(low)] + ([int(high)] if sep else [])
    except ValueError:
        raise SimError(f"--gpus {text!r}: write LOW..HIGH in GPUs, e.g. 8..16384, or one size "
                       "such as 16384") from None
    return gpu_steps(values[0], values[-1])


def _model(args) -> ScaleModel:
    from .nodes import Domain
    from .scale import LLAMA3_NODE_MTBF_S, ScaleModel
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
    from .scale import scale_curve, shares
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
        print(_text(scenario, model, shares(frame, scenario.window_s), args.seeds,
                    width=None if args.wide else WIDTH))


HEADERS = {"stale_lost_s": "stale", "stall_s": "stall", "storage_wait_s": "storage",
           "lost_work_s": "lost", "detection_s": "detect", "reschedule_s": "resched",
           "restart_s": "restart", "load_s": "load"}
"""Short column headers of ``sim.scale.WHERE``'s shares (the line above the tables spells
them out)."""


def _text(scenario: Scenario, model: ScaleModel, frame, seeds: int, *,
          width: int | None = WIDTH) -> str:
    """A table per job size (ratio, band, where the window went), then the summary: who
    leads at each size and by how much at the largest."""
    from .results import LIMIT
    from .scale import WHERE
    lines = [f"{scenario.name}: {format_duration(scenario.window_s)} window x {seeds} seeds, "
             f"node MTBF {format_duration(model.node_mtbf_s)}, storage {model.aggregate_gbps:g} GB/s "
             f"aggregate, spares {'unlimited' if model.recovery.spares is None else model.recovery.spares}"
             f", placement {model.placement}",
             "ratio +-95%, then shares of the window: " + ", ".join(
                 h if h == WHERE[c] else f"{h} ({WHERE[c]})" for c, h in HEADERS.items())]
    columns = [Column("strategy", 16, left=True), Column("ratio", 6), Column("+-95%", 7),
               *(Column(h, 7) for h in HEADERS.values())]
    leaders = {}
    for gpus, group in frame.groupby("gpus", sort=False):
        first = group.iloc[0]
        lines.append(f"\n{gpus:,} GPUs ({first.nodes:,} nodes): job MTBF "
                     f"{format_duration(first.job_mtbf_s)}, {first.failures:.1f} failures a run")
        rows = [[row.strategy, f"{row.effective_ratio:.4f}", f"+-{row.ci95:.4f}",
                 *(f"{getattr(row, c):.2%}" for c in HEADERS)] for row in group.itertuples()]
        lines.append(render(columns, rows, width=width))
        leaders[int(gpus)] = {r.strategy: float(r.effective_ratio) for r in group.itertuples()
                              if r.strategy != LIMIT}
    lines.append("")
    lines.append(_summary(leaders))
    return "\n".join(lines)


def _summary(leaders: dict[int, dict[str, float]]) -> str:
    """One closing line: the strategy with the highest ratio at each size (runs of sizes
    with the same one), and the margin at the largest size over the runner-up."""
    from .report import leader_line
    runs: list[tuple[str, int, int]] = []
    for gpus, ratios in leaders.items():
        if not ratios:
            continue
        top = max(ratios, key=ratios.get)
        if runs and runs[-1][0] == top:
            runs[-1] = (top, runs[-1][1], gpus)
        else:
            runs.append((top, gpus, gpus))
    if not runs:
        return "summary: no strategy was compared"
    largest = max(g for g in leaders if leaders[g])
    last = leader_line(leaders[largest], what="the highest ratio", label=f"at {largest:,} GPUs")
    if len(leaders) == 1:
        return "summary " + last
    if len(runs) == 1:
        name, low, high = runs[0]
        return (f"summary: {name} has the highest ratio at every size ({low:,} to {high:,} "
                f"GPUs); {last}")
    spans = "; ".join(f"{name} at {low:,} GPUs" if low == high else f"{name} from {low:,} to "
                      f"{high:,} GPUs" for name, low, high in runs)
    return f"summary: highest ratio by size: {spans}; {last}"
