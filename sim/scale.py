"""The simulator's scale model: a scenario's job on N GPUs.

Per-node failures, recovery that grows, shared storage, placement.

The job is the scenario's model trained data-parallel over ``gpus`` GPUs in nodes of
``GPUS_PER_NODE`` (ZeRO-3 sharded over every rank): every step takes the scenario's
time (weak scaling: the global batch grows with the job), every checkpoint the
same bytes, each node writing and reading 1/nodes of them. On N nodes:

- failures: the superposition of the nodes' own processes and of their failure
  domains (``sim.nodes.NodeFailures``), events that take one node or several;
- costs (``scale_costs``): copies to host memory, to a peer, compression and
  replay run on every node at once (the one-node rates x nodes); storage writes
  and reads at the slower of the nodes' links and the file system's aggregate
  (``sim.storage``); the restart grows with log2 of the nodes (``sim.recovery``);
- per event: detection and rescheduling (``RecoveryModel.downtime``, the engine's
  downtime), GEMINI's peer copy lost exactly when the event takes a node and its
  peer (``sim.peers``);
- writes re-timed through the shared storage over time (``sim.storage.contended``).

One node (8 GPUs) on unlimited storage is the single-node model plus detection and
rescheduling: the same costs, the same schedules.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from layercheck.contract.calibration import Figure

from .api import Scenario
from .costs import CostModel
from .engine import run_lanes, run_limit
from .errors import SimError
from .failures import FailureModel
from .nodes import Domain, NodeFailures
from .peers import PLACEMENTS, ReplicaPlacement
from .presets import REGIMES
from .recovery import GPUS_PER_NODE, RecoveryModel
from .results import LIMIT, aggregate
from .storage import AGGREGATE_SOURCE, SharedStorage, contended, storage_writes
from .strategies import Gemini, get_strategy
from .timeline import Timeline
from .units import DURATION_RANGE, is_duration
from .workbound import bound_work, check_drained_writes

__all__ = ["ScaleModel", "scale_costs", "simulate_scale", "scale_curve", "SCALE_COLUMNS",
           "LLAMA3_NODE_MTBF_S", "gpu_steps", "shares", "WHERE"]

_REGIME = REGIMES["llama3-405b"]
LLAMA3_NODE_MTBF_S = _REGIME.node_mtbf_s(GPUS_PER_NODE)
"""One node's MTBF behind Llama 3 405B's record: 419 unexpected interruptions in 54 days on
2,048 nodes of 8 GPUs (``sim.presets.REGIMES``), 54 d / 419 x 2,048 = 264 days."""
NODE_MTBF_SOURCE = (f"Llama 3 405B (Meta 2024): {_REGIME.interruptions} unexpected interruptions "
                    f"in {_REGIME.days} days on {_REGIME.gpus:,} GPUs, every cause charged to "
                    "a node: one node every 264 days")
SCALE_COLUMNS = ("gpus", "nodes", "job_mtbf_s", "strategy", "effective_ratio", "ci95",
                 "stale_lost_s", "stall_s", "storage_wait_s", "lost_work_s", "detection_s",
                 "reschedule_s", "restart_s", "load_s", "failures", "peer_lost",
                 "interval", "storage_interval")
"""One row per (gpus, strategy): the ratio, its 95% confidence half-width over seeds, and
where each run's window went (seconds per run: ``stall_s`` + ``storage_wait_s`` is the
engine's checkpoint stall; detection + reschedule + restart + load its recovery)."""
WHERE = {"stale_lost_s": "stale", "stall_s": "stall", "storage_wait_s": "waiting for storage",
         "lost_work_s": "lost work", "detection_s": "detection", "reschedule_s": "rescheduling",
         "restart_s": "restart", "load_s": "load"}
"""Where a run's window goes besides useful training: column -> name in reports."""
_WRITES = ("save_gbps", "persist_gbps", "lc_write_gbps")
_READS = ("load_gbps", "async_load_gbps", "lc_load_gbps")
_PER_NODE = ("snapshot_gbps", "host_copy_gbps", "lc_snapshot_gbps", "peer_gbps",
             "diff_snapshot_gbps", "diff_replay_gbps")


@dataclass(frozen=True, kw_only=True)
class ScaleModel:
    """Everything a job of N GPUs adds to a scenario (defaults: ``docs/sim-scale.md``, The scale model)."""

    node_mtbf_s: float = LLAMA3_NODE_MTBF_S
    node_shape: float = 1.0
    """The node's Weibull shape (1: exponential)."""
    domains: tuple[Domain, ...] = ()
    recovery: RecoveryModel = field(default_factory=RecoveryModel)
    aggregate_gbps: float = 2000.0
    read_aggregate_gbps: float = 2000.0
    tenants: int = 0
    placement: str = "cross-rack"

    def __post_init__(self) -> None:
        if not is_duration(self.node_mtbf_s):
            raise SimError(f"node MTBF {self.node_mtbf_s!r}: a positive duration from "
                           f"{DURATION_RANGE}, e.g. 264d")
        if self.placement not in PLACEMENTS:
            raise SimError(f"placement {self.placement!r}: use one of {', '.join(PLACEMENTS)}")
        object.__setattr__(self, "domains", tuple(self.domains))

    def failures(self, nodes: int) -> NodeFailures:
        law = FailureModel(kind="exponential") if self.node_shape == 1.0 else \
            FailureModel(kind="weibull", shape=self.node_shape)
        return NodeFailures(nodes=nodes, node_law=law, node_mtbf_s=self.node_mtbf_s,
                            domains=self.domains)

    def storage(self, costs: CostModel, nodes: int) -> SharedStorage:
        return SharedStorage(nodes=nodes, link_gbps=costs.save_gbps, read_link_gbps=costs.load_gbps,
                             aggregate_gbps=self.aggregate_gbps,
                             read_aggregate_gbps=self.read_aggregate_gbps, tenants=self.tenants)

    def rack_nodes(self) -> int:
        racks = [d.size for d in self.domains if d.name == "rack"]
        return racks[0] if racks else 1

    def to_dict(self) -> dict[str, Any]:
        return {"node_mtbf_s": self.node_mtbf_s, "node_shape": self.node_shape,
                "node_mtbf_source": NODE_MTBF_SOURCE if self.node_mtbf_s == LLAMA3_NODE_MTBF_S
                else "given", "domains": [d.to_dict() for d in self.domains],
                "recovery": dataclasses.asdict(self.recovery),
                "aggregate_gbps": self.aggregate_gbps, "read_aggregate_gbps": self.read_aggregate_gbps,
                "aggregate_source": AGGREGATE_SOURCE, "tenants": self.tenants,
                "placement": self.placement}


def nodes_of(gpus: int) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < GPUS_PER_NODE \
            or gpus % GPUS_PER_NODE:
        raise SimError(f"--gpus {gpus!r}: a job is whole nodes of {GPUS_PER_NODE} GPUs; give a "
                       f"multiple of {GPUS_PER_NODE}, e.g. 8, 64, 16384")
    return int(gpus) // GPUS_PER_NODE


def gpu_steps(low: int, high: int) -> list[int]:
    """LOW, 2 LOW, 4 LOW, ... up to HIGH (HIGH itself last when it is not on the doubling)."""
    nodes_of(low), nodes_of(high)
    if low > high:
        raise SimError(f"--gpus {low}..{high}: the low end must not exceed the high end")
    out = [int(low)]
    while out[-1] * 2 <= high:
        out.append(out[-1] * 2)
    return out + ([int(high)] if out[-1] != high else [])


def scale_costs(costs: CostModel, nodes: int, storage: SharedStorage,
                recovery: RecoveryModel) -> CostModel:
    """The job-level cost model on ``nodes`` nodes (module docstring), every changed figure
    derived from the one-node one and saying how; GEMINI's peer loss is decided per event
    (``peer_loss_probability`` 1 with uniforms 0 or 1 from ``sim.peers``)."""
    values, prov = {}, dict(costs.provenance)

    def put(name: str, value: float, method: str) -> None:
        values[name] = value
        prov[name] = Figure(value=value, source="derived", method=method)
    for name in _WRITES:
        put(name, storage.write_gbps(getattr(costs, name)),
            f"min({nodes} nodes x {getattr(costs, name):g} GB/s ({costs.name}'s one-node "
            f"{name}), the file system's aggregate {storage.aggregate_gbps:g} GB/s) (sim.storage)")
    for name in _READS:
        put(name, storage.read_gbps(getattr(costs, name)),
            f"min({nodes} nodes x {getattr(costs, name):g} GB/s ({costs.name}'s one-node "
            f"{name}), the aggregate read {storage.read_aggregate_gbps:g} GB/s) (sim.storage)")
    for name in _PER_NODE:
        put(name, getattr(costs, name) * nodes,
            f"{nodes} nodes x {costs.name}'s one-node {name}: each node copies its own shard")
    put("restart_s", recovery.restart_s(costs.restart_s, nodes),
        f"{costs.name}'s one-node restart {costs.restart_s:g} s + "
        f"{recovery.comm_init_per_doubling_s:g} s x log2({nodes} nodes) (sim.recovery)")
    put("peer_loss_probability", 1.0, "decided per failure event from the replicas' placement "
        "and the event's nodes (sim.peers)")
    return dataclasses.replace(costs, **values, provenance=prov,
                               name=f"{costs.name} x {nodes} nodes",
                               description=f"{costs.description}; scaled to {nodes} nodes")


def simulate_scale(scenario: Scenario, model: ScaleModel, *, gpus: int, seeds: int = 10,
                   strategies: Sequence[str] | None = None,
                   window_s: float | None = None) -> pd.DataFrame:
    """One row per strategy and the perfect checkpointer ('limit'), ``SCALE_COLUMNS``. The
    scenario's job, costs, protocol and accounting; its failures are ``model``'s nodes'
    (``scenario.failures`` is not used). Seed i draws its events, hangs and host-memory
    losses from ``SeedSequence([scenario.seed, i])``: every strategy faces the same."""
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or seeds < 2:
        raise SimError(f"seeds={seeds!r}: at least 2 (the 95% band needs them)")
    nodes = nodes_of(gpus)
    window = scenario.window_s if window_s is None else window_s
    if not is_duration(window):
        raise SimError(f"window_s={window_s!r}: give a positive number of seconds from "
                       f"{DURATION_RANGE}, e.g. 30 days")
    window = float(window)
    storage = model.storage(scenario.costs, nodes)
    costs = scale_costs(scenario.costs, nodes, storage, model.recovery)
    job = dataclasses.replace(scenario, costs=costs)
    names = job.strategy_names(strategies)
    failures = model.failures(nodes)
    bound_work(failures, [None], seeds=int(seeds), window_s=window, strategies=len(names) + 1,
               engine="fast", mean_step_s=float(job.workload.compute_s.mean()))
    mtbf = failures.job_mtbf_s()
    placement = ReplicaPlacement(nodes=nodes, rack_nodes=min(model.rack_nodes(), nodes),
                                 kind=model.placement)
    times, down, peer, parts = [], [], [], []
    for i in range(seeds):
        ev_seq, hang_seq, host_seq = np.random.SeedSequence([scenario.seed, i]).spawn(3)
        events = failures.draw(np.random.default_rng(ev_seq), window)
        d = model.recovery.downtime(events.times_s, events.nodes_lost, nodes,
                                    np.random.default_rng(hang_seq))
        lost = placement.lost(events.first_node, events.nodes_lost, np.random.default_rng(host_seq))
        times.append(events.times_s)
        down.append(d.total_s)
        peer.append(np.where(lost, 0.0, 1.0))
        parts.append((float(d.detection_s.sum()), float(d.reschedule_s.sum()), float(lost.sum())))
    timelines, stall_share, keys, lane_t, lane_row = [], [], [], [], []
    rng = np.random.default_rng([scenario.seed, nodes])
    cadences = {name: job.cadence(name, mtbf) for name in names}
    schedules = {name: get_strategy(name).schedule(job.workload, costs, cadences[name])
                 for name in names}
    # the strategy that writes most sets what the tenants cost: refused before any is drained
    check_drained_writes(max(map(storage_writes, schedules.values())), model.tenants)
    for name in names:
        cadence = cadences[name]
        schedule = contended(schedules[name], storage, full_bytes=float(job.workload.full_bytes),
                             rng=rng)
        timelines.append(Timeline.build(schedule))
        stall_share.append(_storage_share(job, name, cadence, timelines[-1]))
        for i in range(seeds):
            keys.append((0, name, cadence))
            lane_t.append(len(timelines) - 1)
            lane_row.append(i)
    res = run_lanes(timelines, np.array(lane_t), times, np.array(lane_row), peer, window,
                    downtime=down)
    phi = job.stale_figure()
    frame = aggregate(res, keys, [mtbf], window, phi)
    lim = run_limit(times, window, costs.restart_s, downtime=down)
    frame = pd.concat([frame, aggregate(lim, [(0, LIMIT, None)] * seeds, [mtbf], window, phi)],
                      ignore_index=True)
    loads = [_loads(t.schedule, costs.restart_s) for t in timelines] + [(0.0, 0.0)]
    return _breakdown(frame, gpus, nodes, costs.restart_s, loads, stall_share + [0.0], parts)


def _loads(schedule, restart_s: float) -> tuple[float, float]:
    """A recovery's load beyond the restart, from the primary tier and from the backup
    (GEMINI's storage when the peer copy is lost; the primary where there is none)."""
    primary = float(np.median(schedule.recover[1:])) - restart_s
    backup = schedule.recover_backup if schedule.backup_probability > 0 else None
    return primary, primary if backup is None else float(np.median(backup[1:])) - restart_s


def _storage_share(job: Scenario, name: str, cadence, timeline: Timeline) -> float:
    """Share of a failure-free job's checkpoint stall that waits for storage: the stall
    beyond the same job's on storage that never limits (every write and read figure
    1e9 GB/s)."""
    stall = float(timeline.job_end[0] - timeline.work[-1])
    if stall <= 0:
        return 0.0
    fast = job.costs.with_overrides(**{n: 1e9 for n in _WRITES})
    quick = Timeline.build(get_strategy(name).schedule(job.workload, fast, cadence))
    return min(1.0, max(0.0, (stall - float(quick.job_end[0] - quick.work[-1])) / stall))


def _breakdown(frame, gpus, nodes, restart_s, loads, stall_share, parts) -> pd.DataFrame:
    """The engine's recovery split in proportion to its parts' nominal sums per run
    (detection and rescheduling drawn per event, restart and load per failure, GEMINI's
    load from storage where its peer copy was lost), and its
    stall into waiting for storage and the rest (``_storage_share``)."""
    detection, reschedule, peer = (np.mean([p[j] for p in parts]) for j in range(3))
    rows = []
    for row, (load, backup), share in zip(frame.to_dict("records"), loads, stall_share):
        n = row["failures"]
        lost = min(peer, n) if backup != load else 0.0
        nominal = np.array([detection, reschedule, n * restart_s,
                            (n - lost) * max(load, 0.0) + lost * max(backup, 0.0)])
        split = row["recovery_s"] * nominal / nominal.sum() if nominal.sum() > 0 else nominal
        rows.append({"gpus": gpus, "nodes": nodes, "job_mtbf_s": row["mtbf_s"],
                     "strategy": row["strategy"], "effective_ratio": row["effective_ratio"],
                     "ci95": row["ci95"], "stale_lost_s": row["stale_lost_s"],
                     "stall_s": max(row["checkpoint_stall_s"], 0.0) * (1 - share),
                     "storage_wait_s": max(row["checkpoint_stall_s"], 0.0) * share,
                     "lost_work_s": row["lost_work_s"], "detection_s": split[0],
                     "reschedule_s": split[1], "restart_s": split[2], "load_s": split[3],
                     "failures": n, "peer_lost": peer if row["strategy"] == Gemini.name else 0.0,
                     "interval": row["interval"], "storage_interval": row["storage_interval"]})
    return pd.DataFrame(rows, columns=list(SCALE_COLUMNS))


def scale_curve(scenario: Scenario, model: ScaleModel, *, gpus: Sequence[int], seeds: int = 10,
                strategies: Sequence[str] | None = None,
                window_s: float | None = None) -> pd.DataFrame:
    """``simulate_scale`` at each job size, long format (``SCALE_COLUMNS``)."""
    sizes = [int(g) for g in gpus]
    if not sizes:
        raise SimError("the scale curve needs at least one job size (--gpus 8..16384)")
    return pd.concat([simulate_scale(scenario, model, gpus=g, seeds=seeds, strategies=strategies,
                                     window_s=window_s) for g in sizes], ignore_index=True)


def shares(frame: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """``frame`` with every ``WHERE`` column as a share of the window (what reports plot)."""
    out = frame.copy()
    for column in WHERE:
        out[column] = out[column] / window_s
    return out


LLAMA3_STEP_S = 6.0
"""Llama 3 405B's step, derived (not in SCALE.md: check in the primary source): 6 x 405e9
parameters x 16M tokens a step (its global batch) / (16,384 GPUs x 400 TFLOPs each, the
paper's Table 4) = 5.9 s."""
LLAMA3_CHECKPOINT_GB = 405e9 * 14 / 1e9
"""405e9 parameters x 14 bytes (bf16 weights, fp32 master weights and Adam moments, the
LayerCheck paper's convention): 5,670 GB."""


def llama3_405b(*, window_days: float = 54.0) -> tuple[Scenario, ScaleModel]:
    """Llama 3 405B's pre-training as this model sees it (docs/sim-scale.md, The Llama 3
    comparison): 16,384 GPUs over 54 days, its nodes failing at its reported rate, every
    other figure this model's default with its source. Protocol native: DeepSpeed at
    Daly's interval for its synchronous save."""
    scenario = Scenario.custom(iteration_s=LLAMA3_STEP_S, iterations=10_000,
                               checkpoint_gb=LLAMA3_CHECKPOINT_GB,
                               window_s=window_days * 86400.0, name="llama3-405b")
    return scenario, ScaleModel()
