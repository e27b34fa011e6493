"""Checksums of committed files and records: CRC-32C at memory speed, CRC-32 read. Torch-free.

A record names its algorithm (``'algorithm:<8 hex>'``, one of ``CHECKSUMS``);
``Checksummer`` computes one over bytes fed in pieces, so a file is
checksummed on the pass that writes or reads it. ``layercheck.storage.format``
re-exports every name here (records hold these strings).
"""
from __future__ import annotations

import zlib
from typing import Any

import google_crc32c
import numpy as np

from ..contract.errors import CorruptVersion

__all__ = ["CHECKSUM", "CHECKSUMS", "Checksummer", "checksum", "checksum_matches"]


CHECKSUM = "crc32c" if google_crc32c.implementation == "c" else "crc32"
"""The algorithm of new records. CRC-32C (Castagnoli), computed by the CPU's CRC
instruction (google-crc32c): the burst-error guarantees of CRC-32 at memory speed
(about 10 GB/s here against zlib's 3.6), and the checksum that object stores
(GCS, S3) keep for an object. Where google-crc32c has no compiled extension (its
pure-Python fallback runs at MB/s), new records use zlib's CRC-32 instead."""
CHECKSUMS = ("crc32c", "crc32")
"""Every algorithm a record may name: records written before CRC-32C name crc32
and still verify."""


def _native_crc32c() -> Any:
    """``crc32c_extend(crc, address, length)`` of the C library google-crc32c runs
    (the one its wheel ships, else the system's), called through ctypes: the same
    function as ``google_crc32c.extend``, but ctypes lets other threads run during
    the call, where the extension holds the GIL for anything but ``bytes`` (so
    threads verifying files took turns). None where no such library is found or
    it does not give the extension's checksums."""
    import ctypes
    import ctypes.util
    import glob
    import os
    folder = os.path.dirname(os.path.abspath(google_crc32c.__file__))
    paths = sorted(glob.glob(folder + ".libs/libcrc32c*.so*")) + \
        sorted(glob.glob(os.path.join(folder, ".dylibs", "libcrc32c*.dylib")))
    system = ctypes.util.find_library("crc32c")
    probe = np.frombuffer(bytes(range(256)) * 3 + b"123456789", dtype=np.uint8)
    for path in paths + ([system] if system else []):
        try:
            extend = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        extend.restype = ctypes.c_uint32
        extend.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        if extend(7, probe.ctypes.data, len(probe)) == google_crc32c.extend(7, probe.tobytes()):
            return extend
    return None


_CRC32C_EXTEND = _native_crc32c() if google_crc32c.implementation == "c" else None
_NATIVE_MIN = 1 << 16
"""Pieces at least this long go through ``_CRC32C_EXTEND`` (where found): below it,
the call's own cost outweighs letting other threads run."""


class Checksummer:
    """A checksum computed over bytes fed in pieces (``update``): streaming a file
    to disk and verifying a read both feed each byte once. ``algorithm``: one of
    CHECKSUMS. ``value`` is the 'algorithm:hex' string stored in records."""

    def __init__(self, algorithm: str = CHECKSUM) -> None:
        if algorithm not in CHECKSUMS:
            raise CorruptVersion(f"checksum algorithm {algorithm!r} is unknown to this version of "
                                 f"layercheck (it knows {', '.join(CHECKSUMS)}): a newer layercheck "
                                 "wrote this checkpoint; upgrade layercheck to read it")
        self.algorithm = algorithm
        self._crc = 0

    def update(self, data: bytes | memoryview) -> None:
        if self.algorithm == "crc32c":
            # a uint8 view: the extension takes any buffer as an array, not as a memoryview
            array = np.frombuffer(data, dtype=np.uint8)
            if _CRC32C_EXTEND is not None and len(array) >= _NATIVE_MIN:
                self._crc = _CRC32C_EXTEND(self._crc, array.ctypes.data, len(array))
            else:
                self._crc = google_crc32c.extend(self._crc, array)
        else:
            self._crc = zlib.crc32(data, self._crc)

    @property
    def value(self) -> str:
        return f"{self.algorithm}:{self._crc & 0xFFFFFFFF:08x}"


def checksum(data: bytes | memoryview, algorithm: str = CHECKSUM) -> str:
    """The checksum stored in records of ``data``, as 'algorithm:<8 hex>'."""
    summer = Checksummer(algorithm)
    summer.update(data)
    return summer.value


def checksum_matches(data: bytes | memoryview, recorded: str) -> bool:
    """Whether ``data`` has the checksum ``recorded`` (any algorithm of CHECKSUMS);
    CorruptVersion if ``recorded`` names none of them."""
    algorithm = recorded.partition(":")[0]
    return checksum(data, algorithm) == recorded
