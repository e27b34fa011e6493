"""The threads a pass shares (layercheck.drift.parallel): torch's OpenMP team, the helper crew.

What the kernel's passes sum on them is tested in test_kernels.py; here, what each
runner promises whoever hands it work."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from layercheck.drift import parallel as passthreads

ROOT = Path(__file__).resolve().parents[2]


def test_a_failing_piece_raises_on_the_calling_thread_and_the_crew_lives_on():
    crew = passthreads.crew()
    done = []

    def work(i: int) -> None:
        if i == 3:
            raise RuntimeError("piece 3")
        done.append(i)

    with pytest.raises(RuntimeError, match="piece 3"):
        crew.run(8, work, helpers=1)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]  # the other pieces still ran
    done.clear()
    crew.run(8, lambda i: done.append(i), helpers=1)
    assert sorted(done) == list(range(8))


def test_the_crew_is_the_processs_own_and_hires_only_the_helpers_asked():
    crew = passthreads.crew()
    assert passthreads.crew() is crew and crew.pid == os.getpid()
    ran = []
    crew.run(1, lambda i: ran.append(threading.get_ident()), helpers=0)
    assert ran == [threading.get_ident()]  # no helper: the caller ran the one piece


def test_the_team_calls_the_work_once_on_each_thread_the_callers_included(monkeypatch):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(1 << 20).mul_(2.0)  # torch's team runs, then waits for work
        monkeypatch.setattr(passthreads, "_TEAM", passthreads._UNSEEN)  # look again, torch loaded
        team = passthreads.team()
        assert team is not None
        seen = []
        work = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
            lambda data: seen.append((threading.get_ident(), data)))
        box = ctypes.c_int64(7)
        team.run(ctypes.cast(work, ctypes.c_void_p).value, ctypes.addressof(box), 2)
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 2 and len({ident for ident, _ in seen}) == 2
    assert threading.get_ident() in {ident for ident, _ in seen}
    assert {data for _, data in seen} == {ctypes.addressof(box)}


def test_no_team_without_torch_loaded():
    code = ("import sys; from layercheck.drift import parallel as passthreads; "
            "assert 'torch' not in sys.modules and passthreads.team() is None; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
