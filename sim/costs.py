"""The machine and storage cost model: how long checkpoint traffic and restarts take.

Every default is the paper's server (one node, 8x A100 40 GB, Lustre; LayerCheck,
IEEE CLUSTER 2026, see ``shared/design/LAYERCHECK.md``) and says where its
number comes from: a published figure, a fit to published figures, or a
clearly labelled assumption. Bandwidths are decimal GB/s (1 GB = 1e9 bytes,
as the paper's 106.6 GB for 7.6e9 parameters x 14 bytes).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .errors import SimError

__all__ = ["CostModel", "GB"]

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Seconds per byte of checkpoint traffic, and the fixed costs of a restart."""

    restart_s: float = 30.0
    """Relaunching the job after a failure before any state is loaded (process
    start, CUDA context, NCCL init). ASSUMPTION: the paper's recovery times
    exclude it; half a minute for 8 ranks on one server. ``--restart``."""

    load_fixed_s: float = 4.0
    """Fixed part of loading a checkpoint (open, metadata, placement). FIT to the
    paper's LayerCheck recovery times: 10 s for 106.6 GB (Qwen2.5-7B) and 5 s for
    17.3 GB (Llama-3.2-1B) give 4.0 s + bytes / 17.9 GB/s (Qwen2.5-3B: 6.4 s
    predicted, 7 s measured)."""

    read_gbps: float = 17.9
    """Storage read bandwidth during recovery. FIT, see ``load_fixed_s``."""

    write_gbps: float = 1.12
    """Storage (Lustre) write bandwidth of the node. DERIVED: LowDiff's
    Llama-3.2-1B run wrote 3,837 GB in 57.2 min end to end and was write-bound
    (its checkpoint work exceeded an iteration): 3,837 GB / 3,432 s."""

    host_copy_gbps: float = 100.0
    """GPU -> pinned host memory snapshot bandwidth of the node (the stall of an
    asynchronous checkpoint). ASSUMPTION: 8 GPUs x 12.5 GB/s, about half of PCIe
    4.0 x16's 25 GB/s theoretical per A100."""

    peer_gbps: float = 4.19
    """GEMINI's transfer to a peer's CPU memory (and back, on recovery). CALIBRATED
    so GEMINI's failure-free Qwen2.5-7B run takes the paper's 747.9 min: 26.52 s per
    iteration = 1.07 s snapshot + max(6.25 s compute, transfer), so the transfer
    takes 25.45 s for 106.6 GB."""

    diff_replay_gbps: float = 22.9
    """LowDiff recovery: reading and applying differential checkpoints. FIT to the
    paper: LowDiff's Qwen2.5-7B recovery is 34 s vs 10 s for the full load, the
    24 s replaying 53 diffs of 10.37 GB (3B and 1B predicted 10.7 s and 4.9 s
    vs 11 s and 5 s measured)."""

    diff_fraction: float = 0.1
    """LowDiff's compressed per-iteration diff as a fraction of the full
    checkpoint. FROM the paper's storage table (7B 9.7%, 3B 10.7%, 1B 12.2% once
    the full checkpoints are subtracted); presets use their own figure."""

    diff_batch: int = 2
    """LowDiff writes diffs in batches of this many iterations. FROM the paper's
    storage table: 930 writes in 1,692 iterations, 16 of them full checkpoints,
    leave 1,692 / 914 = 1.85 iterations per batch."""

    layercheck_step_fraction: float = 0.118
    """LayerCheck's per-step cost (drift tracking, metadata commit, layer-aligned
    bookkeeping) as a fraction of the step's compute time. CALIBRATED so the
    failure-free LayerCheck runs of the presets match the paper's 198.8 min
    (Qwen2.5-7B: 11.8%) and 43.8 min (Llama-3.2-1B: 12.0%)."""

    peer_loss_probability: float = 0.05
    """Chance that a failure also destroys the peer's in-memory GEMINI copy
    (correlated node failures), forcing recovery from storage. ASSUMPTION: the
    paper gives no figure; GEMINI's placement makes this rare."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "diff_batch":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise SimError(f"CostModel.diff_batch={value!r} must be an integer >= 1")
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SimError(f"CostModel.{f.name}={value!r} must be a finite number >= 0")
            if f.name.endswith("_gbps") and value == 0:
                raise SimError(f"CostModel.{f.name}=0: a bandwidth must be positive (GB/s)")
        if self.peer_loss_probability > 1:
            raise SimError(f"CostModel.peer_loss_probability={self.peer_loss_probability} "
                           "must be a probability in [0, 1]")

    def write_s(self, nbytes: float) -> float:
        return nbytes / (self.write_gbps * GB)

    def snapshot_s(self, nbytes: float) -> float:
        return nbytes / (self.host_copy_gbps * GB)

    def load_s(self, nbytes: float) -> float:
        """Loading ``nbytes`` of checkpoint from storage (without the restart)."""
        return self.load_fixed_s + nbytes / (self.read_gbps * GB)

    def peer_s(self, nbytes: float) -> float:
        return nbytes / (self.peer_gbps * GB)

    def replay_s(self, nbytes: float) -> float:
        return nbytes / (self.diff_replay_gbps * GB)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        """Inverse of ``to_dict``; unknown keys are an error that lists the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SimError(f"unknown cost model keys {unknown}; known: {sorted(known)}")
        return cls(**dict(data))
