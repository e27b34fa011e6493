"""GEMINI's checkpointer on a live job: host copies sent to a peer's memory, storage as the last tier.

What ``sim.strategies.Gemini`` models, for real:

- every ``interval`` steps (``due``) the training thread first waits until the
  previous transfer to the peer has finished (the simulator's blocking
  background writer), then copies the whole state (weights, Adam moments,
  steps) into preallocated host buffers (``host_copy_gbps``, the stall);
- a background thread sends those buffers to the peer process
  (``profiler.checkpointers.peerstore``) over loopback (``peer_gbps``); the step is a
  recovery point once the peer has acknowledged the copy (the primary tier);
- every ``storage_every`` steps a second background thread also writes a
  host copy to storage with ``torch.distributed.checkpoint.save``
  (``persist_gbps``, the persist of the two-phase save), never waited for; a
  folder is a recovery point once DCP's ``.metadata`` exists (the last tier);
- ``load()`` takes the peer's copy of this job when the peer holds one at
  least as new as storage's (``async_load_gbps`` aside: the peer's bytes go
  straight into the live tensors), else the newest durable storage folder
  (``dcp.load``, as ``TwoPhaseCheckpointer``), else None.

A storage write keeps its host buffers until it is done: a snapshot due
meanwhile copies into a second set, so neither tier reads a torn copy.
"""
from __future__ import annotations

import shutil
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from .base import Checkpointer, Resume, Saved
from ..mechanisms.peer import byte_views
from .peerstore import recv_exact, recv_frame, send_frame
from ..state import TrainingState
from .twophase import TwoPhaseCheckpointer

__all__ = ["PeerCheckpointer"]


class PeerCheckpointer(Checkpointer):

    def __init__(self, job: Any, folder: Path, *, interval: int = 1,
                 storage_every: int | None = None, peer: int | None = None) -> None:
        """``peer``: the port of a running ``profiler.checkpointers.peerstore`` on 127.0.0.1;
        ``storage_every``: steps between storage writes (default: ``interval``)."""
        super().__init__(job, folder, interval=interval)
        if peer is None:
            raise ValueError("the gemini checkpointer needs a peer: the port of a running "
                             "profiler.checkpointers.peerstore (its start_peer)")
        self.storage_every = storage_every or interval
        self.key = str(self.folder.resolve())
        self.state = TrainingState(job.model, job.optimizer, job.scheduler)
        self.live = self.state.tensors()
        self.nbytes = sum(t.numel() * t.element_size() for t in self.live.values())
        self.sets = [self._buffers()]
        """Host buffer sets; a set is busy while a storage write reads it."""
        self.busy: dict[int, threading.Event] = {}
        self.conn = socket.create_connection(("127.0.0.1", peer))
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sender = ThreadPoolExecutor(1, thread_name_prefix="gemini-peer")
        self.pending: Future | None = None
        self.peer_set = 0
        self.storage = TwoPhaseCheckpointer(job, self.folder / "storage", interval=interval)
        self.writes: list[threading.Thread] = []

    # -- save ---------------------------------------------------------------------
    def due(self, step: int, last: int) -> bool:
        return step < last and (step % self.interval == 0 or step % self.storage_every == 0)

    def save(self, step: int, position: int) -> Saved:
        """A host copy; to the peer at every ``interval``-th step, to storage at every
        ``storage_every``-th. (The simulator's storage steps need not be copies' steps:
        there its storage write costs no stall; here it needs its own host copy.)"""
        start = time.perf_counter()
        to_peer = step % self.interval == 0
        if to_peer:
            self._wait_peer()
        index = self._free_set()
        buffers = self.sets[index]
        for b, t in zip(buffers.values(), self.live.values()):
            b.copy_(t)
        meta = self.state.meta(step, position)
        nbytes = 0
        if to_peer:
            self.pending = self.sender.submit(self._put, buffers, meta)
            self.peer_set = index
            nbytes += self.nbytes
        if step % self.storage_every == 0:
            done = threading.Event()
            self.busy[index] = done
            thread = threading.Thread(target=self._persist, args=(buffers, meta, step, done),
                                      name="gemini-storage", daemon=True)
            thread.start()
            self.writes.append(thread)
            nbytes += self.nbytes
        return Saved(time.perf_counter() - start, bytes=nbytes)

    def _put(self, buffers: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        send_frame(self.conn, {"op": "put", "key": self.key, "meta": meta, "size": self.nbytes})
        for view in byte_views(list(buffers.values())):
            self.conn.sendall(view)
        if self.conn.recv(1) != b"k":
            raise ConnectionError("the GEMINI peer closed before acknowledging a copy")

    def _persist(self, buffers: dict[str, torch.Tensor], meta: dict[str, Any], step: int,
                 done: threading.Event) -> None:
        try:
            self.storage.persist(buffers, meta, self.storage.folder / f"step{step}")
            for old in self.storage.durable()[:-1]:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            done.set()

    def _wait_peer(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def _free_set(self) -> int:
        """A buffer set no background thread reads: not a storage write's in flight, nor
        the one a transfer to the peer still sends."""
        sending = self.pending is not None and not self.pending.done()
        for index in range(len(self.sets)):
            event = self.busy.get(index)
            if (event is None or event.is_set()) and not (sending and index == self.peer_set):
                self.busy.pop(index, None)
                return index
        self.sets.append(self._buffers())
        return len(self.sets) - 1

    def _buffers(self) -> dict[str, torch.Tensor]:
        # zeros, not empty: the pages are touched here, not inside the first snapshot
        return {k: torch.zeros_like(t, device="cpu") for k, t in self.live.items()}

    # -- load ---------------------------------------------------------------------
    def load(self) -> Resume | None:
        send_frame(self.conn, {"op": "head", "key": self.key})
        head = recv_frame(self.conn)
        peer_step = int(head["meta"]["step"]) if head and head["meta"] else 0
        stored = self.storage.durable()
        storage_step = int(stored[-1].name[4:]) if stored else 0
        if peer_step and peer_step >= storage_step:
            return self._from_peer()
        if storage_step:
            return self.storage.load()
        return None

    def _from_peer(self) -> Resume:
        send_frame(self.conn, {"op": "get", "key": self.key})
        head = recv_frame(self.conn)
        if head is None or head["size"] != self.nbytes:
            raise ConnectionError(f"the GEMINI peer's copy has {head and head['size']} bytes, "
                                  f"the job's state {self.nbytes}")
        for view in byte_views(list(self.live.values())):
            if not recv_exact(self.conn, view):
                raise ConnectionError("the GEMINI peer closed while sending its copy")
        step, position = self.state.apply_meta(head["meta"])
        return Resume(step, position)

    # -- the rest -------------------------------------------------------------------
    def flush(self) -> None:
        self._wait_peer()
        for thread in self.writes:
            thread.join()
        self.writes = []

    def close(self) -> None:
        """Waits for the transfer in flight (a fraction of a second) so that the peer
        connection closes cleanly; a storage write in flight finishes on its own."""
        try:
            self._wait_peer()
        finally:
            self.sender.shutdown(wait=True)
            self.conn.close()
