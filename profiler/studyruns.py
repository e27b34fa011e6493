"""The training runs of a staleness study (``profiler.stalecost``): the reference,
the snapshot run and the recoveries, all of the plain job in this process.

A recovery resumes at a failure step f in one of the ways ``profiler.replicates``
names (its ``kind``): through ``LayerCheck.restore()`` of a copy of the LayerCheck
directory taken at f (``composite``, and ``exact`` from a LayerCheck whose base
checkpoint is f), that composite with some layers put back as they were at f
(``blocks``, ``embedding``), or from training states the snapshot run held in
memory (``twin``: the state at f; ``control``: the weights and optimizer state of
f - S_c with everything else of f). It then trains on with data order ``draw``.
"""
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


__all__ = ["Runs", "Reference", "Snapshot", "State", "Recovery", "Recovered", "link_copy",
           "lr_clock", "REORDER_SEED"]

REORDER_SEED = 104_729
"""Offsets the data-order seed of draw d (seed + d * this)."""


@dataclass
class Reference:
    losses: SequenceLosses
    train_loss: list[float]
    staleness: dict[float, np.ndarray]
    """Per threshold: S(t) for t = 1..T (NaN before the base checkpoint)."""
    written: dict[float, np.ndarray]
    writes: dict[str, int]
    params: np.ndarray
    """Parameters per layer, in the layer map's order."""
    embedding: np.ndarray
    """Per layer: whether it is an embedding (its own threshold, the paper's 10x)."""
    names: list[str]
    """Per layer: the parameter names it holds."""
    model: dict[str, Any]
    machine: dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """A copy of a LayerCheck directory as it was at ``step``."""

    kind: str
    """``composite`` (at ``threshold``) or ``exact``."""
    threshold: float | None
    step: int
    directory: Path
    config: Any


@dataclass(frozen=True)
class State:
    """A consistent training state held in memory: what a full checkpoint holds."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: tuple[Any, Any]
    position: int

    @classmethod
    def of(cls, job: PlainJob, step: int, position: int) -> "State":
        return cls(step, {k: v.detach().clone() for k, v in job.module.state_dict().items()},
                   copy.deepcopy(job.adam.state_dict()), copy.deepcopy(job.scheduler.state_dict()),
                   capture_rng(), position)


@dataclass(frozen=True)
class Recovery:
    """One recovery to run (``profiler.replicates`` names the kinds)."""

    kind: str
    threshold: float | None
    step: int
    """The failure step f: training goes on from f + 1."""
    draw: int
    stop: int
    """The last step trained."""
    evals: tuple[int, ...]
    """The steps after which the held-out sequences are evaluated."""
    staleness: float = 0.0
    staleness_lr: float = 0.0
    snapshot: Snapshot | None = None
    fresh: tuple[str, ...] = ()
    """Parameters put back as they were at f after the composite's restore."""
    rollback: int = 0
    """``control``: the steps of work lost (weights and optimizer state of f - rollback)."""


@dataclass
class Recovered:
    spec: Recovery
    max_layer_staleness: int
    sources: dict[str, int]
    losses: SequenceLosses
    identical: bool | None


def lr_clock(config: Any) -> np.ndarray:
    """clock[s]: the learning-rate-weighted steps after s optimizer steps, sum of lr /
    lr_peak over them (the job's schedule, ``profiler.jobs.job.lr_schedule``)."""
    factor = lr_schedule(config)
    return np.concatenate([[0.0], np.cumsum([factor(done) for done in range(config.steps)])])


class Runs:
    """The study's runs on one job; ``root`` holds every LayerCheck directory."""

    def __init__(self, config: Any, root: Path, say: Callable[[str], None]) -> None:
        """``config``: the study's ``profiler.stalecost.StaleCostConfig`` (not imported:
        stalecost runs these, one way)."""
        self.config, self.root, self.say = config, root, say
        self.capture = config.capture
        self.grid = config.grid()
        self.reference_run: Reference | None = None
        self.states: dict[int, State] = {}
        self._pristine: PlainJob | None = None
        self._copies = 0

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
        lcs = self._attach(job, "reference", {k: self._lc_config(k) for k in self.config.studied})
        steps = self.capture.steps
        layer_map = next(iter(lcs.values())).layer_map
        params = np.array([layer.numel for layer in layer_map], dtype=np.float64)
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
        self.reference_run = Reference(
            losses=SequenceLosses(np.asarray(self.grid), np.asarray(evals),
                                  np.asarray(tokens, float)).rounded(),
            train_loss=train_loss,
            staleness={k: weighted_staleness(w, params) for k, w in written.items()},
            written=written, writes=writes, params=params,
            embedding=np.array([layer.kind == "embedding" for layer in layer_map]),
            names=[list(layer.params) for layer in layer_map],
            model=job.source.describe(),
            machine={"device": job.device, "threads": job.config.threads, "torch": torch.__version__,
                     "cpu_count": os.cpu_count()})
        return self.reference_run

    # -- 2. the snapshots ---------------------------------------------------------------
    def snapshots(self, plan: dict[float, list[int]], hold: set[int],
                  exact_step: int | None) -> list[Snapshot]:
        """Train again to the last failure step (and held step), checking that every
        step repeats the reference; copy each failure step's directory aside and hold
        the training state of every step in ``hold`` in memory (``self.states``).
        ``exact_step``: also take a LayerCheck whose base checkpoint is that step."""
        reference = self.reference_run
        configs: dict[Any, Any] = {k: self._lc_config(k) for k in plan}
        if exact_step is not None:
            main = self.config.main_threshold
            configs["exact"] = self._lc_config(
                main, warmup_steps=exact_step, smax=max(self._lc_config(main).smax, exact_step))
        last = max([t for v in plan.values() for t in v] + list(hold))
        job = self._job()
        lcs = self._attach(job, "snapshot-run", configs)
        out: list[Snapshot] = []
        position = 0
        if 0 in hold:
            self.states[0] = State.of(job, 0, 0)
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
                if t in hold:
                    self.states[t] = State.of(job, t, position)
                for key, lc in lcs.items():
                    if t in (plan.get(key, []) if key != "exact" else [exact_step]):
                        lc.flush()
                        where = self.root / "snapshots" / f"{key if key == 'exact' else f'{key:g}'}-{t}"
                        link_copy(lc.store.root, where)
                        out.append(Snapshot("exact" if key == "exact" else "composite",
                                            None if key == "exact" else key, t, where, configs[key]))
        finally:
            for lc in lcs.values():
                lc.close()
        return out

    # -- 3. a recovery --------------------------------------------------------------------
    def recover(self, spec: Recovery) -> Recovered:
        """Resume as ``spec`` says, train to ``spec.stop`` with data order ``spec.draw``,
        evaluating after each step of ``spec.evals``."""
        job = self._job()
        sources: dict[str, int] = {}
        if spec.snapshot is not None:
            sources, position = self._restore(job, spec)
            if spec.fresh:
                self._put_back(job, self.states[spec.step], spec.fresh)
        else:
            state = self.states[spec.step]
            weights = self.states[spec.step - spec.rollback]
            _load(job, state, weights)
            position = state.position
        if spec.draw:
            job.dataset = dataclasses.replace(job.dataset, seed=job.dataset.seed + spec.draw
                                              * REORDER_SEED, _orders={})
        label = spec.kind if spec.threshold is None else f"{spec.kind} at threshold {spec.threshold:g}"
        self.say(f"staleness: {label} resumed at step {spec.step} (S = {spec.staleness:.1f} steps, "
                 f"data order {spec.draw}), training on to {spec.stop}")
        evals, train = [], []
        for step in range(spec.step + 1, spec.stop + 1):
            train.append(job.step(position)[0])
            position += self.capture.batch_size
            if step in spec.evals:
                evals.append(self._evaluate(job)[0])
        ref = self.reference_run
        losses = SequenceLosses(np.asarray(spec.evals, dtype=np.int64),
                                np.asarray(evals).reshape(len(spec.evals), -1), ref.losses.tokens)
        identical = None
        if spec.kind == "exact":
            mine = np.round(losses.loss, 6)
            identical = bool(np.array_equal(mine, ref.losses.loss[[ref.losses.at(s) for s in spec.evals]])
                             and train == ref.train_loss[spec.step:spec.stop])
        return Recovered(spec, max((spec.step - s for s in sources.values()), default=spec.rollback),
                         sources, losses.rounded(), identical)

    def _restore(self, job: PlainJob, spec: Recovery) -> tuple[dict[str, int], int]:
        """``LayerCheck.restore()`` of a fresh copy of the snapshot (a restore records a
        new timeline in its directory: every recovery gets the directory as it was)."""
        self._copies += 1
        where = self.root / "restores" / f"{self._copies}"
        link_copy(spec.snapshot.directory, where)
        lc = job.make_layercheck(where, spec.snapshot.config)
        try:
            t = lc.restore()
            sources = {name: int(v.step) for name, v in lc.restored.plan.sources.items()}
            position = int(lc.extra["position"])
        finally:
            lc.close()
        shutil.rmtree(where, ignore_errors=True)
        if t != spec.step:
            raise ProfilerError(f"restored step {t}, expected the failure step {spec.step}")
        return sources, position

    @staticmethod
    def _put_back(job: PlainJob, state: State, names: tuple[str, ...]) -> None:
        """Parameters ``names`` and their optimizer state as they were in ``state``."""
        held = copy.deepcopy(state.optimizer["state"])
        wanted = set(names)
        named = dict(job.module.named_parameters())
        order = [p for group in job.adam.param_groups for p in group["params"]]
        index = {id(p): i for i, p in enumerate(order)}
        with torch.no_grad():
            for name in wanted:
                param = named[name]
                param.copy_(state.model[name])
                i = index[id(param)]
                if i in held:
                    job.adam.state[param] = held[i]
                else:
                    job.adam.state.pop(param, None)


def _load(job: PlainJob, state: State, weights: State) -> None:
    """``job`` as a full checkpoint of ``state`` restores it, except the weights and the
    optimizer's per-parameter state, taken from ``weights`` (``state`` itself: exact)."""
    job.module.load_state_dict(weights.model)
    # load_state_dict keeps the given tensors where it can: Adam would update the held
    # state in place, so it gets a copy
    job.adam.load_state_dict({"state": copy.deepcopy(weights.optimizer["state"]),
                              "param_groups": copy.deepcopy(state.optimizer["param_groups"])})
    job.scheduler.load_state_dict(copy.deepcopy(state.scheduler))
    apply_rng(*state.rng)


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
