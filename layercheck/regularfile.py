"""Opening a file that must be a regular one: never blocking, links by policy. Torch-free.

Every file layercheck reads is a regular file: a checkpoint's own (``store``),
and the files a record names outside the directory (the pretrained files that
hold frozen weights by reference: ``pretrained``). A FIFO would block the open
(or the first read) until someone writes, a device such as /dev/zero would be
read until memory runs out, a folder fails late and obscurely: each is refused
at the open, which never blocks (``O_NONBLOCK``, then ``fstat``: ``S_ISREG``),
with ``NotARegularFile`` naming the path.

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

from .errors import NotARegularFile

__all__ = ["open_regular", "read_at"]


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
