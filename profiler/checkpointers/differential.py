"""LowDiff's checkpointer on a live job: compressed training, per-step differentials to a writer process.

What ``sim.strategies.LowDiff`` models, for real:

- training is compressed, as in LowDiff's code: inside every optimizer step
  (a step pre-hook) each trainable parameter's gradient is top-k sparsified
  (``DENSITY`` of its entries) and the optimizer steps on that sparse
  gradient, so the differential (values and int32 indices) is exactly what
  the step applied. The compression is the training-side stall the
  simulator charges (``diff_snapshot_gbps``);
- after every step the differential is handed to a queue (a thread feeds it
  to the writer process, ``profiler.checkpointers.diffwriter``) and training goes on; every
  ``batch`` steps (the simulator's batches end at multiples of it) the
  writer seals the held differentials into one batch file, durable when
  renamed;
- every ``interval`` steps a full checkpoint is saved synchronously on the
  training thread, after the writer's backlog is written (the storage serves
  it after the queue, as the simulator says): ``FullCheckpointer``'s save,
  the mechanism ``save_gbps`` times;
- ``load()``: the newest full checkpoint (or the initial model, before the
  first), then the differentials after it, in step order and without a gap,
  replayed as optimizer steps (dense gradient from each differential, AdamW,
  the LR schedule): the state of the last replayed step, bit for bit
  (``replayed`` differentials, ``replay_times`` the seconds of each).

The calibration (``profiler.mechanisms.lowdiff``) times this very object.
"""
from __future__ import annotations

import math
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from .base import Checkpointer, Resume, Saved
from .full import FullCheckpointer
from .diffwriter import batch_files, frame, read_batch

__all__ = ["BATCH", "DENSITY", "DiffCheckpointer", "kept"]

WRITER = Path(__file__).with_name("diffwriter.py")

DENSITY = 0.01
"""Share of each gradient's entries kept: ASSUMED 1%, LowDiff's typical compression."""
BATCH = 2
"""Differentials written together: ASSUMED 2 (the LayerCheck paper's storage table
implies 1,692 / 914 = 1.85 steps per LowDiff write)."""


def kept(p: torch.Tensor) -> int:
    """Entries of ``p``'s gradient a differential keeps: ``DENSITY`` of them, at least one."""
    return max(1, math.ceil(DENSITY * p.numel()))


class DiffCheckpointer(Checkpointer):

    def __init__(self, job: Any, folder: Path, *, interval: int = 1, batch: int = BATCH) -> None:
        super().__init__(job, folder, interval=interval)
        self.batch = int(batch)
        self.full = FullCheckpointer(job, self.folder / "full", interval=interval)
        self.diffs = self.folder / "diffs"
        self.params = [p for _, p in job.model.named_parameters() if p.requires_grad]
        self.ks = [kept(p) for p in self.params]
        self.diff_bytes = 8 * sum(self.ks)
        """Bytes of one differential: float32 values and int32 indices."""
        self.compressed: tuple[list[bool], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.compress_s = 0.0
        self.replaying = False
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(self.diffs)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.queue: queue.Queue = queue.Queue()     # unbounded, as LowDiff's mp.Queue()
        self.synced = 0
        self.acks = threading.Condition()
        self.feeder = threading.Thread(target=self._feed, name="lowdiff-feeder", daemon=True)
        self.reader = threading.Thread(target=self._read_acks, name="lowdiff-acks", daemon=True)
        self.feeder.start()
        self.reader.start()
        self.hook = job.optimizer.register_step_pre_hook(self._compress)

    # -- training side ----------------------------------------------------------
    @torch.no_grad()
    def _compress(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step pre-hook: top-k of every gradient, the rest zeroed in place."""
        if self.replaying:
            return
        start = time.perf_counter()
        present, parts = [], []
        for p, k in zip(self.params, self.ks):
            if p.grad is None:
                present.append(False)
                continue
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()    # the zeroing below must be in the gradient itself
            flat = p.grad.view(-1)
            top = torch.topk(flat.abs(), k, sorted=False).indices
            values = flat[top]
            flat.zero_()
            flat.index_copy_(0, top, values)
            present.append(True)
            parts.append((values.float(), top.to(torch.int32)))
        self.compressed = (present, parts)
        self.compress_s = time.perf_counter() - start

    def due(self, step: int, last: int) -> bool:
        return step < last  # a differential after every step (full saves every interval)

    def save(self, step: int, position: int) -> Saved:
        start = time.perf_counter()
        nbytes = 0
        if step % self.interval == 0:
            self._sync()                        # the storage serves the full save after the queue
            nbytes += self.full.save(step, position).bytes
            self._prune(step)
        if self.compressed is not None:
            present, parts = self.compressed
            self.compressed = None
            self.queue.put((step, position, present, parts))
            nbytes += sum(v.numel() * 4 + i.numel() * 4 for v, i in parts)
        if step % self.batch == 0:
            self.queue.put("seal")
        inside = self.compress_s
        self.compress_s = 0.0
        return Saved(time.perf_counter() - start + inside, tracking_s=inside, bytes=nbytes)

    def _feed(self) -> None:
        out = self.proc.stdin
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    break
                if isinstance(item, str):
                    out.write(frame({"op": item}))
                else:
                    step, position, present, parts = item
                    size = sum(v.numel() * 4 + i.numel() * 4 for v, i in parts)
                    out.write(frame({"op": "diff", "step": step, "position": position,
                                     "present": present, "size": size}))
                    for values, indices in parts:
                        out.write(memoryview(values.numpy()).cast("B"))
                        out.write(memoryview(indices.numpy()).cast("B"))
                out.flush()
        except (BrokenPipeError, ValueError):
            pass  # the writer is gone (closed, or killed with this process's group)

    def _read_acks(self) -> None:
        for line in self.proc.stdout:
            if line.strip() == b"synced":
                with self.acks:
                    self.synced += 1
                    self.acks.notify_all()

    def _sync(self) -> None:
        """Wait until every batch sealed so far is durable."""
        with self.acks:
            target = self.synced + 1
        self.queue.put("sync")
        with self.acks:
            while self.synced < target:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"LowDiff's writer process exited with {self.proc.returncode}")
                self.acks.wait(timeout=1.0)

    def _prune(self, step: int) -> None:
        """Batches wholly at or before a durable full checkpoint are of no further use."""
        for path in batch_files(self.diffs):
            if int(path.stem.split("-")[1]) <= step:
                path.unlink(missing_ok=True)

    # -- recovery -------------------------------------------------------------------
    def load(self) -> Resume | None:
        resume = self.full.load()
        step, position = (resume.step, resume.position) if resume else (0, 0)
        self.replay_times: list[float] = []
        for path in batch_files(self.diffs):
            start = time.perf_counter()
            for header, data in read_batch(path):
                if header["step"] <= step:
                    continue
                if header["step"] != step + 1:
                    break                       # a gap: a later batch is of no use
                self._replay(header["present"], data)
                step, position = int(header["step"]), int(header["position"])
                self.replay_times.append(time.perf_counter() - start)
                start = time.perf_counter()
        return Resume(step, position) if step > 0 else None

    @property
    def replayed(self) -> int:
        """Differentials the last ``load`` replayed."""
        return len(self.replay_times)

    @torch.no_grad()
    def _replay(self, present: list[bool], data: memoryview) -> None:
        offset = 0
        for p, k, has in zip(self.params, self.ks, present):
            if not has:
                p.grad = None
                continue
            values = torch.frombuffer(data, dtype=torch.float32, count=k, offset=offset)
            offset += 4 * k
            indices = torch.frombuffer(data, dtype=torch.int32, count=k, offset=offset)
            offset += 4 * k
            dense = torch.zeros(p.numel(), dtype=p.dtype)
            dense.index_copy_(0, indices.long(), values.to(p.dtype))
            p.grad = dense.view_as(p)
        self.replaying = True
        try:
            self.job.optimizer.step()
        finally:
            self.replaying = False
        self.job.scheduler.step()
        self.job.optimizer.zero_grad(set_to_none=True)

    # -- the rest ---------------------------------------------------------------------
    def flush(self) -> None:
        self.queue.put("seal")
        self._sync()

    def close(self) -> None:
        """Stops the writer; what it held unsealed is dropped (a job's end needs none of it)."""
        self.hook.remove()
        self.queue.put(None)
        self.feeder.join(timeout=30)
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=5)
