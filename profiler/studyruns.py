"""The training runs of a staleness study (``profiler.stalecost``): the reference,
the snapshot run and the recoveries, all of the plain job in this process."""
from __future__ import annotations

import copy
import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from layercheck.snapshot import apply_rng, capture_rng
from layercheck.contract.trace import weighted_staleness

from .config import PAPER
from .convergence import SequenceLosses
from .errors import ProfilerError
from .jobs.job import lr_schedule
from .jobs.plain import PlainJob


__all__ = ["Runs", "Reference", "Snapshot", "Recovered"]

REORDER_SEED = 104_729
"""Offsets the data-order seed of a reorder control (the r-th: seed + r * this)."""


@dataclass
class Reference:
    losses: SequenceLosses
    train_loss: list[float]
    staleness: dict[float, np.ndarray]
    """Per threshold: S(t) for t = 1..T (NaN before the base checkpoint)."""
    written: dict[float, np.ndarray]
    writes: dict[str, int]
    model: dict[str, Any]
    machine: dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    kind: str
    """``composite``, ``exact`` or ``reorder``."""
    threshold: float | None
    step: int
    directory: Path
    config: Any
    staleness: float
    reorder: int = 0


@dataclass
class Recovered:
    kind: str
    threshold: float | None
    failure_step: int
    staleness: float
    max_layer_staleness: int
    sources: dict[str, int]
    losses: SequenceLosses
    identical: bool | None


class Runs:
    """The study's runs on one job; ``root`` holds every LayerCheck directory."""

    def __init__(self, config: Any, root: Path, say: Callable[[str], None]) -> None:
        """``config``: the study's ``profiler.stalecost.StaleCostConfig`` (not imported:
        stalecost runs these, one way)."""
        self.config, self.root, self.say = config, root, say
        self.capture = config.capture
        self.grid = config.grid()
        self.reference_run: Reference | None = None
        self._pristine: PlainJob | None = None

    # -- building blocks ----------------------------------------------------------
    def _job(self) -> PlainJob:
        """The job before its first step: built once, then copied (a copy is the
        same state as a new build, in a fraction of its time; the exact control
        checks that it trains the same)."""
        if self._pristine is None:
            self._pristine = PlainJob.prepare(self.capture, say=lambda _: None)
            self._rng = capture_rng()
        job = copy.deepcopy(self._pristine)
        apply_rng(*self._rng)  # dropout draws from torch's global generators: as a new process
        # a scheduler copied with its optimizer loses its hold on optimizer.step (torch
        # wraps the method to check the call order); one made anew on the copy keeps it
        job.scheduler = torch.optim.lr_scheduler.LambdaLR(job.adam, lr_schedule(job.config))
        return job

    def _lc_config(self, threshold: float, **changes: Any) -> Any:
        """The job's LayerCheckConfig at base ``threshold``, embeddings keeping their
        factor over it (the paper's 10x), newest versions only (a recovery of the
        newest step needs no more)."""
        base = self.capture.layercheck_config(keep_versions=1)
        factor = (base.embedding_threshold / base.base_threshold if base.base_threshold > 0
                  else PAPER["embedding_factor"])
        return dataclasses.replace(base, base_threshold=threshold,
                                   embedding_threshold=threshold * factor, **changes)

    def _evaluate(self, job: PlainJob) -> tuple[list[float], list[int]]:
        limit = self.config.eval_sequences or len(job.dataset.heldout)
        return job.heldout_losses(limit)

    def _attach(self, job: PlainJob, name: str, configs: dict[Any, Any]) -> dict[Any, Any]:
        out = {}
        for key, cfg in configs.items():
            lc = job.make_layercheck(self.root / name / str(key), cfg)
            lc.restore()
            out[key] = lc
        return out

    # -- 1. the reference -----------------------------------------------------------
    def reference(self) -> Reference:
        job = self._job()
        lcs = self._attach(job, "reference", {k: self._lc_config(k) for k in self.config.thresholds})
        steps = self.capture.steps
        params = _layer_params(next(iter(lcs.values())))
        written = {k: np.zeros((steps, len(params)), dtype=bool) for k in lcs}
        sums, tokens = self._evaluate(job)
        evals, train_loss, position = [sums], [], 0
        try:
            for t in range(1, steps + 1):
                loss, _ = job.step(position)
                position += self.capture.batch_size
                train_loss.append(loss)
                for k, lc in lcs.items():
                    lc.step(extra={"position": position})
                    written[k][t - 1] = lc.state.last_written == t
                if t in self.grid:
                    evals.append(self._evaluate(job)[0])
                if t % 20 == 0 or t == steps:
                    self.say(f"staleness: reference step {t}/{steps}, loss {loss:.4f}")
            writes = {f"{k:g}": int(written[k].sum()) for k in lcs}
        finally:
            for lc in lcs.values():
                lc.close()
        staleness = {k: weighted_staleness(w, params) for k, w in written.items()}
        self.reference_run = Reference(
            losses=SequenceLosses(np.asarray(self.grid), np.asarray(evals), np.asarray(tokens, float)),
            train_loss=train_loss, staleness=staleness, written=written, writes=writes,
            model=job.source.describe(),
            machine={"device": job.device, "threads": job.config.threads, "torch": torch.__version__,
                     "cpu_count": os.cpu_count()})
        return self.reference_run

    # -- 2. the snapshots ---------------------------------------------------------------
    def snapshots(self, plan: dict[float, list[int]], reference: Reference) -> list[Snapshot]:
        """Train again to the last failure step and copy each failure step's directory
        aside; the controls' exact state is the main threshold's stalest step."""
        main = self.config.main_threshold
        exact_step = max(plan[main], key=lambda t: reference.staleness[main][t - 1])
        smax = max(self._lc_config(main).smax, exact_step)
        configs: dict[Any, Any] = {k: self._lc_config(k) for k in plan}
        configs["exact"] = self._lc_config(main, warmup_steps=exact_step, smax=smax)
        last = max(max(v) for v in plan.values())
        job = self._job()
        lcs = self._attach(job, "snapshot-run", configs)
        out: list[Snapshot] = []
        position = 0
        try:
            for t in range(1, last + 1):
                loss, _ = job.step(position)
                position += self.capture.batch_size
                if loss != reference.train_loss[t - 1]:
                    raise ProfilerError(
                        f"step {t}: the second run's loss {loss!r} differs from the reference's "
                        f"{reference.train_loss[t - 1]!r}; this job does not reproduce on this "
                        "machine (give --threads, or run on a device whose kernels are "
                        "deterministic), so recoveries could not see the reference's data order")
                for key, lc in lcs.items():
                    lc.step(extra={"position": position})
                    if key != "exact" and not np.array_equal(lc.state.last_written == t,
                                                              reference.written[key][t - 1]):
                        raise ProfilerError(f"step {t}: threshold {key:g} wrote other layers than "
                                            "in the reference run; drift does not reproduce here")
                out.extend(self._take(lcs, plan, t, exact_step, configs, reference))
        finally:
            for lc in lcs.values():
                lc.close()
        return out

    def _take(self, lcs: dict[Any, Any], plan: dict[float, list[int]], t: int, exact_step: int,
              configs: dict[Any, Any], reference: Reference) -> list[Snapshot]:
        taken = []
        for k, steps in plan.items():
            if t in steps:
                lcs[k].flush()
                where = self.root / "snapshots" / f"{k:g}-{t}"
                link_copy(lcs[k].store.root, where)
                taken.append(Snapshot("composite", k, t, where, configs[k],
                                      float(reference.staleness[k][t - 1])))
        if t == exact_step:
            lcs["exact"].flush()
            where = self.root / "snapshots" / f"exact-{t}"
            link_copy(lcs["exact"].store.root, where)
            taken.append(Snapshot("exact", None, t, where, configs["exact"], 0.0))
            for r in range(1, self.config.reorders + 1):
                copy = self.root / "snapshots" / f"reorder{r}-{t}"
                link_copy(where, copy)
                taken.append(Snapshot("reorder", None, t, copy, configs["exact"], 0.0, reorder=r))
        return taken

    # -- 3. a recovery --------------------------------------------------------------------
    def recover(self, snap: Snapshot) -> Recovered:
        job = self._job()
        lc = job.make_layercheck(snap.directory, snap.config)
        try:
            t = lc.restore()
            plan = lc.restored.plan
            sources = {name: int(v.step) for name, v in plan.sources.items()}
            position = int(lc.extra["position"])
        finally:
            lc.close()
        if t != snap.step:
            raise ProfilerError(f"restored step {t}, expected the failure step {snap.step}")
        if snap.reorder:
            job.dataset = dataclasses.replace(job.dataset, seed=job.dataset.seed + snap.reorder
                                              * REORDER_SEED, _orders={})
        label = snap.kind if snap.threshold is None else f"threshold {snap.threshold:g}"
        self.say(f"staleness: {label} recovered at step {t} (S = {snap.staleness:.1f} steps), "
                 f"training on to {self.capture.steps}")
        evals, steps, train = [], [], []
        for step in range(t + 1, self.capture.steps + 1):
            train.append(job.step(position)[0])
            position += self.capture.batch_size
            if step in self.grid:
                evals.append(self._evaluate(job)[0])
                steps.append(step)
        ref = self.reference_run.losses
        losses = SequenceLosses(np.asarray(steps), np.asarray(evals), ref.tokens)
        identical = None
        if snap.kind == "exact":
            identical = bool(np.array_equal(losses.loss, ref.loss[[ref.at(s) for s in steps]])
                             and train == self.reference_run.train_loss[t:])
        return Recovered(snap.kind, snap.threshold, t, snap.staleness,
                         max((t - s for s in sources.values()), default=0), sources, losses,
                         identical)


def _layer_params(lc: Any) -> np.ndarray:
    """Parameters per layer, in the layer map's order: staleness's weights, as the
    capture records them in a trace's layer table."""
    return np.array([layer.numel for layer in lc.layer_map], dtype=np.float64)


def link_copy(src: Path, dst: Path) -> None:
    """A copy of LayerCheck directory ``src`` at ``dst`` as it is now: committed
    files are immutable (written aside, then renamed), so they are hard-linked;
    files that grow in place (the manifest) are copied; locks are not."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.name.startswith("."):
            continue
        if path.is_dir():
            link_copy(path, dst / path.name)
        elif path.suffix in (".jsonl", ".json"):
            shutil.copy2(path, dst / path.name)
        else:
            os.link(path, dst / path.name)
