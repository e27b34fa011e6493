"""LayerCheck with a memory tier and a buddy replica (``layercheck.tiers``), and the figures of
its failure split and memory-tier copy.

The model, in the base's terms:

- primary tier: every ``every`` steps the whole training state is copied into the
  node's memory tier (the stall, at ``tier_copy_gbps``) and sent to the buddy in the
  background (at GEMINI's ``peer_gbps``; the next copy waits for it: backpressure). A
  step is a recovery point once its buddy copy is complete (conservative: a failure
  that loses only processes could use the local copy sooner). The tier's own thread
  (checksums, marker) runs beside the next step: on a job whose compute is on the CPU
  (``host_compute``) it takes cores from training, charged as ``tier_thread_gbps`` each
  memory-tier step; on a GPU it is not charged.
- durable tier (the engine's backup): LayerCheck's layer writes as the trace records
  them (``layercheck``'s figures: snapshot, background writer, commit), a composite
  recovery point at every opportunity, written one after the other by one writer;
  its bytes are the only durable ones.
- failures: a share loses only processes (``tier_process_share``: host memory
  survives, the node's own copy is read back), a share a node and its buddy's copy
  (``tier_buddy_loss_share``: the durable composite, with its stale layers), the rest
  a node (the buddy's copy, over the network). A memory restore (``tier_load_s``, at
  ``tier_restore_gbps``) reads and verifies the committed slots and copies the chosen one
  in; a node's adds the buddy's transfer (``peer_load_s``). The engine's primary recovery
  costs the two memory cases' mean, weighted by their shares.
- stale layers: only a recovery from the durable composite has them. The engines
  charge a schedule's composite at every recovery, so this model charges the
  composite's discarded updates where they arise, in the durable tier's recovery
  time: phi (``stale_cost``, the cost model's: ``--cost stale_cost=X`` moves it;
  ``--stale-cost`` does not reach it) x the compute its stale layers discard at
  that position in an uninterrupted run (first order: a resumed run's policy is
  taken to write as the uninterrupted one), each layer stale since the fresher of
  its durable version and the newest memory copy, as the restore chooses; the
  engine cannot tell a recovery whose memory copies died from one where storage
  is merely newer, so the two are charged their mean, weighted by
  ``tier_buddy_loss_share``. (The library itself resumes at the memory copy's
  step where memory holds one, exactly, and loses the steps storage is ahead;
  the engines always take the newest recovery point: with phi above 1 this
  charge is the larger.) A fixed-window run loses the same useful time either way.
"""
from __future__ import annotations

import math

import numpy as np

from layercheck.contract.band import Band
from layercheck.contract.figure import Figure, FigureSpec

from .base import Cadence, Footprint, Strategy, _Builder
from .bands import COPY_BAND, COPY_RULE

__all__ = ["Tiered", "FIGURES", "host_compute", "STRATEGIES", "PROCESS_SHARE", "BUDDY_LOSS_SHARE"]

PROCESS_SHARE = 63 / 419
"""Llama 3 405B (Meta 2024), Table 5: software bug 54 + NCCL watchdog 7 + dependency 2 of 419
unexpected interruptions lose only processes (host memory intact); the class mapping is
shared/design/TIERS.md's (section 3)."""
BUDDY_LOSS_SHARE = 1 / 63
"""shared/design/TIERS.md, section 3, "Double losses" (derived): two nodes failing at once
are buddies with chance 1/(N-1), 1.6% at N = 64 nodes; taken as the share of failures
that lose a node and its buddy (an upper side: it supposes every failure a double one)."""

PROCESS_BAND = Band(low=0.15, high=0.75, reason=(
    "Llama 3's 15% (Table 5, a Meta-like fleet that drains a node on a GPU fault) to "
    "DLRover's 75% (processes restarted; shared/design/TIERS.md, section 3)"))
"""tier_process_share's band, the declaration's and its default's."""
BUDDY_BAND = Band(low=0.0, high=0.2, reason=(
    "0: node failures independent and the copy re-made before a second one; 0.2: a "
    "judgment, as peer_loss_probability's, for a fault domain (switch, rack power) "
    "that holds both"))
"""tier_buddy_loss_share's band, the declaration's and its default's."""

FIGURES: dict[str, FigureSpec] = {
    "tier_process_share": FigureSpec("1", "tiered", "share of failures that lose only "
                                                    "processes (host memory survives: the "
                                                    "node's own memory-tier copy is used)",
        band=PROCESS_BAND,
        default=Figure(value=round(PROCESS_SHARE, 4), source="published", method=(
            "Llama 3 herd of models (Meta 2024), Table 5: software bug 54, NCCL watchdog 7, "
            "dependency 2 = 63 of 419 unexpected interruptions (the class mapping: "
            "shared/design/TIERS.md, section 3)"), band=PROCESS_BAND)),
    "tier_buddy_loss_share": FigureSpec("1", "tiered", "share of failures that lose a node "
                                                       "and its buddy's copy (then the durable "
                                                       "composite)",
        band=BUDDY_BAND,
        default=Figure(value=round(BUDDY_LOSS_SHARE, 4), source="derived", method=(
            "shared/design/TIERS.md, section 3, 'Double losses': two failing nodes are "
            "buddies with chance 1/(N-1), 1/63 = 1.6% at 64 nodes; taken as the share of "
            "failures (an upper side)"), band=BUDDY_BAND)),
    "tier_copy_gbps": FigureSpec("GB/s", "tiered", "the memory tier's copy of the whole "
                                                   "state into shared host memory (tmpfs "
                                                   "files) each time",
        band=COPY_RULE,
        default=Figure(value=100.0, source="assumed", method=(
            "the same GPU -> host memory copy as host_copy_gbps (benchmarks/memory_tier.py "
            "measures its stall against a plain host copy of the same bytes)"),
            band=COPY_BAND)),
    "tier_restore_gbps": FigureSpec("GB/s", "tiered", "the restore from a memory tier: every "
                                                      "committed slot's files read and their "
                                                      "checksums verified, the chosen copy "
                                                      "checked against the live objects and "
                                                      "copied in (layercheck.tiers' restore()); "
                                                      "the state's bytes over its seconds",
        band=COPY_RULE,
        default=Figure(value=100.0, source="assumed", method=(
            "as tier_copy_gbps: host memory read back at the rate it was written (the "
            "checksums' cost left out; python -m profiler calibrate measures the whole restore)"),
            band=COPY_BAND)),
    "tier_thread_gbps": FigureSpec("GB/s", "tiered", "the memory tier's own thread (checksums, "
                                                     "marker) as it slows a training step whose "
                                                     "compute runs on the host's cores: the "
                                                     "state's bytes over the seconds a step "
                                                     "takes longer while it runs",
        band=COPY_RULE,
        default=Figure(value=100.0, source="assumed", method=(
            "charged only where the trace's compute runs on the CPU (its manifest's machine "
            "device); a GPU job's compute does not wait for host threads. Assumed as "
            "tier_copy_gbps; python -m profiler calibrate measures it on a CPU job"),
            band=COPY_BAND)),
}
"""The figures this module declares (``layercheck.contract.calibration.FIGURES`` is the union)."""


def host_compute(workload) -> bool:
    """Whether the job's compute runs on the host's CPU cores (a captured trace's manifest
    says its machine's device is ``cpu``): there the memory tier's thread takes cores from
    training, and each memory-tier step is charged ``tier_thread_gbps``; on a GPU, or a
    synthetic trace (no device), it is not."""
    trace = workload.trace
    machine = (trace.manifest.get("machine") or {}) if trace is not None else {}
    return machine.get("device") == "cpu"


class Tiered(Strategy):
    """LayerCheck's durable layer writes under a memory tier and a buddy replica
    (module doc); the cadence is the memory tier's."""
    name = "tiered"
    label = "LayerCheck's durable writes under a memory tier and a buddy on another node"
    rollback = True
    needs_trace = True
    storage_tier = None
    """Its storage writes are LayerCheck's layer versions on the engine's backup tier, which
    ``sim.storage.contended`` would re-time as full checkpoints: left out of the shared
    storage's contention (as if the storage had room for them; their bytes are small)."""

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        transfer = costs.peer_s(workload.full_bytes)
        k = max(1, math.ceil(transfer / float(workload.compute_s.mean()) - 1e-9))
        return Cadence(every=min(k, workload.steps))

    def search_centres(self, workload, costs, mtbf_s) -> tuple[int, None]:
        """Its memory copies as often as the buddy's transfer keeps up (GEMINI's
        centre); no second interval (the durable tier is LayerCheck's policy)."""
        return max(1, round(costs.peer_s(workload.full_bytes)
                            / float(workload.compute_s.mean()))), None

    def _checkpoints(self, b: _Builder) -> None:
        c, layers = b.costs, b.workload.layers
        at = b.every(b.cadence.every)
        b.snap[1:] = c.tracking_fraction * b.workload.compute_s
        writes = np.concatenate(([0.0], layers.bytes_per_step))
        commits = layers.commits()
        b.snap += np.where(commits, writes / (c.lc_snapshot_gbps * 1e9), 0.0)
        b.snap[at] += b.full / (c.tier_copy_gbps * 1e9)
        if host_compute(b.workload):
            b.snap[at] += b.full / (c.tier_thread_gbps * 1e9)
        b.persist[at] = c.peer_s(b.full)
        b.commit[at] = True
        b.bytes[at] = b.full                      # to the buddy's memory, not to storage
        self._durable = np.where(commits, writes, 0.0)

    def _backup(self, b: _Builder) -> None:
        """LayerCheck's writer is one thread, writing the steps in order: a step's layers
        are durable once the writes queued before them are, and its own are done (the
        queue laid out on the failure-free run's clock; a commit never comes before an
        earlier one's)."""
        c = b.costs
        commits = b.workload.layers.commits()
        write = self._durable / (c.lc_write_gbps * 1e9) + c.lc_commit_s
        clock = np.cumsum(np.concatenate(([0.0], b.workload.compute_s)) + b.snap)
        b.backup = np.full(b.steps + 1, np.nan)
        free = 0.0
        for i in np.flatnonzero(commits[:b.steps]):
            free = max(free, clock[i]) + write[i]
            b.backup[i] = free - clock[i]
        b.bytes += self._durable

    def _shares(self, b: _Builder) -> tuple[float, float, float]:
        process, both = b.costs.tier_process_share, b.costs.tier_buddy_loss_share
        return process, max(0.0, 1.0 - process - both), both

    def _recovery(self, b: _Builder) -> np.ndarray:
        c = b.costs
        process, node, _ = self._shares(b)
        local = c.tier_load_s(b.full)
        buddy = local + c.peer_load_s(b.full)
        mean = (process * local + node * buddy) / max(process + node, 1e-12)
        return np.full(b.steps + 1, c.restart_s + mean)

    def _recovery_backup(self, b: _Builder) -> np.ndarray:
        """Restart, the composite's load, and phi x the compute its stale layers discard
        (module doc): where the memory copies survive (all but ``tier_buddy_loss_share``),
        a layer is stale only since the later of its durable version and the newest
        memory copy at or before the position (the restore takes the fresher, per layer);
        where they do not, since its durable version."""
        layers, c = b.workload.layers, b.costs
        work = np.concatenate(([0.0], np.cumsum(b.workload.compute_s)))
        positions = np.arange(b.steps + 1)
        memory = np.maximum.accumulate(np.where(b.commit, positions, 0))
        durable = work - work[layers.last] @ layers.weights
        fresher = work - work[np.maximum(layers.last, memory[:, None])] @ layers.weights
        both = self._shares(b)[2]
        stale = both * durable + (1.0 - both) * fresher
        return c.restart_s + c.lc_load_s(b.full) + c.stale_cost * stale

    def _backup_probability(self, b: _Builder) -> float:
        return self._shares(b)[2]

    def _footprint(self, b: _Builder) -> Footprint:
        """Durable: LayerCheck's layer writes alone. Host memory: two slots of the state
        and two of the buddy's ward (``layercheck.tiers``), and one step's layer copies
        for the durable writer. A durable recovery point is one version of every layer,
        beside the base checkpoint."""
        return Footprint(durable_bytes=float(self._durable.sum()),
                         host_bytes=4 * b.full + float(self._durable.max()),
                         point_bytes=b.full, base_bytes=b.full)


STRATEGIES = (Tiered,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
