"""``FsspecStore``: a checkpoint directory on any fsspec filesystem but the local one.

A ``store.Store``; ``location.open_store`` opens every local directory as a ``LocalStore``."""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

from ..contract.errors import LayerCheckError
from . import lock
from .store import FileData, check_deletable, check_relative, listed

__all__ = ["FsspecStore"]


class FsspecStore:
    """Any fsspec filesystem but the local one (``open_store`` opens every URL of a
    local directory as a ``LocalStore``). ``write_atomic`` relies on the filesystem's
    whole-object put being atomic (true for object stores and memory://);
    ``append`` uses append mode where the filesystem has it and otherwise
    rewrites the object whole.

    Concurrency: ``lock`` refuses a second writer of the same location in this
    process (``DirectoryLocked``). That is every writer memory:// can have (its
    files live in this process). An object store (s3://, gs://, ...) offers no
    lock that every fsspec driver can take, so a writer in another process or on
    another machine is not refused: run one writer per URL (the offline readers,
    inspect, plan and export, are safe beside it: ``reading`` holds nothing off
    here, and ``manifest.read_consistent`` retries what retention retired under
    them)."""

    def __init__(self, url: str, *, create: bool = True, **storage_options: object) -> None:
        import fsspec
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self.url = url
        self._held: tuple[str, str, str] | None = None
        if create:
            self.fs.makedirs(self.root, exist_ok=True)
        elif not self.fs.isdir(self.root):
            raise LayerCheckError(f"{url}: no such checkpoint directory")

    def _path(self, path: str) -> str:
        return f"{self.root}/{check_relative(path)}"

    def write_atomic(self, path: str, data: FileData) -> None:
        """Bytes: one whole-object put. Buffers: streamed into the object opened for
        writing, which an object store (S3, GCS) publishes only once closed whole,
        as ``pipe_file`` itself does on a filesystem that does not override it;
        on a failure the object is discarded and deleted. The writer streams only
        to fresh paths that no manifest record names yet, so a reader that
        follows the manifest never reads one in flight."""
        full = self._path(path)
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.fs.pipe_file(full, bytes(data))
            return
        handle = self.fs.open(full, "wb")
        try:
            for buffer in data:
                handle.write(buffer)
        except BaseException:
            _abandon(self.fs, handle, full)
            raise
        handle.close()

    def append(self, path: str, data: bytes) -> None:
        full = self._path(path)
        try:
            with self.fs.open(full, "ab") as handle:
                handle.write(data)
        except (NotImplementedError, ValueError):
            old = self.fs.cat_file(full) if self.fs.exists(full) else b""
            self.fs.pipe_file(full, old + data)

    def read(self, path: str, limit: int | None = None) -> bytes:
        return self.fs.cat_file(self._path(path), start=0,
                                end=None if limit is None else limit + 1)

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._path(path))

    def size(self, path: str) -> int:
        return int(self.fs.size(self._path(path)))

    def list(self, prefix: str, *, temporary: bool = False) -> list[str]:
        full = self._path(prefix) if prefix else self.root
        if not self.fs.isdir(full):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(full, detail=False)
                 if self.fs.isfile(p))
        return sorted(f"{prefix}/{name}".lstrip("/") for name in names
                      if listed(name, temporary))

    def delete(self, path: str) -> None:
        full = self._path(check_deletable(path))
        if self.fs.exists(full):
            self.fs.rm_file(full)

    def delete_unread(self, paths: list[str]) -> bool:
        for path in paths:  # no cross-process coordination: one process per URL
            self.delete(path)
        return True

    def reading(self) -> ContextManager[None]:
        return nullcontext()

    def lock(self) -> None:
        """Hold this location against a second writer of this process (see the class doc)."""
        from fsspec.utils import tokenize
        fs = type(self.fs)
        key = (f"{fs.__module__}.{fs.__qualname__}", tokenize(self.fs.storage_options), self.root)
        lock.hold_url(key, self.url)
        self._held = key

    def unlock(self) -> None:
        lock.release_url(self._held)
        self._held = None


def _abandon(fs: object, handle: object, full: str) -> None:
    """Throw away an object whose streamed write failed: discard its upload where
    the filesystem can, and delete whatever became visible. The write's own
    error is the one to report."""
    try:
        getattr(handle, "discard", lambda: None)()
        if fs.exists(full):  # type: ignore[attr-defined]
            fs.rm_file(full)  # type: ignore[attr-defined]
    except Exception:
        pass
