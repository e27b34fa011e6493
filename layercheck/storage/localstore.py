"""``LocalStore``: a checkpoint directory on this machine's file system (``store.Store``).

Atomic writes (temp file, fsync, rename, fsync of the folder), appends that a full
disk leaves as they were, reads of regular files only and never through a link
(``fds``), and the directory's locks (``lock``).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable, ContextManager, Iterable

import numpy as np

from ..contract.errors import LayerCheckError
from . import fds, lock
from .store import FileData, ReadBuffer, check_deletable, check_relative, listed

__all__ = ["LocalStore"]


class LocalStore:
    """A local directory. Atomic writes: temp file, fsync, rename, fsync of the directory.

    Writes and deletes go only into the directory this store was opened on: if it
    is deleted or replaced meanwhile (``rm -rf``, and perhaps another run creating
    it anew), they raise LayerCheckError (not a storage error: retrying is futile)."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        self.url = str(self.root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self._identity = fds.identity(self.root) if self.root.is_dir() else None
        self._lock_key: tuple[int, int] | None = None

    def _writable(self, path: str) -> Path:
        """``_path(path)``, once the directory is checked to be the one opened."""
        try:
            same = fds.identity(self.root) == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            raise LayerCheckError(
                f"{self.root} was deleted or replaced after this process opened it; nothing "
                "more is written there (another run may own it now): restore from a copy, or "
                "start over in a new directory")
        return self._path(path)

    def _path(self, path: str) -> Path:
        target = self.root / check_relative(path)
        for folder in list(target.relative_to(self.root).parents)[-2::-1]:
            if (self.root / folder).is_symlink():
                raise LayerCheckError(
                    f"refusing {path!r}: {self.root / folder} is a symbolic link; layercheck "
                    "reads and writes only real folders inside the checkpoint directory")
        return target

    def _make_parents(self, target: Path) -> None:
        """Create the missing folders between the root and ``target``, each made
        durable: a new folder's entry in its parent is fsynced (a power cut must
        not lose the folder that holds committed files)."""
        for folder in list(target.relative_to(self.root).parents)[-2::-1]:
            path = self.root / folder
            try:
                path.mkdir()
            except FileExistsError:
                continue
            fds.fsync_dir(path.parent)

    def write_atomic(self, path: str, data: FileData) -> None:
        """Temp file, each buffer written as it comes, fsync, rename, fsync of the
        folder; on any failure (ENOSPC, EIO, an exception of ``data``) the temp
        file is removed and the error raised. The writes and fsyncs release the
        GIL: several threads write several files at once."""
        target = self._writable(path)
        self._make_parents(target)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                for buffer in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                    fds.write_all(fd, buffer)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fds.fsync_dir(target.parent)

    def append(self, path: str, data: bytes) -> None:
        target = self._writable(path)
        self._make_parents(target)
        created = not os.path.lexists(target)
        # never through a planted link, nor into a FIFO or device
        fd = fds.open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            try:
                fds.write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                fds.cut_back(fd, size)  # a disk that filled mid-append keeps no half record
                raise
        finally:
            os.close(fd)
        if created:
            fds.fsync_dir(target.parent)

    def read(self, path: str, limit: int | None = None) -> bytes:
        fd = fds.open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read: a file that grows is read as it was
            size = os.fstat(fd).st_size
            return fds.read_all(fd, size if limit is None else min(size, limit + 1))
        finally:
            os.close(fd)

    def read_buffer(self, path: str, limit: int | None = None,
                    consume: Callable[[memoryview], None] | None = None) -> ReadBuffer:
        """As ``read``, into one writable buffer allocated once and never zeroed
        (tensors can be views of it); ``consume`` gets each piece as it arrives (a
        checksum on the same pass, while the piece is still in the CPU's cache)."""
        fd = fds.open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read, as in ``read``
            size = os.fstat(fd).st_size
            size = size if limit is None else min(size, limit + 1)
            buffer = np.empty(size, dtype=np.uint8)  # no zeroing pass; numpy asks for huge pages
            with memoryview(buffer) as view:
                done = fds.fill(fd, view, consume)
            return buffer if done == size else buffer[:done]  # it shrank since it was opened
        finally:
            os.close(fd)

    def read_into(self, path: str, limit: int | None, consume: Callable[[memoryview], None],
                  targets: Callable[[int], Iterable[memoryview]]) -> int:
        """As ``read``, scattered into the writable buffers that ``targets(size)`` yields
        (``size``: what ``read`` would return), in order; the bytes read, all fed to
        ``consume`` as they arrive. Each buffer is filled before the next is asked
        for, so ``targets`` may look at what it holds; at the end of the file the
        read stops. Bytes beyond the last buffer are read and consumed, not kept."""
        fd = fds.open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read, as in ``read``
            size = os.fstat(fd).st_size
            size = size if limit is None else min(size, limit + 1)
            done = 0
            for target in targets(size):
                got = fds.fill(fd, target[:size - done], consume)  # never beyond ``size``
                done += got
                if got < len(target):
                    return done
            while done < size:  # beyond the buffers: only counted (and consumed)
                rest = os.read(fd, min(size - done, fds.PIECE))
                if not rest:
                    break
                consume(memoryview(rest))
                done += len(rest)
            return done
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._path(path))  # a link counts: reading it is refused

    def size(self, path: str) -> int:
        return os.lstat(self._path(path)).st_size

    def list(self, prefix: str, *, temporary: bool = False) -> list[str]:
        folder = self._path(prefix) if prefix else self.root
        if not folder.is_dir():
            return []
        with os.scandir(folder) as entries:
            return sorted(f"{prefix}/{e.name}".lstrip("/") for e in entries
                          if e.is_file(follow_symlinks=False) and listed(e.name, temporary))

    def delete(self, path: str) -> None:
        self._writable(check_deletable(path)).unlink(missing_ok=True)

    def delete_unread(self, paths: list[str]) -> bool:
        # readers hold a shared record lock on .readers (``reading``); the writer takes
        # it exclusively for the moment it deletes, or leaves the files for later
        with lock.unread(self.root) as alone:
            if not alone:
                return False
            for path in paths:
                self.delete(path)
            return True

    def reading(self) -> ContextManager[None]:
        """Hold off ``delete_unread`` (a trainer's retention) while a reader reads
        (``lock.reading``)."""
        return lock.reading(self.root)

    def lock(self) -> None:
        """Take an exclusive lock on the directory, held by this process (not by the
        children it forks) until ``unlock`` or its death, even by SIGKILL
        (``lock.hold_directory``)."""
        self._writable(".lock")
        lock.hold_directory(self.root, self._identity)
        self._lock_key = self._identity

    def unlock(self) -> None:
        lock.release_directory(self._lock_key)
        self._lock_key = None
