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
import threading
import uuid
from pathlib import Path
from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Iterable, Iterator, Protocol, Union, runtime_checkable

import numpy as np

from .errors import DirectoryLocked, LayerCheckError, NotARegularFile
from .location import local_directory
from .regularfile import open_regular

__all__ = ["Store", "LocalStore", "FsspecStore", "open_store", "check_relative", "FileData",
           "is_temporary", "temporary_target",
           "read_buffer", "read_into", "ReadBuffer"]

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


def _listed(name: str, temporary: bool) -> bool:
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
    if not _listed(check_relative(path).rsplit("/", 1)[-1], True):
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
        self._identity = _identity(self.root) if self.root.is_dir() else None
        self._lock_key: tuple[int, int] | None = None

    def _writable(self, path: str) -> Path:
        """``_path(path)``, once the directory is checked to be the one opened."""
        try:
            same = _identity(self.root) == self._identity
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
            _fsync_dir(path.parent)

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
                for buffer in _buffers(data):
                    _write_all(fd, buffer)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)

    def append(self, path: str, data: bytes) -> None:
        target = self._writable(path)
        self._make_parents(target)
        created = not os.path.lexists(target)
        # never through a planted link, nor into a FIFO or device
        fd = open_regular(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
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

    def read(self, path: str, limit: int | None = None) -> bytes:
        fd = open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read: a file that grows is read as it was
            size = os.fstat(fd).st_size
            return _read_all(fd, size if limit is None else min(size, limit + 1))
        finally:
            os.close(fd)

    def read_buffer(self, path: str, limit: int | None = None,
                    consume: Callable[[memoryview], None] | None = None) -> ReadBuffer:
        """As ``read``, into one writable buffer allocated once and never zeroed
        (tensors can be views of it); ``consume`` gets each piece as it arrives (a
        checksum on the same pass, while the piece is still in the CPU's cache)."""
        fd = open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read, as in ``read``
            size = os.fstat(fd).st_size
            size = size if limit is None else min(size, limit + 1)
            buffer = np.empty(size, dtype=np.uint8)  # no zeroing pass; numpy asks for huge pages
            with memoryview(buffer) as view:
                done = _fill(fd, view, consume)
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
        fd = open_regular(self._path(path), os.O_RDONLY)
        try:  # the size when opened bounds the read, as in ``read``
            size = os.fstat(fd).st_size
            size = size if limit is None else min(size, limit + 1)
            done = 0
            for target in targets(size):
                got = _fill(fd, target[:size - done], consume)  # never beyond ``size``
                done += got
                if got < len(target):
                    return done
            while done < size:  # beyond the buffers: only counted (and consumed)
                rest = os.read(fd, min(size - done, _PIECE))
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
                          if e.is_file(follow_symlinks=False) and _listed(e.name, temporary))

    def delete(self, path: str) -> None:
        self._writable(check_deletable(path)).unlink(missing_ok=True)

    def delete_unread(self, paths: list[str]) -> bool:
        # readers hold a shared record lock on .readers (``reading``); the writer takes
        # it exclusively for the moment it deletes, or leaves the files for later
        import fcntl
        fd = open_regular(self.root / ".readers", os.O_RDWR | os.O_CREAT)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return False
                raise
            for path in paths:
                self.delete(path)
            return True
        finally:
            os.close(fd)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold off ``delete_unread`` (a trainer's retention) while a reader reads. A
        directory where .readers cannot be made (read-only) has no writer to hold off."""
        import fcntl
        try:
            fd = open_regular(self.root / ".readers", os.O_RDONLY | os.O_CREAT)
        except (PermissionError, FileNotFoundError, NotARegularFile):
            yield
            return
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            yield
            return
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH)  # waits out a deletion in progress
            yield
        finally:
            os.close(fd)

    def lock(self) -> None:
        """Take an exclusive lock on the directory, held by this process (not by the
        children it forks) until ``unlock`` or its death, even by SIGKILL.

        POSIX record locks (``lockf``): they belong to the process, so DataLoader
        workers and other forked helpers of a killed trainer cannot keep the
        directory locked (an ``flock`` belongs to the open file, which children
        share). Their pitfall: closing any descriptor of the lock file drops the
        process's lock, and a second lock in the same process would succeed. So
        this process opens ``.lock`` once per directory (``_HELD``), and a second
        ``lock()`` here is refused before it opens anything."""
        import fcntl
        self._writable(".lock")
        key = self._identity
        with _HELD_GUARD:
            if key in _HELD:
                raise _open_here(str(self.root))
            try:
                fd = open_regular(self.root / ".lock", os.O_RDWR | os.O_CREAT)
            except NotARegularFile:
                raise LayerCheckError(f"{self.root}/.lock is a symbolic link or special file; "
                                      "layercheck never follows it: delete it and try again"
                                      ) from None
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                raise LayerCheckError(
                    f"{self.root} is read-only here ({exc.strerror}): training, restore and gc "
                    "write to the checkpoint directory (its lock, the manifest); use a writable "
                    "copy, or python -m layercheck inspect, plan or export, which only read it"
                    ) from None
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)  # this process holds no lock on it (checked above)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise DirectoryLocked(
                        f"{self.root} is in use by another process (pid {holder} holds "
                        f"{self.root}/.lock); stop that process or point this one at another "
                        "directory") from None
                raise
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _HELD[key] = fd  # type: ignore[index]
            self._lock_key = key

    def unlock(self) -> None:
        with _HELD_GUARD:
            fd = _HELD.pop(self._lock_key, None) if self._lock_key is not None else None
            self._lock_key = None
            if fd is not None:
                os.close(fd)


def _open_here(where: str) -> DirectoryLocked:
    return DirectoryLocked(
        f"{where} is already open in this process (a LayerCheck, gc or resume_checkpoint() "
        "that has not been closed): close() that one first, or use `with LayerCheck(...) as "
        "lc:`, which closes it")


_HELD: dict[tuple[int, int], int] = {}
"""This process's directory locks: (device, inode) of the directory -> the lock file's
descriptor (the only one this process has open on it; see ``LocalStore.lock``)."""
_HELD_GUARD = threading.Lock()


def _forget_locks_in_child() -> None:
    """A forked child holds none of its parent's record locks: it forgets them, and
    closes its copies of their descriptors (which drops nothing of the parent's)."""
    for fd in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()
    _HELD_URLS.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def _identity(root: Path) -> tuple[int, int]:
    info = os.stat(root)
    return info.st_dev, info.st_ino


_HELD_URLS: set[tuple[str, str, str]] = set()
"""The fsspec locations this process holds (``FsspecStore.lock``): the filesystem's
class, its storage options' token and the root."""


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
                      if _listed(name, temporary))

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
        with _HELD_GUARD:
            if key in _HELD_URLS:
                raise _open_here(self.url)
            _HELD_URLS.add(key)
            self._held = key

    def unlock(self) -> None:
        with _HELD_GUARD:
            if self._held is not None:
                _HELD_URLS.discard(self._held)
            self._held = None


def open_store(location: "str | os.PathLike[str] | Store", *, create: bool = True,
               **storage_options: object) -> Store:
    """A Store for a location, or a Store passed through unchanged. Every form that
    names a local directory (a path, ``file:`` and ``local:`` URLs, fsspec caches
    chained over them: ``location.local_directory``) opens it as a ``LocalStore``,
    with its lock; any other fsspec URL ('memory://run1', 's3://b/p') an
    ``FsspecStore``."""
    if isinstance(location, Store) and not isinstance(location, (str, os.PathLike)):
        return location
    text = local_directory(location)
    if text is None:
        url = os.fspath(location)
        try:
            return FsspecStore(url, create=create, **storage_options)
        except LayerCheckError:
            raise
        except Exception as exc:  # unknown protocol, missing driver, unreachable host, ...
            raise LayerCheckError(f"{url}: cannot open it as an fsspec URL ({exc}); check the "
                                  "protocol and that its fsspec driver is installed") from None
    if not create and not Path(text).is_dir():
        raise LayerCheckError(f"{text}: no such checkpoint directory")
    return LocalStore(text, create=create)


_PIECE = 1 << 18
"""Bytes per read of ``read_buffer``: small enough that a checksum of the piece just
read finds it in the CPU's cache, large enough that the system calls do not count."""


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


def _fill(fd: int, view: memoryview, consume: Callable[[memoryview], None] | None) -> int:
    """Read from ``fd`` into ``view`` until it is full or the file ends, piece by
    piece, each piece fed to ``consume`` as it arrives; the bytes read."""
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:done + _PIECE]])
        if not got:
            break
        if consume is not None:
            consume(view[done:done + got])
        done += got
    return done


def _buffers(data: FileData) -> Iterable[Buffer]:
    return (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data


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


def _write_all(fd: int, data: Buffer) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_all(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 26))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


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
