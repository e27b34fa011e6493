"""LowDiff's writer process: differentials read from a queue, written to storage in batches.

LowDiff (Yao et al.; Chenxuan-Yao/TPDS-LowDiff) hands each step's compressed
gradient to a separate process through a queue and goes on training; that
process writes them in batches. Here the queue is this process's stdin (fed
by a thread of the training process, as ``multiprocessing.Queue`` feeds its
pipe); the training process's checkpointer is ``profiler.checkpointers.differential``.

Torch-free: run as a script (``python profiler/checkpointers/diffwriter.py FOLDER``). Frames
on stdin: 8 bytes big-endian length, a JSON header, then ``size`` raw bytes
where the header has one.

- ``{"op": "diff", "step", "position", "present", "size"}`` + bytes: one
  step's differential, held until the next seal;
- ``{"op": "seal"}``: the held differentials become one batch file,
  ``batch<first>-<last>.bin`` (written to a temporary name, fsynced, renamed,
  the folder fsynced: a batch is either complete or absent), then ``sealed
  <last>`` is printed;
- ``{"op": "sync"}``: prints ``synced`` once everything before it is written.

A batch file: 8 bytes length, a JSON list of the differentials' headers
(each with its ``offset`` into the data), then their bytes one after another.
End of input (the training process closed it, or died) ends the process; held
differentials are lost, as a failure loses them.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["read_batch", "batch_files", "frame"]


def frame(header: dict[str, Any]) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack("!Q", len(data)) + data


def batch_files(folder: Path) -> list[Path]:
    """Complete batch files, by their first step."""
    return sorted(Path(folder).glob("batch*.bin"), key=lambda p: int(p.stem[5:].split("-")[0]))


def read_batch(path: Path) -> list[tuple[dict[str, Any], memoryview]]:
    """(header, bytes) of every differential in a batch file."""
    data = memoryview(bytearray(Path(path).read_bytes()))  # writable: torch.frombuffer
    (size,) = struct.unpack("!Q", data[:8])
    index = json.loads(bytes(data[8:8 + size]))
    base = 8 + size
    return [(h, data[base + h["offset"]:base + h["offset"] + h["size"]]) for h in index]


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def _seal(folder: Path, held: list[tuple[dict[str, Any], bytes]]) -> int:
    index, offset = [], 0
    for header, data in held:
        index.append({**header, "offset": offset})
        offset += len(data)
    first, last = held[0][0]["step"], held[-1][0]["step"]
    final = folder / f"batch{first:07d}-{last:07d}.bin"
    tmp = final.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(frame(index))
        for _, data in held:
            out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, final)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return int(last)


def _main(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    stream, held = sys.stdin.buffer, []
    while True:
        head = _read_exact(stream, 8)
        if head is None:
            return 0
        body = _read_exact(stream, struct.unpack("!Q", head)[0])
        if body is None:
            return 0
        header = json.loads(body)
        op = header.pop("op")
        if op == "diff":
            data = _read_exact(stream, int(header["size"]))
            if data is None:
                return 0
            held.append((header, data))
        elif op == "seal" and held:
            last = _seal(folder, held)
            held = []
            print(f"sealed {last}", flush=True)
        elif op == "sync":
            print("synced", flush=True)


if __name__ == "__main__":
    sys.exit(_main(Path(sys.argv[1])))
