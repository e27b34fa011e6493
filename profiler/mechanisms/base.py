"""The base of every measurement, and what each one gets (``Bench``).

Contract: ``Mechanism.measure(bench)`` returns its ``figures`` (a dict of
``layercheck.contract.calibration.Figure``), measured on the bench's job, machine and
scratch folder. A ``collective`` mechanism runs on every rank of a ZeRO or
FSDP2 job at once (the real implementation is a collective there:
DeepSpeed's own checkpoint or DCP's save, ZeroLayerCheck or
FsdpLayerCheck); the others run on rank 0 alone, on ``bench.single()``: the
job itself in one process, or on several ranks a plain job of the same
model and settings (full, unsharded state), and say so.
"""
from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from layercheck.contract.calibration import Figure
from layercheck.contract.measurement import MEASURES

from ..errors import ProfilerError

__all__ = ["Bench", "Mechanism", "rate_figure", "timed", "GB"]

GB = 1e9
"""Rates are decimal GB/s, as ``layercheck.contract.calibration`` says."""


@dataclass(eq=False)
class Bench:
    job: Any
    """The capture's job (under ZeRO: this rank's part of it)."""
    trace: Any
    """The capture's trace (rank 0; None elsewhere)."""
    folder: Path
    """Scratch space on the storage the checkpoints go to (the same path on every rank)."""
    repeats: int
    say: Callable[[str], None] = print
    collective: bool = False
    """Whether the mechanism measuring now runs on every rank (set by the caller)."""
    _single: Any = field(default=None, repr=False)
    _count: int = 0

    @property
    def zero(self) -> bool:
        return self.job.ranks.world_size > 1

    @property
    def full_bytes(self) -> int:
        """The trace's full checkpoint: one version of every layer (weights + Adam moments)."""
        return int(self.trace.full_checkpoint_bytes)

    def single(self) -> Any:
        """The job single-process mechanisms are measured on (rank 0 only), with its
        optimizer state made by one real step."""
        if self._single is None:
            if not self.zero:
                self._single = self.job
            else:
                from ..jobs.plain import PlainJob
                self._single = PlainJob.prepare(self.job.config, say=lambda _: None)
                self._single.step(0)
        return self._single

    def where(self) -> str:
        """How single-process figures relate to the job, for their ``method``."""
        if not self.zero:
            return "in the capture's process, on its model and optimizer state"
        return (f"single process on rank 0 (a plain job of the same model and settings, full "
                f"unsharded state), not under the {self.job.ranks.world_size}-rank {self.job.setup} "
                "job")

    def scratch(self, name: str) -> Path:
        """A fresh folder for one measurement: made by rank 0 for every rank (a
        barrier) while a collective mechanism runs, else by the one process."""
        self._count += 1
        path = self.folder / f"{self._count:02d}-{name}"
        if self.job.ranks.is_coordinator:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        if self.collective:
            self.job.ranks.barrier()
        return path


class Mechanism:
    name = ""
    figures: tuple[str, ...] = ()
    """Every figure ``measure`` returns: what this mechanism registers (``check_coverage``).
    A named subclass gets it from the contract's declaration of its name
    (``layercheck.contract.measurement.CODE``, which holds its version beside it)."""
    stated: tuple[str, ...] = ()
    """Those of ``figures`` one machine cannot measure: ``measure`` reports them as their
    declared default (``stated_figures``)."""
    collective = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name:
            return
        if "figures" in cls.__dict__:
            raise ProfilerError(f"mechanism {cls.name!r} lists its figures itself: they are "
                                "declared once, in layercheck.contract.measurement.CODE")
        if cls.name not in MEASURES:
            raise ProfilerError(f"mechanism {cls.name!r} is not declared: add it, its version and "
                                "its figures to layercheck.contract.measurement.CODE")
        cls.figures = MEASURES[cls.name]

    def measure(self, bench: Bench) -> dict[str, Figure]:
        raise NotImplementedError

    def stated_figures(self) -> dict[str, Figure]:
        """``stated`` as their declarations' defaults (value, source and band), the method
        saying why they are not measured here."""
        from sim.calibrated import FIGURES
        out = {}
        for name in self.stated:
            default = FIGURES[name].default
            out[name] = dataclasses.replace(default, method=(
                f"not measurable on one machine ({self.name}): the declared default, "
                f"{default.method}"))
        return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def rate_figure(nbytes: int, samples: list[float], method: str) -> Figure:
    """A measured rate: ``nbytes`` over the median of ``samples`` seconds."""
    seconds = statistics.median(samples)
    return Figure(value=nbytes / seconds / GB, source="measured",
                  method=f"{method}; {nbytes:,} bytes over the median of {len(samples)} "
                         f"repeat(s), {seconds:.3f} s",
                  samples=tuple(samples), bytes=int(nbytes), seconds=seconds)
