"""CheckFreq's two-phase checkpoint on a live job, as its authors built it.

What ``sim.strategies.CheckFreq`` models, for real (Mohan et al., FAST 2021;
msr-fiddle/CheckFreq, whose manager snapshots in the background and makes the
training loop wait before its weight update):

- ``save(step)`` first waits until the previous checkpoint's persist has
  finished (a second snapshot never overlaps a persist), takes the small
  non-tensor part (step, data position, scheduler) at once, and starts a
  background thread; it returns without copying a tensor;
- the thread copies every state tensor (weights, Adam moments, steps) into
  preallocated host buffers (the snapshot, ``snapshot_gbps``) while the
  training thread runs the next step's forward and backward pass;
- an optimizer step pre-hook makes the next weight update wait until the
  snapshot is complete, so the copy is of the weights the save was asked for
  (the training thread's only stall besides the persist wait, ``held_s``);
- the same thread then writes the buffers with
  ``torch.distributed.checkpoint.save`` and fsyncs (the persist,
  ``persist_gbps``); a folder is a recovery point once DCP's ``.metadata``
  exists, and the older folders are removed then;
- ``load()`` reads the newest durable folder into the live tensors with
  ``dcp.load`` (``async_load_gbps``).

Contract (``profiler.checkpointers.base``): ``load``, ``due``, ``save``, ``held_s``
(after every training step: the seconds that step waited for a snapshot),
``flush``, ``close``. ``last`` holds the phases of the newest completed save.
"""
from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base import Checkpointer, Resume, Saved, single_process
from ..state import TrainingState

__all__ = ["Phases", "TwoPhaseCheckpointer"]


@dataclass(frozen=True)
class Phases:
    """The two phases of one save, in seconds, as its background thread timed them."""

    snapshot_s: float
    """The copy into host memory (it ran alongside the next step's compute)."""
    persist_s: float
    """The write of that copy: DCP's files and ``.metadata``, fsynced."""


class TwoPhaseCheckpointer(Checkpointer):
    method = ("CheckFreq's two phases: a background thread copies the state into "
              "preallocated host buffers while the next step's forward and backward run "
              "(an optimizer step pre-hook holds the weight update until the copy is "
              "complete), then writes them with torch.distributed.checkpoint.save and fsyncs")

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        super().__init__(job, folder, interval=interval)
        self.state = TrainingState(job.model, job.optimizer, job.scheduler)
        self.last: Phases | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._snapshotted = threading.Event()
        self._snapshotted.set()
        self._failure: BaseException | None = None
        self._held = 0.0
        self._hook: Any = None

    # -- save ---------------------------------------------------------------------
    def save(self, step: int, position: int) -> Saved:
        start = time.perf_counter()
        self.wait()
        if self._hook is None:  # registered at the first save: a load-only use adds nothing
            self._hook = self.job.optimizer.register_step_pre_hook(self._before_update)
        live = self.state.tensors()
        buffers = self._host_buffers(live)
        meta = self.state.meta(step, position)
        self._snapshotted.clear()
        self._thread = threading.Thread(
            target=self._two_phases, args=(live, buffers, meta, self.folder / f"step{step}"),
            name="checkfreq-snapshot", daemon=True)
        self._thread.start()
        return Saved(time.perf_counter() - start, bytes=sum(
            t.numel() * t.element_size() for t in buffers.values()))

    def held_s(self) -> float:
        held, self._held = self._held, 0.0
        return held

    def _before_update(self, *_: Any) -> None:
        """The weights are about to change: the snapshot must have read them."""
        if not self._snapshotted.is_set():
            start = time.perf_counter()
            self._snapshotted.wait()
            self._held += time.perf_counter() - start
        self._raise_failure()

    @staticmethod
    def persist(buffers: dict[str, torch.Tensor], meta: dict[str, Any], target: Path) -> None:
        """Write a host copy (state tensors and ``TrainingState.meta``) as one save folder
        that ``load`` reads: DCP's files, fsynced, ``.metadata`` last. GEMINI's storage
        tier writes its copies with this too."""
        import torch.distributed.checkpoint as dcp
        with single_process():
            dcp.save({"tensors": buffers, "meta": meta}, checkpoint_id=str(target), no_dist=True)

    def _two_phases(self, live: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    meta: dict[str, Any], target: Path) -> None:
        try:
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    for key, tensor in live.items():
                        buffers[key].copy_(tensor)
            finally:
                self._snapshotted.set()
            copied = time.perf_counter()
            self.persist(buffers, meta, target)
            self.last = Phases(copied - start, time.perf_counter() - copied)
            self._prune(keep=target)
        except BaseException as exc:  # re-raised in the training thread
            self._failure = exc

    def _host_buffers(self, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One set, reused: the previous persist is done when a save asks for it."""
        if [(k, t.shape, t.dtype) for k, t in self._buffers.items()] != \
                [(k, t.shape, t.dtype) for k, t in live.items()]:
            # zeros, not empty: the pages are touched here, not inside the first snapshot
            self._buffers = {k: torch.zeros_like(t, device="cpu") for k, t in live.items()}
        return self._buffers

    def wait(self) -> float:
        """Block until the previous save's persist has finished (it is then durable);
        returns the seconds waited."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_failure()
        return time.perf_counter() - start

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise RuntimeError(f"CheckFreq's background save failed: {failure}") from failure

    def durable(self) -> list[Path]:
        """Complete saves, oldest first (DCP writes ``.metadata`` last)."""
        return sorted((p for p in self.folder.glob("step*") if (p / ".metadata").exists()),
                      key=lambda p: int(p.name[4:]))

    # -- load ---------------------------------------------------------------------
    def load(self) -> Resume | None:
        import torch.distributed.checkpoint as dcp
        done = self.durable()
        if not done:
            return None
        state = {"tensors": self.state.tensors(), "meta": self.state.meta(0, 0)}
        with single_process():
            dcp.load(state, checkpoint_id=str(done[-1]), no_dist=True)
        step, position = self.state.apply_meta(state["meta"])
        return Resume(step, position)

    # -- the rest -------------------------------------------------------------------
    def flush(self) -> None:
        self.wait()

    def close(self) -> None:
        """Leaves a persist in flight to finish on its own (a job's last save is not
        waited for) and takes the pre-hook off the optimizer."""
        if self._hook is not None:
            self._snapshotted.wait()
            self._hook.remove()
            self._hook = None
        self._thread = None

    def _prune(self, keep: Path) -> None:
        for old in self.folder.glob("step*"):
            if old != keep and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
