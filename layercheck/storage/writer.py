"""The background writer: persists snapshots and commits them, off the training thread.

Contract: ``submit`` takes a ``StepJob`` of host-memory snapshots and returns
at once unless the queue already holds ``queue_bytes`` (then it blocks:
backpressure, never unbounded memory). One thread persists jobs in order. For
each job: every layer file is written atomically (temp, fsync, rename, fsync
of the folder), up to ``threads`` files at once, then the state file, then,
once every one of them is durable, one append of the job's manifest records
(in job order, the state record last), fsynced. A file is streamed from the
snapshot's own memory (``layerfile``), its checksum and size taken on the same
pass: no serialised copy of it is ever built. A crash at any point leaves
either committed records or ignorable leftovers; a failed write (ENOSPC,
EACCES, EIO) commits nothing of its job, and ``on_error`` says what training
hears.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
from collections import deque
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal

import torch

from .commit import Commit
from ..contract.errors import WriteFailed, retryable
from .format import (MANIFEST, Checksummer, Version, drop_record, encode_record, layer_metadata,
                     layer_path, state_path, version_files)
from .layerfile import LayerFile, layout
from .manifest import compact
from .retention import Retention
from .store import Store

__all__ = ["LayerSnapshot", "StepJob", "Writer", "WriteRecord"]

log = logging.getLogger("layercheck")

MAX_RECORDS = 10_000
"""WriteRecords kept for ``drain_completed``; a loop that never drains keeps
only the newest this many (bounded memory over any run length)."""

COMPACT_BYTES = 1 << 18
"""Under retention the manifest is compacted (``manifest.compact``) once it passes this
size, or twice its size after the last compaction: it stays bounded however long the
run, and restore and inspect replay little."""


WRITE_THREADS = 4
"""Layer files of one job written at once (``Writer(threads=...)``): while one file
waits for its fsync, the next ones are being written; os.write and fsync release
the GIL. More threads than files in flight buy nothing; one is the serial writer."""


@dataclass
class LayerSnapshot:
    index: int
    name: str
    reason: str
    tensors: dict[str, torch.Tensor]
    nbytes: int
    frozen: tuple[str, ...] = ()
    """The layer's parameters that did not train (``format``: frozen tensors)."""
    base: int | None = None
    """Set: a partial version, ``tensors`` without ``frozen``, which the layer's full
    version of this step holds."""
    refs: tuple[tuple[str, str, str, str], ...] = ()
    """A full version's frozen parameters left to a pretrained file (``Version.refs``)."""


@dataclass
class StepJob:
    step: int
    layers: list[LayerSnapshot]
    state: tuple[dict[str, torch.Tensor], dict[str, str]] | None
    nbytes: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    ready: Callable[[], None] | None = None
    """Blocks until the snapshot's tensors hold their values (device copies still
    under way when it was submitted: ``hostcopy.Fence.wait``); the writer calls it
    before it reads them."""


@dataclass(frozen=True)
class WriteRecord:
    """One committed layer version, for profiling: size and time from submit to commit."""

    step: int
    layer: int
    name: str
    reason: str
    bytes: int
    persist_s: float


class Writer:
    """Persists StepJobs in a background thread (see the module contract)."""

    def __init__(self, store: Store, *, queue_bytes: int,
                 on_error: Literal["raise", "warn"] = "raise", commit: Commit | None = None,
                 threads: int = WRITE_THREADS) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"Writer(threads={threads!r}): the number of files written at once "
                             f"must be an integer >= 1 (default {WRITE_THREADS})")
        self.store = store
        self.commit = commit or Commit()
        """Single process, or every rank's shards together (``ShardedCommit``)."""
        self.queue_bytes = queue_bytes
        self.on_error = on_error
        self.bytes_written = 0
        self.bytes_dropped = 0
        self.retention: Retention | None = None
        """Set by LayerCheck (keep_versions); used only by the writer thread."""
        self.layout = 0
        """The id of the layout every version it writes names (``format``: layouts)."""
        self.completed: deque[WriteRecord] = deque(maxlen=MAX_RECORDS)
        self._jobs: queue.Queue[StepJob | None] = queue.Queue()
        self._pending = 0
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._bug: tuple[int, bool] | None = None
        """Where the writer thread failed itself (a bug, not storage): the step of the
        job in hand and whether that step was already committed with its training
        state (a failure in retention's bookkeeping comes after the commit)."""
        self._job_committed = False  # the job in hand's state record is committed (writer thread)
        self._failed_layers: set[int] = set()
        self._owed: set[int] = set()  # layers of failed jobs not committed since (writer thread)
        self._unlinked: list[str] = []  # files of dropped versions a reader kept (writer thread)
        self._compact_at = COMPACT_BYTES  # manifest size that calls for compaction (writer thread)
        self._files = ThreadPoolExecutor(threads, thread_name_prefix="layercheck-file")
        self._thread = threading.Thread(target=self._run, name="layercheck-writer", daemon=True)
        self._thread.start()

    # -- training-thread side ----------------------------------------------
    def submit(self, job: StepJob) -> float:
        """Queue ``job``; returns the seconds spent waiting for queue space."""
        self.raise_if_failed()
        start = time.perf_counter()
        with self._cv:
            while self._pending and self._pending + job.nbytes > self.queue_bytes:
                self._cv.wait()
                self.raise_if_failed()
            self._pending += job.nbytes
        self._jobs.put(job)
        return time.perf_counter() - start

    def flush(self) -> None:
        """Block until every submitted job is committed (or failed)."""
        self._jobs.join()
        self.raise_if_failed()

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        self._files.shutdown()
        self._retire([])  # files a reader kept from retention; still read: gc's to delete
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if not self._stopped():
            return
        if retryable(self._error):
            advice = "Fix the storage (space, permissions) and resume with restore()"
        else:  # the same at every try: retrying, also under 'warn', cannot help
            advice = ("It is not a storage error, so it is not retried: fix its cause and "
                      "resume with restore()")
        if self._bug is not None:
            step, committed = self._bug
            done = ("after committing it: that step and every earlier committed one are "
                    "recoverable" if committed else
                    "before committing it: every earlier committed step is recoverable")
            raise WriteFailed(f"the background writer failed at step {step} ({self._error}), "
                              f"{done}. {advice}") from self._error
        raise WriteFailed(f"a background checkpoint write failed ({self._error}); nothing of "
                          f"it was committed, every earlier step is still recoverable. {advice}"
                          ) from self._error

    def _stopped(self) -> bool:
        """Whether checkpointing has stopped: a failure under 'raise', or one that no
        retry can fix (``errors.retryable``) under either policy."""
        error = self._error
        return error is not None and (self.on_error == "raise" or not retryable(error))

    def take_failed_layers(self) -> set[int]:
        """Layers whose write failed under on_error='warn' since the last call."""
        with self._cv:
            failed, self._failed_layers = self._failed_layers, set()
        return failed

    def drain_completed(self) -> list[WriteRecord]:
        with self._cv:
            done = list(self.completed)
            self.completed.clear()
        return done

    # -- writer-thread side ------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._jobs.task_done()
                return
            try:
                # after a failure under 'raise' nothing more is written; ranks learn of
                # each other's failures in the commit, so they all stop at the same job
                self._job_committed = False
                if not self._stopped():
                    self._persist(job)
            except Exception as exc:  # a bug, not storage: stop, never die leaving flush() waiting
                with self._cv:
                    self._error = RuntimeError(f"the writer thread failed ({exc!r})")
                    self._bug = (job.step, self._job_committed)
                log.error("layercheck: the writer thread failed at step %d (%r); checkpointing "
                          "stops", job.step, exc)
            finally:
                # drop the snapshot now, not when the next job arrives: the queue's bound
                # must be the whole of what the writer holds
                nbytes, job = job.nbytes, None
                with self._cv:
                    self._pending -= nbytes
                    self._cv.notify_all()
                self._jobs.task_done()

    def _persist(self, job: StepJob) -> None:
        """All or nothing per job: any failed write stops the job before its
        manifest append, so no record of it is committed. The state record is
        also held back while a layer of an earlier failed job is owed (under
        'warn'): a committed step must have a version of every layer."""
        what = "the manifest"
        rank = None if self.commit.world_size == 1 else self.commit.rank
        versions: list[Version] = []
        committed: list[Version] = []
        error: BaseException | None = None
        try:
            if job.ready is not None:
                job.ready()
            for snap, outcome in zip(job.layers, self._write_layers(job, rank)):
                what = f"layer {snap.name}"
                if isinstance(outcome, BaseException):
                    raise outcome
                if outcome is not None:
                    versions.append(outcome)
            if len(versions) != len(job.layers):  # a layer skipped, yet none failed: a bug
                raise RuntimeError(f"{len(job.layers) - len(versions)} layer files of step "
                                   f"{job.step} were neither written nor failed")
            committed = list(versions)
            if job.state is not None and not (self._owed - {s.index for s in job.layers}):
                what = "the training state"
                tensors, metadata = job.state
                if rank is not None:
                    metadata = {**metadata, "rank": str(rank)}
                committed.append(self._write(state_path(job.step, rank), tensors, metadata,
                                             job.step, None, None))
            what = "the manifest"
        except Exception as exc:
            error = exc
        try:
            committed = self.commit.commit(self.store, job.step, committed if error is None
                                           else [], error)
        except Exception as exc:
            self._fail(exc, job, what)
            return
        self._job_committed = any(v.layer is None for v in committed)  # its state record
        self._owed -= {snap.index for snap in job.layers}
        versions = committed[:len(versions)]
        if self.retention is not None and self.commit.rank == 0:
            self._retire(self.retention.committed(committed))
        elapsed = time.perf_counter() - job.submitted
        with self._cv:
            for snap, version in zip(job.layers, versions):
                self.bytes_written += version.bytes
                self.completed.append(WriteRecord(job.step, snap.index, snap.name, snap.reason,
                                                  version.bytes, elapsed))

    def _retire(self, versions: list[Version]) -> None:
        """Drop superseded versions: their drop records first (compacting the manifest
        once it is large), then their files, once no offline reader is reading
        (``Store.delete_unread``; until then they wait here, and a run that ends
        first leaves them to gc). A failure here loses nothing (the versions stay,
        or their files become leftovers for gc), so it is logged, never raised."""
        try:
            if versions:  # each version's files as the format names them, never as recorded
                self.store.append(MANIFEST, b"".join(
                    encode_record(drop_record(version_files(v)[0])) for v in versions))
                if self.store.size(MANIFEST) > self._compact_at:
                    self._compact_at = max(COMPACT_BYTES, 2 * compact(self.store))
                self.bytes_dropped += sum(v.total_bytes for v in versions)
                self._unlinked += [f for v in versions for f in version_files(v)]
            if self._unlinked and self.store.delete_unread(self._unlinked):
                self._unlinked = []
        except Exception as exc:
            log.warning("layercheck: retiring superseded versions failed (%s); they stay on "
                        "disk until `python -m layercheck gc`", exc)

    def _write_layers(self, job: StepJob, rank: int | None
                      ) -> list[Version | BaseException | None]:
        """Write every layer file of ``job``, several at once: per layer (in job order)
        its Version, or the exception its write raised, or None where it was not
        started because another had failed. Returns once no write is in flight, so
        no file of the job is still being written when it commits or fails."""
        failed = threading.Event()

        def write(snap: LayerSnapshot) -> Version | None:
            if failed.is_set():
                return None  # the job fails anyway: write no more of it
            try:
                version = self._write(layer_path(snap.name, job.step, rank), snap.tensors,
                                      layer_metadata(snap.name, job.step, rank), job.step,
                                      snap.name, snap.reason)
                return dataclasses.replace(version, frozen=snap.frozen, base=snap.base,
                                           refs=snap.refs)
            except BaseException:
                failed.set()
                raise

        futures: list[Future] = [self._files.submit(write, snap) for snap in job.layers]
        wait(futures)
        return [f.exception() or f.result() for f in futures]

    def _write(self, path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str],
               step: int, layer: str | None, reason: str | None) -> Version:
        """Stream one file to the store, its checksum and size taken on the same pass."""
        file = layout(tensors, metadata)
        tally = _Tally()
        self.store.write_atomic(path, tally.feed(file))
        if tally.bytes != file.nbytes:
            raise RuntimeError(f"the store wrote {tally.bytes} of the {file.nbytes} bytes of "
                               f"{path} and reported success: its write_atomic must consume "
                               "every buffer it is given")
        return Version(step=step, file=path, bytes=tally.bytes, checksum=tally.checksum.value,
                       layer=layer, reason=reason, layout=self.layout)

    def _fail(self, exc: BaseException, job: StepJob, what: str) -> None:
        """Record a failed job: its layers are owed (and retried under 'warn')."""
        layers = {snap.index for snap in job.layers}
        self._owed |= layers
        with self._cv:
            self._error = exc
            if not self._stopped():
                self._failed_layers |= layers
        if not self._stopped():
            log.error("layercheck: writing %s at step %d failed: %s; nothing of step %d was "
                      "committed; training goes on and the layers are written again at the "
                      "next opportunity", what, job.step, exc, job.step)
        else:
            log.error("layercheck: writing %s at step %d failed: %s; checkpointing stops",
                      what, job.step, exc)


class _Tally:
    """The checksum and byte count of the buffers that pass through ``feed``."""

    def __init__(self) -> None:
        self.checksum, self.bytes = Checksummer(), 0

    def feed(self, file: LayerFile) -> Iterator[memoryview]:
        for buffer in file.buffers():
            self.checksum.update(buffer)
            self.bytes += buffer.nbytes
            yield buffer
