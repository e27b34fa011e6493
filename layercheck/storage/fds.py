"""Descriptors of the checkpoint's own files: opened only if regular, read and written whole.

Torch-free.

Every file layercheck reads is a regular file: a checkpoint's own (``store``),
and the files a record names outside the directory (the pretrained files that
hold frozen weights by reference: ``pretrained``). A FIFO would block the open
(or the first read) until someone writes, a device such as /dev/zero would be
read until memory runs out, a folder fails late and obscurely: each is refused
at the open, which never blocks (``O_NONBLOCK``, then ``fstat``: ``S_ISREG``),
with ``NotARegularFile`` naming the path.

A file a user names (a trace, a costs.json, a failure log) is read by another rule,
``layercheck.contract.userfile``: links followed, each kind bounded in size, refused
with an ``OSError``; the checkpoint's files are not bounded (a layer file may hold
gigabytes) and are opened here for writing as well as reading.

Links: inside a checkpoint directory none is followed (``follow=False``:
``O_NOFOLLOW``). A pretrained file may be reached through links (a Hugging Face
cache links each file of a snapshot to its blob), so ``follow=True`` resolves
the path first and opens the resolved one without following: what is opened is
the file the links named when resolved (a link swapped in meanwhile is refused,
never followed), and it must be a regular file all the same.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable

from ..contract.errors import NotARegularFile

__all__ = ["open_regular", "read_at", "PIECE", "fill", "write_all", "read_all", "cut_back",
           "fsync_dir", "identity"]


def open_regular(path: Path, flags: int, *, follow: bool = False) -> int:
    """A descriptor of the regular file ``path`` (see the module doc); NotARegularFile
    for a link (unless ``follow``), a FIFO, a device or a folder opened for reading."""
    target = Path(os.path.realpath(path)) if follow else path
    shown = str(path) if target == path else f"{path} (which links to {target})"
    there = "" if follow else " there"
    try:
        fd = os.open(target, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(f"{shown} is a symbolic link; layercheck never follows one "
                                  "where the checkpoint has a regular file") from None
        if exc.errno == errno.ENXIO:  # a FIFO or device without its other end
            raise NotARegularFile(f"{shown} is a FIFO or device; layercheck reads and writes "
                                  f"only regular files{there}") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or \
            stat.S_ISBLK(mode) else "not a regular file"
        raise NotARegularFile(f"{shown} is {kind}; layercheck reads and writes only regular "
                              f"files{there}")
    return fd


def read_at(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset``, fewer where the file ends first; in
    pieces ``os.pread`` takes whole (Linux reads at most about 2 GiB a call)."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


PIECE = 1 << 18
"""Bytes per read of ``fill``: small enough that a checksum of the piece just read
finds it in the CPU's cache, large enough that the system calls do not count."""


def fill(fd: int, view: memoryview, consume: Callable[[memoryview], None] | None) -> int:
    """Read from ``fd`` into ``view`` until it is full or the file ends, piece by
    piece, each piece fed to ``consume`` as it arrives; the bytes read."""
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:done + PIECE]])
        if not got:
            break
        if consume is not None:
            consume(view[done:done + got])
        done += got
    return done


def write_all(fd: int, data: Buffer) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_all(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 26))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def cut_back(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError:
        pass  # the original error is the one to report; readers skip a torn tail anyway


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def identity(root: Path) -> tuple[int, int]:
    """(device, inode) of ``root``: which folder a path names now."""
    info = os.stat(root)
    return info.st_dev, info.st_ino
