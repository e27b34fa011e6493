"""Where checkpoint bytes live, behind one narrow protocol.

The policy and the writer never call open() themselves; they talk to a
Store. Two implementations, a module each: ``localstore.LocalStore`` (a directory,
with fsync and atomic rename) and ``fsspecstore.FsspecStore`` (any fsspec URL:
memory://, s3://, ...); ``location.open_store`` opens the one a location names.
Here: the protocol, the path rules every backend keeps, and the reads that use a
backend's faster path where it has one. Paths are relative, '/'-separated, and may
not leave the store's root.
"""
from __future__ import annotations

import re
from typing import (TYPE_CHECKING, Callable, ContextManager, Iterable, Protocol, Union,
                    runtime_checkable)

from ..contract.errors import LayerCheckError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Store", "check_relative", "check_deletable", "listed", "FileData", "is_temporary",
           "temporary_target", "read_buffer", "read_into", "ReadBuffer"]

Buffer = Union[bytes, bytearray, memoryview]
FileData = Union[Buffer, Iterable[Buffer]]
"""What ``write_atomic`` writes: the file's bytes, or the file as buffers in order
(``layerfile.LayerFile.buffers``), streamed one by one, never joined."""

_SAFE_PATH = re.compile(r"^[A-Za-z0-9._@-]+(/[A-Za-z0-9._@-]+)*$")
_TEMPORARY = re.compile(r"^\.[A-Za-z0-9._@-]+\.[0-9a-f]{8}\.tmp$")  # write_atomic's temp files


def is_temporary(path: str) -> bool:
    """Whether ``path`` names a temp file of ``write_atomic`` (``.<name>.<hex>.tmp``):
    a write in flight, or one a crash cut short. Nothing else matches."""
    return bool(_TEMPORARY.match(path.rsplit("/", 1)[-1]))


def temporary_target(path: str) -> str | None:
    """The path whose write the temp file ``path`` holds (``layers/.x.1a2b3c4d.tmp``:
    ``layers/x``); None unless ``path`` is one (``is_temporary``)."""
    folder, _, name = path.rpartition("/")
    if not is_temporary(name):
        return None
    return f"{folder}/{name[1:-13]}" if folder else name[1:-13]  # '.' + name + '.<8 hex>.tmp'


def listed(name: str, temporary: bool) -> bool:
    """Whether ``Store.list`` names a file called ``name``: every backend's one rule.
    Names layercheck could not have written (spaces, odd characters) are not ours,
    nor dot files (.lock, .readers, anyone's); '.<name>.<hex>.tmp' is a write in
    flight (or cut short by a crash), named only with ``temporary``."""
    return bool(_SAFE_PATH.match(name)) and (not name.startswith(".")
                                             or (temporary and is_temporary(name)))


def check_deletable(path: str) -> str:
    """``path`` if a store may delete it, else LayerCheckError: only a file its ``list``
    can name (with ``temporary``), never a dot file such as the directory's ``.lock``
    (deleting it would let a second writer in beside a running one) or ``.readers``."""
    if not listed(check_relative(path).rsplit("/", 1)[-1], True):
        raise LayerCheckError(f"refusing to delete {path!r}: a store deletes only files its "
                              "listing names (layercheck's own), never .lock, .readers or "
                              "another dot file")
    return path


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

    ``write_atomic`` makes ``data`` (bytes, or an iterable of buffers it
    streams in order: ``FileData``) visible under ``path`` all at once and
    durable before it returns; ``append`` adds bytes at the end of ``path``
    durably (creating it), and an append that fails (ENOSPC, EIO) leaves the
    file as it was where the storage allows. Readers never see a partial
    ``write_atomic``. A crash mid-append can still leave a torn tail: see
    ``manifest.seal_torn_tail``. ``lock`` takes the directory for one writer;
    ``reading()`` is held by a reader that takes no lock (inspect, plan, export)
    while it reads, and ``delete_unread`` deletes only while no reader holds it
    (False: nothing was deleted), so retention never pulls a file from under a
    reader. ``read`` returns the whole file, or with
    ``limit`` at most its first ``limit + 1`` bytes (enough to tell that it is
    longer); it reads only regular files, never through a link
    (``NotARegularFile``). ``list`` names the files under ``prefix`` that a
    commit can name, with ``temporary`` also the temp files of writes in
    flight or cut short by a crash (``is_temporary``); ``prefix`` "" is the
    directory itself. ``delete`` (and ``delete_unread``) removes only a file
    ``list`` could name (``check_deletable``: never ``.lock``); which of those
    may go is the caller's to derive from the format (``format.version_files``,
    ``format.deletable``), never a path taken from a record.
    """

    url: str

    def write_atomic(self, path: str, data: FileData) -> None: ...
    def append(self, path: str, data: bytes) -> None: ...
    def read(self, path: str, limit: int | None = None) -> bytes: ...
    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    # no mutate: mutmut would add its copies of this stub to the protocol's members
    def list(self, prefix: str, *, temporary: bool = False) -> list[str]: ...  # pragma: no mutate
    def delete(self, path: str) -> None: ...
    def delete_unread(self, paths: list[str]) -> bool: ...
    def reading(self) -> ContextManager[None]: ...
    def lock(self) -> None: ...
    def unlock(self) -> None: ...


ReadBuffer = Union[bytearray, "np.ndarray"]
"""What ``read_buffer`` gives: a writable, one-dimensional buffer of bytes (``len``
is its size; ``memoryview``, ``torch.frombuffer`` and ``numpy.frombuffer`` take it)."""


def read_buffer(store: Store, path: str, limit: int | None = None,
                consume: Callable[[memoryview], None] | None = None) -> ReadBuffer:
    """``store.read(path, limit)`` as a writable buffer, ``consume`` fed every byte of
    it once: on the same pass where the store's class reads into a buffer
    (``LocalStore.read_buffer``, which must read what its ``read`` would), else
    once ``read`` returned (a copy). A wrapper that delegates to a store (its
    ``__getattr__``) is read through its own ``read``."""
    if getattr(type(store), "read_buffer", None) is not None:
        return store.read_buffer(path, limit, consume)  # type: ignore[attr-defined]
    buffer = bytearray(store.read(path, limit))
    if consume is not None:
        with memoryview(buffer) as view:
            consume(view)
    return buffer


def read_into(store: Store, path: str, limit: int | None, consume: Callable[[memoryview], None],
              targets: Callable[[int], Iterable[memoryview]]) -> int:
    """``store.read(path, limit)`` scattered into the buffers ``targets`` yields, as
    ``LocalStore.read_into`` does (the bytes read, each fed to ``consume`` once);
    where the store's class has no ``read_into``, from what ``read`` returned (a copy)."""
    if getattr(type(store), "read_into", None) is not None:
        return store.read_into(path, limit, consume, targets)  # type: ignore[attr-defined]
    with memoryview(store.read(path, limit)) as data:
        done = 0
        for target in targets(len(data)):
            got = min(len(target), len(data) - done)
            target[:got] = data[done:done + got]
            consume(target[:got])
            done += got
            if got < len(target):
                return done
        if done < len(data):
            consume(data[done:])
        return len(data)
