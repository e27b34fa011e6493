"""A checkpoint directory's locks: one writer (``.lock``), readers that hold off deletion.

A writer (``LocalStore.lock``) takes ``.lock`` exclusively, held by this process
(not by the children it forks) until it lets go or dies, even by SIGKILL:
POSIX record locks (``lockf``) belong to the process, so DataLoader workers and
other forked helpers of a killed trainer cannot keep the directory locked (an
``flock`` belongs to the open file, which children share). Their pitfall:
closing any descriptor of the lock file drops the process's lock, and a second
lock in the same process would succeed. So this process opens ``.lock`` once per
directory (``hold_directory`` keeps it in ``_HELD``), and a second hold here is
refused before it opens anything. An fsspec location has no lock file: only a
second writer of this process is refused (``hold_url``).

A reader that takes no lock (inspect, plan, export) holds ``.readers`` shared
while it reads (``reading``); retention deletes only while it can take it
exclusively (``unread``), so no file is pulled from under a reader.
"""
from __future__ import annotations

import errno
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..contract.errors import DirectoryLocked, LayerCheckError, NotARegularFile
from .fds import open_regular

__all__ = ["open_here", "hold_directory", "release_directory", "hold_url", "release_url",
           "reading", "unread"]


def open_here(where: str) -> DirectoryLocked:
    """The error of a second open of ``where`` in this process."""
    return DirectoryLocked(
        f"{where} is already open in this process (a LayerCheck, gc or resume_checkpoint() "
        "that has not been closed): close() that one first, or use `with LayerCheck(...) as "
        "lc:`, which closes it")


_HELD: dict[tuple[int, int], int] = {}
"""This process's directory locks: (device, inode) of the directory -> the lock file's
descriptor (the only one this process has open on it; see the module doc)."""
_HELD_GUARD = threading.Lock()

_HELD_URLS: set[tuple[str, str, str]] = set()
"""The fsspec locations this process holds (``hold_url``): the filesystem's class, its
storage options' token and the root."""


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


def hold_directory(root: Path, key: tuple[int, int]) -> None:
    """Take ``root/.lock`` exclusively for this process (``key``: the directory's
    (device, inode)); DirectoryLocked if this process or another holds it,
    LayerCheckError saying the fix where the lock file cannot be made."""
    import fcntl
    with _HELD_GUARD:
        if key in _HELD:
            raise open_here(str(root))
        try:
            fd = open_regular(root / ".lock", os.O_RDWR | os.O_CREAT)
        except NotARegularFile:
            raise LayerCheckError(f"{root}/.lock is a symbolic link or special file; "
                                  "layercheck never follows it: delete it and try again"
                                  ) from None
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise LayerCheckError(
                f"{root} is read-only here ({exc.strerror}): training, restore and gc "
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
                    f"{root} is in use by another process (pid {holder} holds "
                    f"{root}/.lock); stop that process or point this one at another "
                    "directory") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = fd


def release_directory(key: tuple[int, int] | None) -> None:
    """Let go of the directory ``key`` names, if this process holds it."""
    with _HELD_GUARD:
        fd = _HELD.pop(key, None) if key is not None else None
        if fd is not None:
            os.close(fd)


def hold_url(key: tuple[str, str, str], url: str) -> None:
    """Hold the fsspec location ``key`` against a second writer of this process."""
    with _HELD_GUARD:
        if key in _HELD_URLS:
            raise open_here(url)
        _HELD_URLS.add(key)


def release_url(key: tuple[str, str, str] | None) -> None:
    with _HELD_GUARD:
        if key is not None:
            _HELD_URLS.discard(key)


@contextmanager
def reading(root: Path) -> Iterator[None]:
    """Hold off ``unread`` (a trainer's retention) while a reader reads. A directory
    where .readers cannot be made (read-only) has no writer to hold off."""
    import fcntl
    try:
        fd = open_regular(root / ".readers", os.O_RDONLY | os.O_CREAT)
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


@contextmanager
def unread(root: Path) -> Iterator[bool]:
    """Whether no reader holds ``root`` (``reading``): while True, none can start; the
    writer deletes in that moment, or (False) leaves the files for later."""
    import fcntl
    fd = open_regular(root / ".readers", os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                yield False
                return
            raise
        yield True
    finally:
        os.close(fd)
