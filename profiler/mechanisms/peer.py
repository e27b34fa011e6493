"""gemini: the copy of the training state to a peer's CPU memory, measured over loopback.

GEMINI sends each machine's checkpoint to a peer machine's CPU memory. One
machine has no peer machine, so a second process on it plays the peer: it
listens on 127.0.0.1 only, receives the state's bytes over TCP into its own
memory and acknowledges each copy. The figure is the state's bytes over the
median round (send everything, wait for the acknowledgement). Loopback has no
wire, so it is the fastest such link: on a cluster the NIC's rate bounds it,
and training's own traffic competes with it (GEMINI interleaves the two).

The peer stops by itself: it exits after the last copy, on a zero-length
header, or once a socket timeout passes; the measuring side also kills it if it
outlives its deadline. Nothing is left running either way.
"""
from __future__ import annotations

import socket
import statistics
import struct
import subprocess
import sys
import time
from typing import Sequence

import torch

from layercheck.contract.calibration import Figure
from sim.placement import HOST_LOSS_SHARE, HOST_LOSS_SOURCE

from ..state import TrainingState
from .base import Bench, Mechanism, rate_figure

__all__ = ["PeerCopy", "loopback_copy_seconds", "byte_views", "PEER_TIMEOUT_S"]

PEER_TIMEOUT_S = 120.0
"""The most one measurement may take, start to end; past it the peer is killed."""

# The peer: a plain interpreter (no torch), one connection, a buffer of the state's size.
_PEER = r"""
import socket, struct, sys
timeout = float(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
srv.settimeout(timeout)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(timeout)
buf = None
while True:
    head = b""
    while len(head) < 8:
        part = conn.recv(8 - len(head))
        if not part:
            sys.exit(0)
        head += part
    (size,) = struct.unpack("!Q", head)
    if size == 0:
        break
    if buf is None or len(buf) != size:
        buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        got += conn.recv_into(view[got:], size - got)
    conn.sendall(b"k")
conn.close()
"""


def byte_views(tensors: Sequence[torch.Tensor]) -> list[memoryview]:
    """Each tensor's bytes as it lies in memory (CPU, contiguous), to send from or to
    receive into (the views share the tensors' memory: a tensor that is not contiguous
    on the CPU is refused, a copy would receive nothing)."""
    out = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        if flat.device.type != "cpu" or flat.data_ptr() != t.data_ptr() or not flat.is_contiguous():
            raise ValueError("byte_views needs contiguous CPU tensors (copy to host buffers first)")
        out.append(memoryview(flat.view(torch.uint8).numpy()))
    return out


def loopback_copy_seconds(tensors: Sequence[torch.Tensor], repeats: int, *,
                          timeout_s: float = PEER_TIMEOUT_S) -> tuple[int, list[float]]:
    """Send ``tensors``' bytes ``repeats`` times to a peer process over 127.0.0.1 and
    return (bytes per copy, seconds of each copy until the peer acknowledged it). The
    peer process is gone when this returns, whatever happened."""
    views = byte_views([t.detach().to("cpu").contiguous() for t in tensors])
    nbytes = sum(v.nbytes for v in views)
    if nbytes == 0 or repeats < 1:
        raise ValueError("a peer copy needs a state of at least one byte and repeats >= 1")
    deadline = time.monotonic() + timeout_s
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(timeout_s)],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(peer.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            samples = []
            for _ in range(repeats + 1):               # the first allocates the peer's buffer
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the loopback peer copy took over {timeout_s:.0f} s")
                start = time.perf_counter()
                conn.sendall(struct.pack("!Q", nbytes))
                for v in views:
                    conn.sendall(v)
                if conn.recv(1) != b"k":
                    raise ConnectionError("the loopback peer closed before acknowledging a copy")
                samples.append(time.perf_counter() - start)
            conn.sendall(struct.pack("!Q", 0))
        peer.wait(timeout=max(1.0, deadline - time.monotonic()))
        return nbytes, samples[1:]
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
        peer.stdout.close()


class PeerCopy(Mechanism):
    """gemini: the full state to a peer process's memory over loopback, and the chance a
    failure takes that peer too (``sim.placement``: the peer shares the host)."""

    name = "peer copy"

    def measure(self, bench: Bench) -> dict[str, Figure]:
        job = bench.single()
        tensors = list(TrainingState(job.model, job.optimizer, job.scheduler).tensors().values())
        nbytes, samples = loopback_copy_seconds(tensors, bench.repeats)
        return {
            "peer_gbps": rate_figure(nbytes, samples, (
                "every state tensor (weights, Adam moments, steps) sent over TCP on 127.0.0.1 "
                "to a second process that receives it into its own memory and acknowledges "
                f"(GEMINI's copy to a peer's CPU memory; loopback: no wire), {bench.where()}")),
            "peer_loss_probability": Figure(value=round(HOST_LOSS_SHARE, 4), source="derived", method=(
                "sim.placement: the peer measured here is a process on the same host, "
                f"so every failure that takes the host's memory takes it: {HOST_LOSS_SOURCE}, "
                f"32 / 419 = {HOST_LOSS_SHARE:.4f}")),
        }
