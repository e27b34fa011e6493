"""A headless ``streamlit run`` of the dashboard on a free local port, for what drives it
in a browser: the browser tests, the cold-start benchmark, the screenshot tool.

``serve`` starts the server, polls its health endpoint until it answers and yields the
URL; on leaving, the server is stopped. A server that exits or does not answer in time
raises ``ServerError`` with the end of what it printed. No Streamlit import here (it
runs in the child process).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

__all__ = ["ROOT", "APP", "ServerError", "free_port", "serve"]

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"


class ServerError(RuntimeError):
    """The server exited or did not answer its health check in time."""


def free_port() -> int:
    """A local TCP port free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(script: str | Path = APP, *, env: Mapping[str, str] | None = None,
          timeout_s: float = 120.0) -> Iterator[str]:
    """Run ``streamlit run script`` headless (no file watcher, no usage statistics) from
    the repository's root with ``env`` (default: this process's); yield its URL once
    /_stcore/health answers; stop it on leaving."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(script), "--server.address", "127.0.0.1",
             "--server.port", str(port), "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=None if env is None else dict(env), stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            start = time.perf_counter()
            while True:
                try:
                    urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None or time.perf_counter() - start > timeout_s:
                        log.seek(0)
                        said = log.read().decode(errors="replace")[-4000:]
                        raise ServerError(f"streamlit run {script} did not start "
                                          f"({'exited' if proc.poll() is not None else 'no answer'}):\n"
                                          f"{said}") from None
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
