"""The strategies a validation runs for real: each one's checkpointer, declared once.

``REAL`` holds one ``RealStrategy`` per strategy, keyed by the simulator's strategy class
(``sim.strategies``: its name is the strategy's name everywhere) and in its report order.
Each record names the checkpointer class that runs the strategy on a live job (one
module of this package each, imported only when a worker builds one: this module is
torch-free, so the CLI lists the strategies without loading torch) and what the
validation needs to know about it: the keywords it takes at a cadence, whether it makes
full saves on the training thread (the probe beside a run times them), how the
simulator prices its recovery's load, whether it needs a peer process, and whether it
recovers layer by layer. The profiler (``failures``: the validation, its probe, its
supervisor, its workers) reads these records and never a strategy's name.

The checkpointers (``base``'s contract):

- ``full.FullCheckpointer`` (DeepSpeed): a synchronous full save of model and optimizer;
- ``twophase.TwoPhaseCheckpointer`` (CheckFreq): a snapshot to host memory in the
  background while the next step computes, then its persist with ``dcp.save``;
- ``inmemory.PeerCheckpointer`` (GEMINI): host copies sent to a peer process's memory
  (``peerstore``) over loopback, storage as the last tier;
- ``differential.DiffCheckpointer`` (LowDiff): compressed training, each step's
  differential queued to a writer process (``diffwriter``), full saves every k steps;
- ``layerwise.LayerCheckpointer`` (LayerCheck): the library itself;
- ``tiered.TieredCheckpointer`` (tiered): the library with its memory tier
  (``TierConfig``), whose node folder the supervisor wipes at a node's loss.

The calibration (``profiler.mechanisms``) times these very classes, so what is costed is
what runs. A new strategy run for real: its checkpointer module here and its record in
``REAL`` (docs/architecture.md, "Recipes").
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from sim.strategies import CheckFreq, DeepSpeed, Gemini, LayerCheck, LowDiff, Strategy, Tiered

from ..errors import ProfilerError

__all__ = ["RealStrategy", "REAL", "VALIDATED", "real", "checkpointer_class"]


def _no_options(cadence: Any, costs: Any) -> dict[str, Any]:
    return {}


def _tiered(cadence: Any, costs: Any) -> dict[str, Any]:
    """A second, storage tier every ``cadence.storage_every`` steps."""
    return {"storage_every": cadence.storage_every}


def _batched(cadence: Any, costs: Any) -> dict[str, Any]:
    """Differentials written ``cadence.batch`` at a time (the calibration's batch when unset)."""
    return {"batch": cadence.batch or costs.diff_batch}


@dataclass(frozen=True, kw_only=True)
class RealStrategy:
    """One strategy run for real (module doc)."""

    model: type[Strategy]
    """The simulator's model of it; its ``name`` is the strategy's name."""
    module: str
    """The module of this package that holds its checkpointer."""
    checkpointer: str
    """Its checkpointer class, a ``base.Checkpointer`` in ``module``."""
    options: Callable[[Any, Any], dict[str, Any]] = _no_options
    """The checkpointer's own keywords at a ``sim.strategies.Cadence`` with a
    ``sim.costs.CostModel`` (a run's, and its probe's)."""
    full_saves: bool = False
    """It saves the full state on the training thread every ``interval`` steps."""
    differentials: bool = False
    """Between those saves, every step hands a differential to its writer: the probe
    times each step's and takes the hand-off off the full saves."""
    load: tuple[str, str] | None = None
    """The ``CostModel`` method that prices its recovery's load of the full bytes, and the
    rate in it that the probe's timed load replaces; None: the probe times no load."""
    peer: bool = False
    """It needs a peer process (``peerstore``) that outlives its workers."""
    layerwise: bool = False
    """It recovers layer by layer: the ledger weighs each layer's staleness by its
    parameter share, and its first recovery point is the end of the job's warm-up."""
    node_memory: bool = False
    """It keeps a memory tier in a folder of the node's (``tier``, given by the
    supervisor), which outlives its workers: per failure the validation draws whether it
    lost only processes, the node (the folder wiped, the buddy's copy kept) or the node and
    its buddy (the folder wiped), as the simulator's draws say."""
    every: int | None = None
    """The one interval its checkpointer runs at, whatever the validation's (the memory
    tier copies every step: 1); None: the validation's cadence."""
    probed: tuple[str, ...] = ()
    """The calibration mechanisms (``profiler.mechanisms``, by name) whose measured figures
    the probe beside each run times again on the machine as it is then, in place of
    costs.json's (``profiler.failures.costprobe``)."""

    @property
    def name(self) -> str:
        return self.model.name

    def checkpointer_class(self) -> type:
        """The checkpointer class (imports torch)."""
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.checkpointer)

    def first_point(self, job: Any, every: int) -> int:
        """The step of its first recovery point at interval ``every`` (``job``: a
        ``CaptureConfig``)."""
        return job.resolved_warmup if self.layerwise else every


REAL: dict[str, RealStrategy] = {r.name: r for r in (
    RealStrategy(model=DeepSpeed, module="full", checkpointer="FullCheckpointer",
                 full_saves=True, load=("load_s", "load_gbps")),
    RealStrategy(model=CheckFreq, module="twophase", checkpointer="TwoPhaseCheckpointer",
                 load=("async_load_s", "async_load_gbps")),
    RealStrategy(model=Gemini, module="inmemory", checkpointer="PeerCheckpointer",
                 options=_tiered, peer=True),
    RealStrategy(model=LowDiff, module="differential", checkpointer="DiffCheckpointer",
                 options=_batched, full_saves=True, differentials=True,
                 load=("load_s", "load_gbps")),
    RealStrategy(model=LayerCheck, module="layerwise", checkpointer="LayerCheckpointer",
                 load=("lc_load_s", "lc_load_gbps"), layerwise=True),
    RealStrategy(model=Tiered, module="tiered", checkpointer="TieredCheckpointer",
                 load=("tier_load_s", "tier_restore_gbps"), layerwise=True, node_memory=True,
                 every=1, probed=("memory tier", "memory tier thread")),
)}
"""Every strategy run for real, by name, in report order."""

VALIDATED: tuple[str, ...] = tuple(REAL)
"""Their names, in report order (what ``python -m profiler validate`` runs by default)."""


def real(name: str) -> RealStrategy:
    """The strategy called ``name`` run for real; an unknown name is an error that lists them."""
    try:
        return REAL[name]
    except KeyError:
        raise ProfilerError(f"no checkpointer runs {name!r} for real; choose from "
                       f"{', '.join(REAL)}") from None


def checkpointer_class(name: str) -> type:
    """The checkpointer class of the strategy called ``name`` (imports torch)."""
    return real(name).checkpointer_class()
