"""A Dask scheduler's address, checked before ``distributed`` is handed it.

``distributed.Client(address, timeout=...)`` bounds the TCP connect, not what follows:
its first act on a new connection is to read the peer's handshake, a length-prefixed
frame, with no deadline. A service that accepts and stays silent (a plain listener,
an HTTP server waiting for a request) kept ``python -m sim --scheduler`` waiting for
good; one that answers (an HTTP server's ``HTTP/1.0 400``) had its first eight bytes
read as a frame length of about 3.5e18 and numpy asked for 3 EiB.

So ``connect`` first speaks Dask's protocol itself, on a plain socket, with one
deadline (``HANDSHAKE_TIMEOUT_S``) over the connect and every exchange: it sends a
handshake and reads the endpoint's (at most ``HANDSHAKE_MAX_BYTES``), then asks for
its identity (at most ``IDENTITY_MAX_BYTES``). Each answer is read as plain msgpack
data (nothing is unpickled) and must be Dask's: a mapping, and then a scheduler's
identity (a worker's address speaks Dask but takes no client; ``distributed`` left a
traceback at exit for it). Only then does ``distributed.Client`` connect, bounded by
the same timeout. Only ``tcp://`` is probed and accepted (the address every ``dask
scheduler`` prints): ``tls://`` needs certificates the command line does not take.
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

from .errors import SimError

__all__ = ["connect", "probe", "SCHEDULER_ENV", "HANDSHAKE_TIMEOUT_S", "HANDSHAKE_MAX_BYTES", "IDENTITY_MAX_BYTES"]

SCHEDULER_ENV = "LAYERCHECK_SIM_SCHEDULER"
"""The environment variable that names a Dask scheduler's address (``sim.grid``)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""How long the connect and the handshake may take together, and then the client's
connect: a scheduler on a reachable host answers in milliseconds."""
HANDSHAKE_MAX_BYTES = 1 << 16
"""The most a handshake frame may hold; Dask's is under a hundred bytes."""
IDENTITY_MAX_BYTES = 64 << 20
"""The most a scheduler's identity may hold (a few kB per worker it lists)."""
_LENGTH = struct.Struct("Q")  # distributed's frame prefix: native byte order, 8 bytes


def _fix(address: str, env: str) -> str:
    return (f"start it (`dask scheduler`, then `dask worker {address}`) or unset "
            f"--scheduler / {env} to run on a local process pool")


def probe(address: str, *, env: str, timeout: float = HANDSHAKE_TIMEOUT_S) -> dict[str, Any]:
    """The identity of the Dask scheduler at the ``tcp://`` address ``address``: the
    handshake exchanged, then its ``identity`` asked for, within ``timeout`` seconds in
    all; ``SimError`` naming what the endpoint did instead (refused, stayed silent,
    closed, answered something else, or is a worker). ``env``: the environment variable
    that can also name the address (for the fix)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    try:
        scheme, location = parse_address(address, strict=True)
        host, port = parse_host_port(location)
    except (ValueError, TypeError) as exc:
        raise SimError(f"scheduler {address!r} (--scheduler or {env}): {exc}; give a Dask "
                       "scheduler's address, e.g. tcp://10.0.0.5:8786") from None
    if scheme != "tcp":
        raise SimError(f"scheduler {address!r}: give its tcp:// address, e.g. tcp://10.0.0.5:8786 "
                       f"({scheme}:// is not supported here)")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise SimError(f"cannot reach the Dask scheduler at {address} ({type(exc).__name__}: "
                       f"{exc}): {_fix(address, env)}") from None
    with sock:
        try:
            _write(sock, {"compression": None, "python": list(sys.version_info[:3]),
                          "pickle-protocol": 5}, deadline)
            theirs = _read(sock, HANDSHAKE_MAX_BYTES, deadline)
            if not isinstance(theirs, dict):
                raise _NotDask("its first frame is not Dask's handshake")
            _write(sock, {"op": "identity", "reply": True}, deadline)
            identity = _read(sock, IDENTITY_MAX_BYTES, deadline)
        except socket.timeout:
            raise SimError(f"{address} accepted a connection but did not answer Dask's "
                           f"handshake within {timeout:g} s: is it a Dask scheduler? "
                           f"{_fix(address, env)}") from None
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
            # a peer that hung up before reading ours: the same as one that closed first
            raise SimError(f"{address} is not a Dask scheduler: it closed the connection "
                           f"({type(exc).__name__}); give the address `dask scheduler` "
                           "prints") from None
        except _NotDask as exc:
            raise SimError(f"{address} is not a Dask scheduler: {exc}; give the address "
                           "`dask scheduler` prints") from None
        except OSError as exc:
            raise SimError(f"{address} broke off Dask's handshake ({type(exc).__name__}: "
                           f"{exc}): is it a Dask scheduler? {_fix(address, env)}") from None
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        what = f"a Dask {kind}" if isinstance(kind, str) else "a Dask endpoint"
        raise SimError(f"{address} is {what}, not the scheduler: give the scheduler's address "
                       "(`dask scheduler` prints it; its workers connect to it)")
    return identity


def _write(sock: socket.socket, message: dict, deadline: float) -> None:
    """``message`` as Dask frames it: an 8-byte length, then the frames (one, msgpack)."""
    import msgpack
    from distributed.protocol.utils import pack_frames
    frames = pack_frames([msgpack.packb(message)])
    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
    sock.sendall(_LENGTH.pack(len(frames)) + frames)


def _read(sock: socket.socket, limit: int, deadline: float) -> Any:
    """One Dask message of at most ``limit`` bytes, its first frame decoded as plain
    msgpack with distributed's options (nothing the endpoint sends is unpickled or run
    here); ``_NotDask`` for anything else."""
    import msgpack
    from distributed.protocol.utils import unpack_frames
    head = _receive(sock, _LENGTH.size, deadline)
    (length,) = _LENGTH.unpack(head)
    if not 0 < length <= limit:
        raise _NotDask(f"it answered {_shown(head, sock, deadline)}")
    body = _receive(sock, length, deadline)
    try:
        return msgpack.unpackb(unpack_frames(body)[0], raw=False, use_list=False,
                               strict_map_key=False)
    except Exception:  # noqa: BLE001 - msgpack and the frame reader raise several types
        raise _NotDask(f"it answered frames that are not Dask's ({body[:24]!r}...)") from None


class _NotDask(Exception):
    """The endpoint answered, but not with a Dask frame."""


def _receive(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes before ``deadline`` (``socket.timeout`` after it; ``_NotDask``
    when the peer closes first)."""
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        sock.settimeout(left)
        part = sock.recv(n - len(data))
        if not part:
            raise _NotDask("it closed the connection" + (
                f" after {bytes(data)!r}" if data else " without a word"))
        data += part
    return bytes(data)


def _shown(head: bytes, sock: socket.socket, deadline: float) -> str:
    """What the endpoint sent, for the error: its first line, up to 60 bytes."""
    more = b""
    try:
        sock.settimeout(max(min(deadline - time.monotonic(), 0.5), 1e-3))
        more = sock.recv(52)
    except OSError:
        pass
    text = (head + more).split(b"\r\n")[0].split(b"\n")[0][:60]
    return repr(text.decode("latin-1"))


def connect(address: str, *, env: str, timeout: float = HANDSHAKE_TIMEOUT_S):
    """A ``distributed.Client`` of the scheduler at ``address``, once ``probe`` found Dask
    there; ``SimError`` with the fix for anything else (``distributed`` missing too)."""
    if not isinstance(address, str) or "://" not in address:
        raise SimError(f"scheduler {address!r} (--scheduler or {env}): give a Dask "
                       "scheduler's address, e.g. tcp://10.0.0.5:8786")
    try:
        from distributed import Client
    except ImportError:
        raise SimError("running on a Dask scheduler needs dask[distributed]: pip install "
                       f"'layercheck[distributed]', or unset --scheduler / {env} to "
                       "run on a local process pool") from None
    probe(address, env=env, timeout=timeout)
    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise SimError(f"cannot reach the Dask scheduler at {address} ({type(exc).__name__}): "
                       f"{_fix(address, env)}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the scheduler answered a client with
        raise SimError(f"the Dask scheduler at {address} did not take a client "
                       f"({type(exc).__name__}: {str(exc)[:200]}): check that it runs the "
                       "dask and distributed versions installed here") from None
