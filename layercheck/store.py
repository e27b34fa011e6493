"""Where checkpoint bytes live, behind one narrow protocol.

The policy and the writer never call open() themselves; they talk to a
Store. Two implementations: ``LocalStore`` (a directory, with fsync and
atomic rename) and ``FsspecStore`` (any fsspec URL: memory://, s3://, ...).
Paths are relative, '/'-separated, and may not leave the store's root.
"""
from __future__ import annotations

import errno
import os
import re
import uuid
from pathlib import Path
from typing import Protocol, runtime_checkable

from .errors import DirectoryLocked, LayerCheckError

__all__ = ["Store", "LocalStore", "FsspecStore", "open_store", "check_relative"]

_SAFE_PATH = re.compile(r"^[A-Za-z0-9._@-]+(/[A-Za-z0-9._@-]+)*$")


def check_relative(path: str) -> str:
    """``path`` if it is a plain relative path inside the store, else LayerCheckError.

    Rejects absolute paths, '..', empty parts and unusual characters, so a
    hostile manifest cannot point outside the checkpoint directory."""
    if not _SAFE_PATH.match(path) or any(part in (".", "..") for part in path.split("/")):
        raise LayerCheckError(f"refusing path {path!r}: checkpoint paths must be relative, "
                              "inside the checkpoint directory, without '..'")
    return path


@runtime_checkable
class Store(Protocol):
    """The operations layercheck needs from storage.

    ``write_atomic`` makes ``data`` visible under ``path`` all at once and
    durable before it returns; ``append`` adds bytes at the end of ``path``
    durably (creating it), and an append that fails (ENOSPC, EIO) leaves the
    file as it was where the storage allows. Readers never see a partial
    ``write_atomic``. A crash mid-append can still leave a torn tail: see
    ``manifest.seal_torn_tail``.
    """

    url: str

    def write_atomic(self, path: str, data: bytes) -> None: ...
    def append(self, path: str, data: bytes) -> None: ...
    def read(self, path: str) -> bytes: ...
    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, path: str) -> None: ...
    def lock(self) -> None: ...
    def unlock(self) -> None: ...


class LocalStore:
    """A local directory. Atomic writes: temp file, fsync, rename, fsync of the directory."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        self.url = str(self.root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None

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
            _fsync_dir(path.parent)

    def write_atomic(self, path: str, data: bytes) -> None:
        target = self._path(path)
        self._make_parents(target)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)

    def append(self, path: str, data: bytes) -> None:
        target = self._path(path)
        self._make_parents(target)
        created = not target.exists()
        # O_NOFOLLOW: a planted symlink must not make us append to a file elsewhere
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                _cut_back(fd, size)  # a disk that filled mid-append keeps no half record
                raise
        finally:
            os.close(fd)
        if created:
            _fsync_dir(target.parent)

    def read(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def size(self, path: str) -> int:
        return self._path(path).stat().st_size

    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        if not folder.is_dir():
            return []
        # names layercheck could not have written (spaces, odd characters) are not ours
        return sorted(f"{prefix}/{p.name}" for p in folder.iterdir()
                      if p.is_file() and _SAFE_PATH.match(p.name))

    def delete(self, path: str) -> None:
        self._path(path).unlink(missing_ok=True)

    def lock(self) -> None:
        """Take an exclusive, process-wide lock on the directory (released by
        ``unlock`` or when the process dies, even by SIGKILL)."""
        import fcntl
        try:  # O_NOFOLLOW: a planted symlink must not make us truncate a file elsewhere
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise LayerCheckError(f"{self.root}/.lock is a symbolic link; layercheck never "
                                  "follows it: delete it and try again") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise DirectoryLocked(
                    f"{self.root} is in use by another process (pid {holder} holds "
                    f"{self.root}/.lock); stop that process or point this one at another "
                    "directory") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class FsspecStore:
    """Any fsspec filesystem. ``write_atomic`` relies on the filesystem's
    whole-object put being atomic (true for object stores and memory://);
    ``append`` uses append mode where the filesystem has it and otherwise
    rewrites the object whole. No cross-process lock: one writer per URL."""

    def __init__(self, url: str, *, create: bool = True, **storage_options: object) -> None:
        import fsspec
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self.url = url
        if create:
            self.fs.makedirs(self.root, exist_ok=True)
        elif not self.fs.isdir(self.root):
            raise LayerCheckError(f"{url}: no such checkpoint directory")

    def _path(self, path: str) -> str:
        return f"{self.root}/{check_relative(path)}"

    def write_atomic(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(path), data)

    def append(self, path: str, data: bytes) -> None:
        full = self._path(path)
        try:
            with self.fs.open(full, "ab") as handle:
                handle.write(data)
        except (NotImplementedError, ValueError):
            old = self.fs.cat_file(full) if self.fs.exists(full) else b""
            self.fs.pipe_file(full, old + data)

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._path(path))

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._path(path))

    def size(self, path: str) -> int:
        return int(self.fs.size(self._path(path)))

    def list(self, prefix: str) -> list[str]:
        full = self._path(prefix)
        if not self.fs.isdir(full):
            return []
        return sorted(f"{prefix}/{p.rstrip('/').rsplit('/', 1)[-1]}"
                      for p in self.fs.ls(full, detail=False) if self.fs.isfile(p))

    def delete(self, path: str) -> None:
        full = self._path(path)
        if self.fs.exists(full):
            self.fs.rm_file(full)

    def lock(self) -> None:
        pass

    def unlock(self) -> None:
        pass


def open_store(location: "str | os.PathLike[str] | Store", *, create: bool = True,
               **storage_options: object) -> Store:
    """A Store for a directory path, an fsspec URL ('memory://run1', 's3://b/p'),
    or a Store passed through unchanged."""
    if isinstance(location, Store) and not isinstance(location, (str, os.PathLike)):
        return location
    text = os.fspath(location)
    if "://" in text and not text.startswith("file://"):
        try:
            return FsspecStore(text, create=create, **storage_options)
        except LayerCheckError:
            raise
        except Exception as exc:  # unknown protocol, missing driver, unreachable host, ...
            raise LayerCheckError(f"{text}: cannot open it as an fsspec URL ({exc}); check the "
                                  "protocol and that its fsspec driver is installed") from None
    if text.startswith("file://"):
        text = text[len("file://"):]
    if not create and not Path(text).is_dir():
        raise LayerCheckError(f"{text}: no such checkpoint directory")
    return LocalStore(text, create=create)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _cut_back(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError:
        pass  # the original error is the one to report; readers skip a torn tail anyway


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
