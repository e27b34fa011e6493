"""The paper's published figures and the published failure regimes: data only, no numpy.

``sim.presets`` builds the presets from them; ``python -m sim`` declares its choices
(``--preset``, ``--regime``) from them before anything heavy loads.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PAPER", "Published", "PUBLISHED", "PRESET_NAMES", "DEFAULT_PRESET", "Regime", "REGIMES"]

PAPER = ("Sun, Huang, Guo, Tallent, Sato, Dai. LayerCheck: Adaptive Layer-wise Checkpointing "
         "for Large Language Model Post-training. IEEE CLUSTER 2026 (arXiv 2609.27193)")


@dataclass(frozen=True, kw_only=True)
class Published:
    """The paper's figures for one model (OpenThoughts, default threshold)."""

    layer_writes: int
    checkpoints: int
    total_gb: float
    layercheck_minutes: float | None
    """End-to-end time with per-iteration LayerCheck (None: not reported)."""
    lowdiff_total_gb: float
    staleness: float | None = None
    """Observed parameter-weighted average staleness (steps), where reported."""
    max_staleness: int | None = None
    """Maximum per-layer staleness at the end of the run (steps), where reported."""


PUBLISHED: dict[str, Published] = {
    "qwen2.5-7b": Published(layer_writes=319, checkpoints=277, total_gb=1205,
                            layercheck_minutes=198.8, lowdiff_total_gb=19259, staleness=106,
                            max_staleness=800),
    "qwen2.5-3b": Published(layer_writes=340, checkpoints=273, total_gb=376,
                            layercheck_minutes=None, lowdiff_total_gb=8513),
    "llama-3.2-1b": Published(layer_writes=266, checkpoints=242, total_gb=265,
                              layercheck_minutes=43.8, lowdiff_total_gb=3837),
}
PRESET_NAMES = tuple(PUBLISHED)
DEFAULT_PRESET = "qwen2.5-7b"


@dataclass(frozen=True, kw_only=True)
class Regime:
    """A published failure regime: ``interruptions`` in ``days`` on ``gpus`` GPUs."""

    gpus: int
    interruptions: int
    days: float
    source: str

    @property
    def job_mtbf_s(self) -> float:
        return self.days * 86400.0 / self.interruptions

    @property
    def gpu_mtbf_s(self) -> float:
        return self.job_mtbf_s * self.gpus

    def node_mtbf_s(self, gpus_per_node: int) -> float:
        """One node's MTBF behind the record, every interruption charged to a node."""
        return self.days * 86400.0 / self.interruptions * (self.gpus / gpus_per_node)


REGIMES = {"llama3-405b": Regime(
    gpus=16384, interruptions=419, days=54,
    source="Llama 3 herd of models (Meta, 2024): 419 unexpected interruptions in 54 days "
           "of pre-training on 16,384 H100 GPUs (one every ~3.1 h)")}
