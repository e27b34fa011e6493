"""A file a user named, read bounded: regular files only, each kind at most a stated size.

The torch-free readers (``layercheck.contract``, ``sim``, ``dashboard``) read paths a
user gives them: a trace folder's files, a costs.json, a failure log, a failure record.
Such a path can name anything: a FIFO (``open()`` then blocks until a writer comes,
forever), ``/dev/zero`` or a link to it (``read()`` never ends and memory runs out),
a directory, a file of 100 GB. Every read of one goes through this module:

- opened with ``O_NONBLOCK``, so opening a FIFO returns at once, and refused unless
  what was opened (links followed, as any reader of a user's path does) is a
  regular file: ``RefusedFile`` names what it is instead;
- refused when larger than its kind's bound (``LIMITS``, named in the error), and
  read no further than that bound even if the file grows while it is read;
- a compressed CSV (``.xz``, ``.gz``, ``.bz2``) decompressed no further than the bound;
  a Parquet table also refused when its columns, as the file declares them, pass
  their bound uncompressed.

``RefusedFile`` is an ``OSError``: a reader that already turns an unreadable file into
its own one-line error (``TraceError``, ``CalibrationError``, ``SimError``) does so for
these too. The checkpoint's own files, and the pretrained files it references, are
opened by ``layercheck.storage.fds`` instead: the same refusal of what is not a regular
file, but no bound (a layer file holds gigabytes, read in pieces), links never
followed inside the directory, opened for writing too, and ``NotARegularFile`` (a
``LayerCheckError``) rather than an ``OSError``.
"""
from __future__ import annotations

import bz2
import errno
import io
import json
import lzma
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RefusedFile", "Limit", "LIMITS", "read_bytes", "read_text", "read_json",
           "read_parquet", "read_csv_bytes"]

MiB = 1 << 20
_CHUNK = 16 * MiB


@dataclass(frozen=True)
class Limit:
    """The most bytes one kind of file may hold, and what the kind is (for the error)."""

    what: str
    bytes: int

    def text(self) -> str:
        if self.bytes < MiB:
            return f"{self.bytes:,} bytes"
        return f"{self.bytes / MiB:,.0f} MiB" if self.bytes < 1 << 30 else \
            f"{self.bytes / (1 << 30):,.0f} GiB"


LIMITS = {
    "json": Limit("a trace's or calibration's JSON file", 64 * MiB),
    "study": Limit("a staleness study (staleness.json)", 256 * MiB),
    "table": Limit("a trace's Parquet table", 1 << 30),
    "table data": Limit("a trace's Parquet table, uncompressed", 4 << 30),
    "record": Limit("a failure log or record (CSV, decompressed)", 256 * MiB),
}
"""Each kind's bound. JSON: the largest manifest (a layer table of 10,000 layers) and
calibration are about a megabyte; a staleness study holds every held-out sequence's
losses (a quarter of a megabyte for 200 steps of MiniLM). Tables: a drift table has a
row per (step, layer); a gigabyte holds some hundred million rows compressed, the size
of the simulator's longest job (1,000,000 steps) at a hundred layers. Records: LANL's
release of nine years of 22 systems is 2.9 MB; 256 MiB is about ten million rows,
each parsed in Python."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class RefusedFile(OSError):
    """A path that is not a regular file, or holds more than its kind may."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse_size(path: str | Path, size: str, limit: Limit) -> RefusedFile:
    return RefusedFile(f"{path}: {size}, more than the {limit.text()} {limit.what} may hold; "
                       "is it the right file?")


def read_bytes(path: str | Path, kind: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``LIMITS[kind]`` of them
    (``RefusedFile`` otherwise; ``OSError`` as ``open`` raises it for a missing file)."""
    limit = LIMITS[kind]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR):      # a socket; a directory
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise exc from None
            raise RefusedFile(f"{path}: {_kind(mode)}, not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(f"{path}: {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit.bytes:
            raise _refuse_size(path, f"{info.st_size:,} bytes", limit)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        # read(n) allocates n bytes first: ask for what fstat said, then for what a
        # growing file adds, a chunk at a time, never past the bound
        parts = [handle.read(info.st_size)]
        size = len(parts[0])
        while part := handle.read(min(_CHUNK, limit.bytes + 1 - size)):
            parts.append(part)
            size += len(part)
            if size > limit.bytes:
                raise _refuse_size(path, "growing", limit)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_text(path: str | Path, kind: str) -> str:
    """``read_bytes`` decoded as UTF-8 (``UnicodeDecodeError`` for other bytes)."""
    return read_bytes(path, kind).decode("utf-8")


def read_json(path: str | Path, kind: str = "json") -> Any:
    """``read_text`` parsed as JSON; ``json.JSONDecodeError`` for malformed text, and
    for text nesting deeper than the parser can follow (it recurses)."""
    text = read_text(path, kind)
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text[:0], 0) from None


def read_parquet(path: str | Path):
    """A Parquet table as a DataFrame, bounded on disk (``LIMITS['table']``) and in the
    uncompressed size its row groups declare (``LIMITS['table data']``)."""
    import pandas as pd
    import pyarrow.parquet as pq
    data = io.BytesIO(read_bytes(path, "table"))
    declared = pq.ParquetFile(data).metadata
    total = sum(declared.row_group(i).total_byte_size for i in range(declared.num_row_groups))
    limit = LIMITS["table data"]
    if total > limit.bytes:
        raise _refuse_size(path, f"{total:,} bytes of columns uncompressed", limit)
    data.seek(0)
    return pd.read_parquet(data)


_DECOMPRESSORS = {".xz": lambda: lzma.LZMADecompressor(),
                  ".gz": lambda: zlib.decompressobj(wbits=zlib.MAX_WBITS | 16),
                  ".bz2": lambda: bz2.BZ2Decompressor()}
_UNSUPPORTED = (".zip", ".zst", ".tar", ".tgz")


def read_csv_bytes(path: str | Path, kind: str = "record") -> bytes:
    """A CSV file's bytes, decompressed by its suffix (``.xz``, ``.gz``, ``.bz2``) to at
    most ``LIMITS[kind]``; other archives are refused with the fix (decompress it)."""
    path = Path(path)
    if path.suffix.lower() in _UNSUPPORTED or ".tar." in "".join(path.suffixes[-2:]).lower():
        raise RefusedFile(f"{path}: a {path.suffix} archive; decompress it and give the CSV "
                          "(or compress it with xz, gzip or bzip2)")
    data = read_bytes(path, kind)
    make = _DECOMPRESSORS.get(path.suffix.lower())
    if make is None:
        return data
    limit, out, rest = LIMITS[kind], bytearray(), data
    while rest:                  # every member of the file (``cat a.gz b.gz`` is one file)
        decompressor = make()
        try:
            out += decompressor.decompress(rest, limit.bytes + 1 - len(out))
        except (lzma.LZMAError, zlib.error, OSError, EOFError) as exc:
            raise RefusedFile(f"{path}: not a readable {path.suffix} file ({exc})") from None
        if len(out) > limit.bytes:
            raise _refuse_size(path, "decompressing past that", limit)
        if not decompressor.eof:
            raise RefusedFile(f"{path}: a {path.suffix} file cut short (it ends before its "
                              "compressed stream does)")
        rest = decompressor.unused_data
    return bytes(out)
