"""DeepSpeed's default: a synchronous full save, and the figures of saving and loading one."""
from __future__ import annotations

from layercheck.contract.figure import Figure, FigureSpec

from .base import Cadence, Strategy, _Builder, _daly_steps
from .bands import LOAD_FIXED_RULE, PAPER, READ_BAND, READ_FIXED_BAND, STORAGE_RULE, WRITE_BAND

__all__ = ["DeepSpeed", "FIGURES", "STRATEGIES"]

FIGURES: dict[str, FigureSpec] = {
    "save_gbps": FigureSpec("GB/s", "deepspeed", "synchronous full save of model and optimizer "
                                                 "(training stalls for all of it)",
        band=STORAGE_RULE,
        default=Figure(value=1.24, source="derived", method=(
        f"{PAPER}: the smallest Lustre write rate at which no run the paper published is "
        "write-bound. LowDiff writes from a queue-fed process, so its runs bound the rate from "
        "below: its Llama-3.2-1B run (57.2 min = 3,432 s) at the top of its published "
        "checkpoint share (15.9%) leaves 3,432 x 0.841 = 2,886 s of training, 1.239x "
        "LayerCheck's 1B compute (43.8 min x 0.8865 = 2,330 s); the same factor on Qwen2.5-7B "
        "(198.8 min x 0.8865 = 10,574 s) gives 13,099 s of training, 15,576 s end to end at "
        "15.9%, in which its 19,259 GB must drain: 19,259 GB / 15,576 s = 1.236 GB/s. "
        "LayerCheck's published shares (10.7-12.0%) then hold with tracking_fraction"), band=WRITE_BAND)),
    "load_fixed_s": FigureSpec("s", "deepspeed, checkfreq, gemini, lowdiff",
                               "fixed part of loading a full checkpoint (open, metadata, placement)",
        band=LOAD_FIXED_RULE,
        default=Figure(value=4.0, source="fit", method=(
        f"{PAPER}: LayerCheck recovers Qwen2.5-7B (106.6 GB) in 10 s and Llama-3.2-1B (17.3 GB) "
        "in 5 s: 4.0 s + bytes / 17.9 GB/s (Qwen2.5-3B predicted 6.4 s, published 7 s)"), band=READ_FIXED_BAND)),
    "load_gbps": FigureSpec("GB/s", "deepspeed, gemini (storage tier), lowdiff (base)",
                            "loading a full checkpoint saved synchronously",
        band=STORAGE_RULE,
        default=Figure(value=17.9, source="fit", method="see load_fixed_s: the same Lustre reads", band=READ_BAND)),
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


class DeepSpeed(Strategy):
    """DeepSpeed default: a synchronous full checkpoint every ``every`` steps; training
    stalls for the whole write. Native: Daly's interval for that write."""
    name = "deepspeed"
    label = "synchronous full save (engine.save_checkpoint)"
    rollback = True
    storage_tier = "snap"

    def _native(self, workload, costs, mtbf_s) -> Cadence:
        return Cadence(every=_daly_steps(costs.save_s(workload.full_bytes), workload, mtbf_s))

    def _checkpoints(self, b: _Builder) -> None:
        at = b.every(b.cadence.every)
        b.snap[at] = b.costs.save_s(b.full)
        b.commit[at] = True
        b.bytes[at] = b.full


STRATEGIES = (DeepSpeed,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
