"""sim.scheduler: a --scheduler address is probed with Dask's handshake, bounded, before
distributed is handed it; real sockets throughout (a silent listener, an HTTP server in a
thread, services that speak first or hang up, a real Dask scheduler and its worker)."""
from __future__ import annotations

import http.server
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import sim.grid
from sim.errors import SimError
from sim.grid import run_grid
from sim.scheduler import probe
from tests.deadline import deadline

from .conftest import sweep_lanes

ROOT = Path(__file__).resolve().parents[2]
ENV = sim.grid.SCHEDULER_ENV


@contextmanager
def _service(answer):
    """A TCP service on 127.0.0.1 that accepts every connection and calls ``answer(conn)``
    on it in a thread; connections stay open until the service stops."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def serve():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            answer(conn)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@contextmanager
def _http_server():
    """Python's own HTTP server, in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def grid():
    return sweep_lanes(mtbfs=(900.0,), seeds=1, window=86400.0)


def _refused(grid, address, monkeypatch, words):
    """``run_grid`` on ``address`` refuses in one line with ``words``, within 1 s of
    handshake timeout (and 20 s in all: without the bound it waited forever)."""
    monkeypatch.setattr(sim.grid, "CONNECT_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with deadline(20, f"run_grid on {address}"), pytest.raises(SimError) as caught:
        run_grid(*grid, scheduler=address)
    assert time.monotonic() - start < 10
    message = str(caught.value)
    assert words in message and "\n" not in message, message
    return message


def test_a_silent_listener_is_named_within_the_timeout(grid, monkeypatch):
    with _service(lambda conn: None) as address:
        _refused(grid, address, monkeypatch, "did not answer Dask's handshake within 1 s")


def test_an_http_server_is_not_taken_for_a_scheduler(grid, monkeypatch):
    """Python's HTTP server waits for a request line: the handshake's bytes are not one."""
    with _http_server() as address:
        message = _refused(grid, address, monkeypatch, address)
    assert "is not a Dask scheduler" in message or "did not answer Dask's handshake" in message


def test_a_service_that_speaks_first_is_named_by_what_it_said(grid, monkeypatch):
    """What an HTTP server answers (or an SSH banner) read as a Dask frame length is about
    3.5e18 bytes: distributed asked numpy for 3 EiB. Here: its first line, quoted."""
    for banner, said in ((b"HTTP/1.0 400 Bad request\r\nServer: x\r\n\r\n", "'HTTP/1.0 400 Bad request'"),
                         (b"SSH-2.0-OpenSSH_9.6\r\n", "'SSH-2.0-OpenSSH_9.6'")):
        with _service(lambda conn, banner=banner: conn.sendall(banner)) as address:
            _refused(grid, address, monkeypatch, f"is not a Dask scheduler: it answered {said}")


def test_a_service_that_hangs_up_or_sends_a_frame_of_exabytes_is_refused(grid, monkeypatch):
    with _service(lambda conn: conn.close()) as address:
        _refused(grid, address, monkeypatch, "it closed the connection")
    huge = struct.pack("Q", 3 << 60) + b"\x00" * 16
    with _service(lambda conn: conn.sendall(huge)) as address:
        _refused(grid, address, monkeypatch, "is not a Dask scheduler: it answered")
    # a frame of the right size whose content is not Dask's (msgpack of a handshake)
    garbage = struct.pack("Q", 24) + struct.pack("QQ", 1, 8) + b"\xc1" * 8
    with _service(lambda conn: conn.sendall(garbage)) as address:
        _refused(grid, address, monkeypatch, "frames that are not Dask's")


def test_only_tcp_addresses_are_taken():
    for address, words in (("tls://127.0.0.1:8786", "tls:// is not supported"),
                           ("tcp://127.0.0.1", "port"), ("tcp://:x", "give a Dask scheduler's")):
        with pytest.raises(SimError, match=words):
            probe(address, env=ENV, timeout=1.0)


def test_a_real_scheduler_is_probed_and_used_and_its_worker_is_named(grid, monkeypatch):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  protocol="tcp", dashboard_address=None) as cluster:
        identity = probe(cluster.scheduler_address, env=ENV)
        assert identity["type"] == "Scheduler" and identity["address"] == cluster.scheduler_address
        assert len(run_grid(*grid, scheduler=cluster.scheduler_address).useful_s) == len(grid[3])
        worker = next(iter(cluster.workers.values())).address
        _refused(grid, worker, monkeypatch, "is a Dask Worker, not the scheduler")


def test_the_command_line_answers_one_line_for_a_service_that_is_not_dask():
    """As a user runs it: an HTTP server as --scheduler, exit 2 with one line (the default
    10 s handshake timeout; the process had to be killed before)."""
    with _http_server() as address:
        done = subprocess.run([sys.executable, "-m", "sim", "--mtbf", "1h", "--seeds", "1",
                               "--window", "6h", "--preset", "llama-3.2-1b", "--strategies",
                               "deepspeed", "--scheduler", address], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and address in done.stderr, done.stderr
