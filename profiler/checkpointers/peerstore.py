"""GEMINI's peer: a second process on this machine that holds a job's newest state copy in its memory.

GEMINI (Wang et al., SOSP 2023) sends each machine's checkpoint to a peer
machine's CPU memory and recovers from there when the peer survived the
failure. One machine has no peer machine, so this process plays it, over
TCP on 127.0.0.1 only (the link ``profiler.mechanisms.peer`` measures). It
is started by whoever outlives the training processes (the validation's
supervisor), so killing a worker does not kill its peer; killing this
process is the failure that takes the peer too.

Torch-free: run as a script (``python profiler/checkpointers/peerstore.py PARENT_PID``); it
prints its port, then serves one connection at a time, forever, until its
parent is gone or it is killed. Frames: 8 bytes big-endian length, a JSON
header, then ``size`` raw bytes where the header says so.

- ``{"op": "put", "key", "meta", "size"}`` + bytes: the copy is received
  into a staging buffer, then becomes the key's newest copy and is
  acknowledged with one byte ``k`` (durable in the peer's memory). A put cut
  off by its sender's death leaves the previous copy in place. A put of a new
  key drops every other key (a new job: the old job's copy is of no use).
- ``{"op": "head", "key"}``: replies a header ``{"meta", "size"}`` (meta null
  and size 0 when the peer holds no copy of that key).
- ``{"op": "get", "key"}``: the same header, then the copy's bytes.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["start_peer", "send_frame", "recv_frame", "recv_exact"]

ACCEPT_POLL_S = 1.0
"""How often a waiting peer checks that its parent still lives."""


def send_frame(conn: socket.socket, header: dict[str, Any]) -> None:
    data = json.dumps(header).encode()
    conn.sendall(struct.pack("!Q", len(data)) + data)


def recv_exact(conn: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``conn``; False if the connection ended first."""
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], len(view) - got)
        if n == 0:
            return False
        got += n
    return True


def recv_frame(conn: socket.socket) -> dict[str, Any] | None:
    """The next header, or None where the connection ended."""
    head = bytearray(8)
    if not recv_exact(conn, memoryview(head)):
        return None
    (size,) = struct.unpack("!Q", head)
    body = bytearray(size)
    if not recv_exact(conn, memoryview(body)):
        return None
    return json.loads(body)


def start_peer(*, cwd: Path | None = None) -> tuple[subprocess.Popen, int]:
    """Start a peer process (a child of this one) and return it and its port."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(os.getpid())],
                            stdout=subprocess.PIPE, text=True, cwd=cwd)
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the GEMINI peer process did not start (it said {line!r})")
    return proc, int(line)


class _Store:
    def __init__(self) -> None:
        self.copies: dict[str, tuple[dict[str, Any], bytearray]] = {}
        self.staging = bytearray()

    def serve(self, conn: socket.socket) -> None:
        while True:
            header = recv_frame(conn)
            if header is None:
                return
            op, key = header["op"], header["key"]
            if op == "put":
                size = int(header["size"])
                if len(self.staging) != size:
                    self.staging = bytearray(size)
                if not recv_exact(conn, memoryview(self.staging)):
                    return  # the sender died mid-copy: the previous copy stands
                old = self.copies.pop(key, (None, bytearray()))[1]
                self.copies = {key: (header["meta"], self.staging)}
                self.staging = old  # double buffering: the next put reuses the old copy's memory
                conn.sendall(b"k")
            elif op in ("head", "get"):
                meta, data = self.copies.get(key, (None, bytearray()))
                send_frame(conn, {"meta": meta, "size": len(data)})
                if op == "get" and data:
                    conn.sendall(data)
            else:
                return


def _main(parent: int) -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(ACCEPT_POLL_S)
    print(srv.getsockname()[1], flush=True)
    store = _Store()
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            if os.getppid() != parent:
                return 0  # the supervisor is gone: nobody can ask for the copy any more
            continue
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            store.serve(conn)
        except OSError:
            pass  # a connection reset by a killed worker
        finally:
            conn.close()


if __name__ == "__main__":
    sys.exit(_main(int(sys.argv[1])))
