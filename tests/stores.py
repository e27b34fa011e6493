"""Store fakes for the tests: a real LocalStore underneath, one behaviour changed.

Every fake forwards what it does not change to the LocalStore it wraps
(``Forwarding``), so the rest of the Store contract stays the real one; each
changes one thing: writes that fail (``FailingWrites``, ``Faults``, ``HeldFull``,
``CannotDelete``), reads that fail or let something happen first
(``FlakyReads``, ``BeforeFirstRead``), writes that are held back, slowed or
mangled (``GatedStore``, ``CountingStore``, ``DropsBuffers``), or writes that are
noted (``RecordingStore``). Where a fake must catch every read method (``read``,
``read_buffer``, ``read_into``: the restore reads through all three), it is a
LocalStore subclass instead (``FailingReads``, ``CountedReads``, ``SlowReads``,
``ThreadNotedReads``, ``NotedScatteredReads``; and ``FullAppends``). A test that
needs another behaviour adds a fake here.
The contract itself, on every real backend, is ``tests/layercheck/
test_store_conformance.py``.
"""
from __future__ import annotations

import errno
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable
from unittest import mock

import numpy as np

from layercheck.storage import fds as store_module
from layercheck.storage.localstore import LocalStore

__all__ = ["Forwarding", "FailingWrites", "Faults", "HeldFull", "CannotDelete", "FlakyReads",
           "BeforeFirstRead", "GatedStore", "CountingStore", "DropsBuffers", "RecordingStore",
           "FullAppends", "FailingReads", "CountedReads", "SlowReads", "ThreadNotedReads",
           "NotedScatteredReads", "no_space", "layer_step", "one_step_of_layers_from"]


def no_space(path: str) -> OSError:
    """The error of a full disk (ENOSPC) at ``path``."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def layer_step(path: str) -> int:
    """The step of a layer file's path (``layers/<name>@<step>...``), -1 for any other."""
    found = re.search(r"@(\d+)", path) if path.startswith("layers/") else None
    return int(found.group(1)) if found else -1


class Forwarding:
    """The LocalStore at ``root``, every operation forwarded to it (``inner``)."""

    def __init__(self, root: Path, *, create: bool = True) -> None:
        self.inner = LocalStore(root, create=create)
        self.url = self.inner.url

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class FailingWrites(Forwarding):
    """Atomic writes of the paths ``fails`` picks raise ``error(path)`` (ENOSPC unless
    given); manifest appends raise ENOSPC if ``append_fails``."""

    def __init__(self, root: Path, fails: Callable[[str], bool] = lambda path: False,
                 error: Callable[[str], BaseException] | None = None,
                 append_fails: bool = False) -> None:
        super().__init__(root)
        self.fails, self.append_fails, self.error = fails, append_fails, error or no_space

    def write_atomic(self, path: str, data) -> None:
        if self.fails(path):
            raise self.error(path)
        self.inner.write_atomic(path, data)

    def append(self, path: str, data: bytes) -> None:
        if self.append_fails:
            raise no_space(path)
        self.inner.append(path, data)


class Faults(Forwarding):
    """Writes that fail on demand.

    ``fail(op, prefix, err, times)``: the next ``times`` calls of ``op``
    ('write_atomic' or 'append') on a path starting with ``prefix`` raise
    OSError(err). ``torn=True`` makes a failing append get half its bytes onto
    the disk first (inside LocalStore.append, as a disk that fills up mid-write
    does), so the store's own rollback is what is tested. ``failures`` counts them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.faults: list[dict] = []
        self.failures = 0

    def fail(self, op: str, prefix: str, err: int, *, times: int = 1, torn: bool = False) -> None:
        self.faults.append(dict(op=op, prefix=prefix, err=err, left=times, torn=torn))

    def _fault(self, op: str, path: str) -> dict | None:
        for fault in self.faults:
            if fault["op"] == op and path.startswith(fault["prefix"]) and fault["left"] > 0:
                fault["left"] -= 1
                self.failures += 1
                return fault
        return None

    def write_atomic(self, path: str, data) -> None:
        fault = self._fault("write_atomic", path)
        if fault:
            raise OSError(fault["err"], os.strerror(fault["err"]), path)
        self.inner.write_atomic(path, data)

    def append(self, path: str, data: bytes) -> None:
        fault = self._fault("append", path)
        if fault and not fault["torn"]:
            raise OSError(fault["err"], os.strerror(fault["err"]), path)
        if fault:
            def half_then_fail(fd, chunk, err=fault["err"]):
                os.write(fd, bytes(chunk[: len(chunk) // 2]))
                raise OSError(err, os.strerror(err), path)
            with mock.patch.object(store_module, "write_all", half_then_fail):
                self.inner.append(path, data)
        self.inner.append(path, data)


class HeldFull(Forwarding):
    """No room for the atomic writes that ``full(path)`` picks (ENOSPC). The first of
    them holds the writer thread until ``release()`` (``reached`` is set, ``first`` is
    its path), so that the steps training queues meanwhile go on without those
    files, as they do when a failure is noticed late."""

    def __init__(self, root: Path, full: Callable[[str], bool]) -> None:
        super().__init__(root)
        self.full, self.first = full, None
        self.reached, self._go = threading.Event(), threading.Event()

    def write_atomic(self, path: str, data) -> None:
        if self.full(path):
            if not self.reached.is_set():
                self.first = path
                self.reached.set()
                self._go.wait(120)
            raise no_space(path)
        self.inner.write_atomic(path, data)

    def release(self) -> None:
        self._go.set()


def one_step_of_layers_from(from_step: int) -> Callable[[str], bool]:
    """For ``HeldFull``: the layer files of the first step >= ``from_step`` that writes
    one (every layer file of that step, none of any other)."""
    chosen: list[int] = []

    def full(path: str) -> bool:
        step = layer_step(path)
        if step >= from_step and (not chosen or chosen[0] == step):
            chosen[:] = [step]
            return True
        return False
    return full


class CannotDelete(Forwarding):
    """Every ``delete_unread`` fails with EIO (retention cannot retire anything)."""

    def delete_unread(self, paths):
        raise OSError(errno.EIO, os.strerror(errno.EIO))


class FlakyReads(Forwarding):
    """The first ``times`` reads of ``path`` fail with EIO (a storage hiccup: the file
    is intact)."""

    def __init__(self, root: Path, path: str, times: int = 1) -> None:
        super().__init__(root)
        self.path, self.left = path, times

    def read(self, path: str, limit: int | None = None) -> bytes:
        if path == self.path and self.left > 0:
            self.left -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return self.inner.read(path, limit)


class BeforeFirstRead(Forwarding):
    """A reader's store: just before its first read of a layer file it runs
    ``meanwhile()`` (a live trainer's next steps, its retention), which is where a
    real race would put them: after the reader's snapshot of the manifest, before it
    reads what it planned."""

    def __init__(self, root: Path, meanwhile: Callable[[], object], *, create: bool = True) -> None:
        super().__init__(root, create=create)
        self.meanwhile: Callable[[], object] | None = meanwhile

    def read(self, path: str, limit: int | None = None) -> bytes:
        if path.startswith("layers/") and self.meanwhile is not None:
            go, self.meanwhile = self.meanwhile, None
            go()
        return self.inner.read(path, limit)


class GatedStore(Forwarding):
    """The writer may write job j only once the producer has begun to submit job
    j + ``lead`` (``announce``) or has finished: the writer can never run ahead, so
    whether the queue fills up does not depend on thread timing. Counts manifest
    appends."""

    def __init__(self, root: Path, lead: int) -> None:
        super().__init__(root)
        self.lead, self.appends = lead, 0
        self._cv = threading.Condition()
        self._announced, self._done = 0, False

    def announce(self, step: int) -> None:
        with self._cv:
            self._announced = step
            self._cv.notify_all()

    def finish(self) -> None:
        with self._cv:
            self._done = True
            self._cv.notify_all()

    def write_atomic(self, path: str, data) -> None:
        step = int(re.search(r"@(\d+)", path).group(1))
        with self._cv:
            assert self._cv.wait_for(lambda: self._done or self._announced >= step + self.lead,
                                     timeout=120)
        self.inner.write_atomic(path, data)

    def append(self, path: str, data: bytes) -> None:
        self.inner.append(path, data)
        self.appends += 1


class CountingStore(Forwarding):
    """Atomic writes each take ``delay`` seconds longer; counts how many are in flight
    (``most``: at once), what they were handed (``kinds``), and how many were in
    flight at each manifest append (``at_append``); the writes of layers named in
    ``fail`` raise ENOSPC after the delay."""

    def __init__(self, root: Path, delay: float = 0.0, fail: tuple[str, ...] = ()) -> None:
        super().__init__(root)
        self.delay, self.fail = delay, fail
        self.in_flight = self.most = 0
        self.kinds: dict[str, type] = {}
        self.at_append: list[int] = []
        self._lock = threading.Lock()

    def write_atomic(self, path: str, data) -> None:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.kinds[path] = type(data)
        try:
            time.sleep(self.delay)
            if any(path.startswith(f"layers/{name}@") for name in self.fail):
                raise no_space(path)
            self.inner.write_atomic(path, data)
        finally:
            with self._lock:
                self.in_flight -= 1

    def append(self, path: str, data: bytes) -> None:
        self.at_append.append(self.in_flight)
        self.inner.append(path, data)


class DropsBuffers(Forwarding):
    """``write_atomic`` writes only the first buffer it is handed."""

    def write_atomic(self, path: str, data) -> None:
        self.inner.write_atomic(path, [next(iter(data))])


class RecordingStore(Forwarding):
    """Notes the manifest's size after each append of drop records (``("drop", size)``
    into ``events``), and the size of every file written atomically (``written``:
    the versions' files, and the manifest as compaction rewrites it)."""

    def __init__(self, root: Path, events: list) -> None:
        super().__init__(root)
        self.events = events
        self.written: dict[str, int] = {}

    def write_atomic(self, path: str, data) -> None:
        self.inner.write_atomic(path, data)
        self.written[path] = self.inner.size(path)

    def append(self, path: str, data: bytes) -> None:
        self.inner.append(path, data)
        if b'"kind":"drop"' in data:
            self.events.append(("drop", self.inner.size(path)))


# -- LocalStore itself, one behaviour changed: where the fake must catch every read method
# (read, read_buffer, read_into), which a Forwarding fake's inner store would answer


class FullAppends(LocalStore):
    """Appends (the manifest's) fail with ENOSPC while ``full``, as on a full disk."""

    def __init__(self, root: Path, *, full: bool = True) -> None:
        super().__init__(root)
        self.full = full

    def append(self, path: str, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().append(path, data)


class FailingReads(LocalStore):
    """Reads of layer files fail with EIO: from the ``after``-th read of each file on
    (``times`` reads, then it answers again; None: for good), or, with ``only``, of
    those files only."""

    def __init__(self, root, *, after=2, times=None, only=None) -> None:
        super().__init__(root)
        self.after, self.times, self.only = after, times, only
        self.reads: dict[str, int] = {}
        self.failed = 0

    def _maybe_fail(self, path):
        if not path.startswith("layers/") or (self.only is not None and path not in self.only):
            return
        n = self.reads[path] = self.reads.get(path, 0) + 1
        if n >= self.after and (self.times is None or n < self.after + self.times):
            self.failed += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    def read_buffer(self, path, limit=None, consume=None):
        self._maybe_fail(path)
        return super().read_buffer(path, limit, consume)

    def read_into(self, path, limit, consume, targets):
        self._maybe_fail(path)
        return super().read_into(path, limit, consume, targets)


class CountedReads(LocalStore):
    """Each read of a file counted (any read method)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def _count(self, path: str) -> None:
        self.reads[path] = self.reads.get(path, 0) + 1

    def read(self, path, limit=None):
        self._count(path)
        return super().read(path, limit)

    def read_buffer(self, path, limit=None, consume=None):
        self._count(path)
        return super().read_buffer(path, limit, consume)

    def read_into(self, path, limit, consume, targets):
        self._count(path)
        return super().read_into(path, limit, consume, targets)


class SlowReads(LocalStore):
    """Every read takes at least ``delay`` seconds."""

    delay = 0.02

    def read(self, path, limit=None):
        time.sleep(self.delay)
        return super().read(path, limit)

    def read_buffer(self, path, limit=None, consume=None):
        time.sleep(self.delay)
        return super().read_buffer(path, limit, consume)


class ThreadNotedReads(SlowReads):
    """Notes which thread reads each file, in order; each read
    takes a while, so that a pool has no idle thread when the next read comes."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.readers: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def read_buffer(self, path, limit=None, consume=None):
        with self.lock:
            self.readers.append((path, threading.current_thread().name))
        return super().read_buffer(path, limit, consume)

    def read(self, path, limit=None):
        with self.lock:
            self.readers.append((path, threading.current_thread().name))
        return super().read(path, limit)

    def layer_files(self):
        with self.lock:
            return [(p, t) for p, t in self.readers if p.startswith("layers/")]


class NotedScatteredReads(LocalStore):
    """Notes the memory each scattered read fills (``read_into``)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.filled: list[tuple[int, int]] = []

    def read_into(self, path, limit, consume, targets):
        def noted(size):
            for target in targets(size):
                start = np.frombuffer(target, dtype=np.uint8).ctypes.data if len(target) else 0
                self.filled.append((start, start + len(target)))
                yield target
        return super().read_into(path, limit, consume, noted)
