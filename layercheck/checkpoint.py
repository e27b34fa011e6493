"""LayerCheck: the object a training loop holds.

    lc = LayerCheck(model, optimizer, "ckpt/", LayerCheckConfig(), scheduler=scheduler)
    step = lc.restore()                  # 0 on a fresh directory, else the last completed step
    for step in range(step + 1, total + 1):
        ...; optimizer.step(); scheduler.step()
        lc.step(extra={"epoch": epoch})  # once after every optimizer step
    lc.close()                           # waits for pending writes

Call order: construct, then ``restore()`` once before training (it also
marks where the new timeline starts), then ``step()`` after every optimizer
step, then ``close()``. ``extra`` (JSON-serialisable) comes back in
``lc.extra`` after ``restore()``: the place for the data position.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from .config import LayerCheckConfig
from .drift import DriftTracker
from .errors import CheckpointNotFound, LayerCheckError
from .layermap import LayerMap
from .manifest import (FORMAT, MANIFEST, ManifestView, encode_record, read_manifest,
                       read_verified, seal_torn_tail)
from .policy import Decision, Policy, PolicyState, Reason
from .recovery import iter_layers, make_plan, parse_safetensors
from .retention import Retention
from .snapshot import apply_layer, apply_state, capture_layer, capture_state, tensors_nbytes
from .store import Store, open_store
from .writer import LayerSnapshot, StepJob, Writer, WriteRecord

__all__ = ["LayerCheck", "StepReport", "RestoreReport"]

log = logging.getLogger("layercheck")
MODEL_CONFIG = "model_config.json"


@dataclass(frozen=True)
class StepReport:
    """What ``step()`` did: the decision, the drift added, and its costs."""

    step: int
    decision: Decision
    drift: np.ndarray
    lr: float
    drift_s: float
    stall_s: float
    bytes_queued: int


@dataclass(frozen=True)
class RestoreReport:
    """What ``restore()`` did; ``plan`` is None on a fresh start."""

    step: int
    plan: Any
    plan_s: float
    load_s: float
    restore_s: float
    bytes: int


class LayerCheck:
    """Layer-wise checkpointing of a model + optimizer (+ scheduler) into ``directory``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 directory: "str | Store", config: LayerCheckConfig | None = None, *,
                 scheduler: Any = None, layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.config = config or LayerCheckConfig()
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.layer_map = layer_map or (LayerMap.explicit(model, self.config.layers)
                                       if self.config.layers else LayerMap.auto(model))
        self.policy = Policy.from_config(self.config, self.layer_map.names, self.layer_map.kinds)
        self.state = PolicyState(policy=self.policy)
        self.lr_peak = self.config.lr_peak or max(
            float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups)
        self.store = open_store(directory, **dict(storage_options or {}))
        self.store.lock()
        self._closed = False
        try:
            self._init_directory()
        except BaseException:
            self.store.unlock()
            raise
        self.drift = DriftTracker(optimizer, [[p for _, p in self.layer_map.parameters(i)]
                                              for i in range(len(self.layer_map))],
                                  sampling=self.config.drift_sampling)
        self.writer = Writer(self.store, queue_bytes=self.config.queue_bytes,
                             on_error=self.config.on_error)
        self.current_step = 0
        self.extra: dict[str, Any] | None = None
        self.last_report: StepReport | None = None
        self.restored: RestoreReport | None = None
        self._restore_called = False
        self._retry: set[int] = set()

    # -- lifecycle -----------------------------------------------------------
    def _init_directory(self) -> None:
        if seal_torn_tail(self.store):
            log.warning("layercheck: %s ended in a torn record (a crash mid-append); it is "
                        "skipped, and new records start on a line of their own", MANIFEST)
        view = read_manifest(self.store)
        if view.header is not None:
            self.layer_map.check_signature(view.header["layers"])
            return
        header = {"kind": "header", "format": FORMAT, "layers": self.layer_map.signature(),
                  "config": self.config.to_dict(), "lr_peak": self.lr_peak,
                  "created": time.time()}
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            self.store.write_atomic(MODEL_CONFIG, config.to_json_string().encode())
        self.store.append(MANIFEST, encode_record(header))

    def close(self) -> None:
        """Wait for every pending write to commit, then release the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self.writer.close()
        finally:
            self.drift.remove()
            self._release()

    def _release(self) -> None:
        """Give the directory back (its lock)."""
        self.store.unlock()

    def flush(self) -> None:
        """Wait until everything submitted so far is committed."""
        self.writer.flush()

    def __enter__(self) -> "LayerCheck":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recovery --------------------------------------------------------------
    def restore(self, step: int | None = None) -> int:
        """Restore the composite state of ``step`` (default: the newest committed
        step) into the live model, optimizer, scheduler and RNGs. Returns the
        restored step t (0 when there is nothing to restore): train on from t+1."""
        start = time.perf_counter()
        view = read_manifest(self.store)
        for problem in view.problems:
            warnings.warn(f"layercheck: {problem}", stacklevel=2)
        try:
            plan = make_plan(self.store, view, step, verify=False)
        except CheckpointNotFound as exc:
            if step is not None or view.states:
                raise
            log.info("layercheck: %s; starting from step 0", exc)
            self._begin_timeline(0, view)
            self.restored = RestoreReport(0, None, time.perf_counter() - start, 0.0, 0.0, 0)
            return 0
        plan_s = time.perf_counter() - start
        load_s = restore_s = 0.0
        for loaded in iter_layers(self.store, view, plan, self.layer_map.names):
            load_s += loaded.load_s
            t0 = time.perf_counter()
            apply_layer(self.layer_map, self.optimizer, self.layer_map.index[loaded.name],
                        loaded.tensors)
            restore_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        tensors, metadata = parse_safetensors(read_verified(self.store, plan.state), plan.state.file)
        doc = apply_state(tensors, metadata, self.optimizer, self.scheduler)
        restore_s += time.perf_counter() - t0
        for message in plan.warnings:
            warnings.warn(f"layercheck: {message}", stacklevel=2)
        self.extra = doc.get("extra")
        self._begin_timeline(plan.step, view, base_taken=True)
        self.restored = RestoreReport(plan.step, plan, plan_s, load_s, restore_s,
                                      sum(v.bytes for v in plan.sources.values()))
        return plan.step

    def _begin_timeline(self, step: int, view: ManifestView, *, base_taken: bool = False) -> None:
        """Everything recorded beyond ``step`` is abandoned; counting restarts at ``step``.
        Restored layers equal their saved copies, so their drift starts at zero.
        ``view`` is the manifest as read before (nothing was written since); it is
        brought up to date in memory rather than read again."""
        self.writer.flush()
        resume = {"kind": "resume", "step": step}
        self._append(resume)
        view.apply(resume)
        self.current_step = step
        self.state = PolicyState(policy=self.policy)
        self.state.last_written[:] = step
        self.state.base_step = step if base_taken else None
        self.drift.take()
        self.drift.resync()
        if self.config.keep_versions is not None:
            self.writer.retention = Retention(self.config.keep_versions, view)
        self._restore_called = True

    def _append(self, record: dict[str, Any]) -> None:
        """Append one manifest record (the writer appends the rest)."""
        self.store.append(MANIFEST, encode_record(record))

    def _read_manifest(self) -> ManifestView:
        return read_manifest(self.store)

    def _start_without_restore(self) -> None:
        """A run that never called restore(): fine on an empty directory; on one
        holding checkpoints, starting over would abandon them, so refuse."""
        view = self._read_manifest()
        newest = view.latest_step()
        if newest is not None:
            raise LayerCheckError(
                f"{self.store.url} holds checkpoints up to step {newest}: call restore() before "
                "the first step() to resume from them, or use a new directory to start over")
        self._begin_timeline(0, view)

    # -- training --------------------------------------------------------------
    def step(self, extra: Mapping[str, Any] | None = None) -> StepReport:
        """Account one optimizer step; at an opportunity, snapshot the chosen
        layers and the training state and queue them for the writer."""
        if self._closed:
            raise LayerCheckError("step() after close(): create a new LayerCheck to go on")
        if not self._restore_called:
            self._start_without_restore()
        self.writer.raise_if_failed()
        self.current_step += 1
        t = self.current_step
        drift, lr, drift_s = self.drift.take()
        decision = self.state.observe(t, drift, lr / self.lr_peak if np.isfinite(lr) else 1.0)
        decision = self._add_failed(decision)
        start = time.perf_counter()
        queued = 0
        if self.policy.is_opportunity(t) and self.state.base_step is not None:
            queued = self._submit(t, decision, extra)
        report = StepReport(t, decision, drift, lr, drift_s, time.perf_counter() - start, queued)
        self.last_report = report
        return report

    def _submit(self, t: int, decision: Decision, extra: Mapping[str, Any] | None) -> int:
        snaps = []
        for index, reason in zip(decision.layers.tolist(), decision.reasons.tolist()):
            tensors = capture_layer(self.layer_map, self.optimizer, index)
            snaps.append(LayerSnapshot(index, self.layer_map.names[index], Reason(reason).label,
                                       tensors, tensors_nbytes(tensors)))
        state = capture_state(t, self.optimizer, self.scheduler, extra)
        job = StepJob(step=t, layers=snaps, state=state,
                      nbytes=sum(s.nbytes for s in snaps) + tensors_nbytes(state[0]))
        self.writer.submit(job)
        return job.nbytes

    def _add_failed(self, decision: Decision) -> Decision:
        """Under on_error='warn', layers whose write failed join the next opportunity."""
        self._retry |= self.writer.take_failed_layers()
        if not self._retry or not self.policy.is_opportunity(decision.step):
            return decision
        extra = sorted(self._retry - set(decision.layers.tolist()))
        self._retry = set()
        self.state.mark_written(decision.step, extra)
        layers = np.concatenate([decision.layers, np.array(extra, dtype=np.int64)])
        reasons = np.concatenate([decision.reasons, np.full(len(extra), Reason.RETRY,
                                                            dtype=np.int64)])
        order = np.argsort(layers, kind="stable")
        return Decision(decision.step, layers[order], reasons[order])

    # -- introspection ---------------------------------------------------------
    def drain_writes(self) -> list[WriteRecord]:
        """Layer versions committed since the last call (for profiling)."""
        return self.writer.drain_completed()

    @property
    def bytes_written(self) -> int:
        return self.writer.bytes_written
