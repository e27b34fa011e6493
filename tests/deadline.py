"""A deadline for a test whose call, broken, would block forever (a FIFO's open, a socket
that never answers): SIGALRM raises ``TimeoutError`` in the main thread.

Python runs the handler between bytecodes and when a system call it made returns
EINTR, so this stops a blocking ``open()`` or ``read()`` made from Python. A call
blocked inside a C++ library's own I/O (pyarrow opening a file) never returns to
Python: run such a case in a subprocess with a timeout instead.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def deadline(seconds: float, what: str = "the call") -> Iterator[None]:
    def expire(signum, frame):
        raise TimeoutError(f"{what} did not return within {seconds:g} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
