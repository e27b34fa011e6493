"""The threads a pass shares: torch's own OpenMP team, else a crew of helper threads.

A pass cut into pieces (``layercheck.drift.kernels``) runs on whichever threads this module
gives it, the caller's included:

- ``team()``: torch's OpenMP runtime, where it is loaded and this process was not
  forked after this module was imported. ``Team.run`` calls a C function (a numba
  callback) on ``threads`` threads of it as one parallel region (``GOMP_parallel``,
  through ctypes): the threads that just ran ``optimizer.step()`` and are still spinning
  for work take the pieces at once, and no other thread competes with them for the
  cores (with a pool of its own beside torch's, a pass right after the optimizer step
  ran about 25% slower on 2 cores: its second thread shared a core with torch's
  spinning one).
- ``crew()``: else (torch's runtime not loaded, or a forked child: its runtime waits
  forever for its parent's threads) up to ``helpers`` plain Python threads of this
  process, which pull pieces from a shared counter and block on a queue between
  passes (the kernel releases the GIL). A forked child hires its own.
"""
from __future__ import annotations

import ctypes
import os
import queue
import sys
import threading
from typing import Callable

__all__ = ["Team", "team", "Crew", "crew"]


class Team:
    """A pass run as one parallel region of torch's OpenMP runtime: its threads
    (the ones that just ran ``optimizer.step()``, still spinning for work) take
    the pieces, and no other thread competes with them for the cores."""

    def __init__(self, runtime: ctypes.CDLL) -> None:
        self._parallel = runtime.GOMP_parallel  # the GNU ABI: libiomp5 and libomp export it too
        self._parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._parallel.restype = None

    def run(self, work: int, data: int, threads: int) -> None:
        """The C function at address ``work`` (``void work(void *data)``) called with
        ``data`` on each of ``threads`` threads of the team, the caller's included, as one
        parallel region; returns when every call has. ``data`` must outlive the call;
        ctypes lets go of the GIL for it."""
        self._parallel(work, data, threads, 0)


_UNSEEN = object()
_TEAM: Team | None | object = _UNSEEN
"""This process's team once looked for: None where torch's runtime was not found."""
_FORKED = False
"""Whether this process was forked after this module was imported."""


def _forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_forked)


def team() -> Team | None:
    """torch's OpenMP runtime, where this process has it loaded and was not forked
    after importing this module; else None (the helper threads below take the pass).

    A forked child inherits the runtime's idea of its thread pool but not the
    threads: a parallel region there waits for them forever (torch's own ops
    hang in such a child, unless it trains on one thread)."""
    global _TEAM
    if _FORKED or "torch" not in sys.modules:  # looked for once torch is there
        return None
    if _TEAM is _UNSEEN:
        runtime = _torch_openmp()
        _TEAM = Team(runtime) if runtime is not None else None
    return _TEAM


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime that torch loaded, found among this process's mapped
    files (Linux): the copy under torch's folder that its wheels bundle. None
    without one (torch not built with OpenMP, or linked to a runtime elsewhere:
    then the helper threads take the pass, as before)."""
    try:
        with open("/proc/self/maps") as maps:
            fields = (line.split(None, 5) for line in maps)
            paths = {f[5].strip() for f in fields if len(f) == 6}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if "torch" in path and name.startswith(("libgomp", "libiomp5", "libomp")) and ".so" in name:
            try:
                runtime = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
                runtime.GOMP_parallel  # noqa: B018 (raises AttributeError where it is missing)
                return runtime
            except (OSError, AttributeError):
                continue
    return None


# -- the helper threads ------------------------------------------------------------
class _Call:
    """One pass cut into pieces: whoever is free takes the next piece."""

    def __init__(self, pieces: int, work: Callable[[int], None]) -> None:
        self._pieces, self._work = pieces, work
        self._next = 0
        self._open = pieces
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None

    def work(self) -> None:
        while True:
            with self._lock:
                i, self._next = self._next, self._next + 1
            if i >= self._pieces:
                return
            try:
                self._work(i)
            except BaseException as exc:  # re-raised on the calling thread by wait()
                self._error = self._error or exc
            finally:
                with self._lock:
                    self._open -= 1
                    if self._open == 0:
                        self._done.set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


class Crew:
    """A process's helper threads: they wait on a queue (blocking, not spinning)
    and join whatever pass is queued."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def run(self, pieces: int, work: Callable[[int], None], helpers: int) -> None:
        """Run ``work(i)`` for every piece i, here and on up to ``helpers`` helpers."""
        call = _Call(pieces, work)
        self._hire(helpers)
        for _ in range(helpers):
            self._calls.put(call)
        call.work()
        call.wait()

    def _hire(self, helpers: int) -> None:
        with self._lock:
            while len(self._threads) < helpers:
                t = threading.Thread(target=self._serve, daemon=True,
                                     name=f"layercheck-drift-{len(self._threads) + 1}")
                t.start()
                self._threads.append(t)

    def _serve(self) -> None:
        while True:
            self._calls.get().work()


_CREW: Crew | None = None


def crew() -> Crew:
    """This process's helpers; a forked child hires its own (its parent's
    threads were not copied into it, and their locks may be held)."""
    global _CREW
    if _CREW is None or _CREW.pid != os.getpid():
        _CREW = Crew()
    return _CREW
