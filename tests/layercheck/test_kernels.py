"""The streaming drift pass (layercheck.drift.kernels): pieces, on torch's OpenMP team or helper
threads (layercheck.drift.parallel), fork safety.

Its sums against the torch path and against weight copies are tested in
test_drift.py; here, what the threads must not change or break."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")  # the kernel is optional: test_drift covers the torch path without it
from layercheck.drift import kernels, parallel as passthreads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _tensors(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n, dtype=np.float32)
    m = (rng.standard_normal(n, dtype=np.float32) * 1e-3).astype(np.float32)
    v = (rng.random(n, dtype=np.float32) * 1e-6).astype(np.float32)
    m[:4096] = v[:4096] = 0.0  # rows no gradient touched
    return w, m, v


def _inputs(sizes, frozen=()):
    arrays = [_tensors(n, seed) for seed, n in enumerate(sizes)]
    ptr = np.array([[w.ctypes.data, 0 if k in frozen else m.ctypes.data,
                     0 if k in frozen else v.ctypes.data]
                    for k, (w, m, v) in enumerate(arrays)], dtype=np.int64)
    eps_c = np.full(len(sizes), 1e-8, dtype=np.float32)
    alpha = np.linspace(0.0, 0.1, len(sizes)).astype(np.float32)
    return arrays, ptr, eps_c, alpha


@pytest.mark.parametrize("sampled", [False, True])
def test_sums_do_not_depend_on_how_many_threads_share_the_pass(sampled, monkeypatch):
    monkeypatch.setattr(kernels, "PER_THREAD", 4096)  # cut even this small pass for 8 threads
    sizes = [3 << 20, 70_001, 5, 1 << 20, 300_000]
    arrays, ptr, eps_c, alpha = _inputs(sizes, frozen={3})
    extents = [(n, 1024, 64) if sampled and n >= 65536 else (n, n, n) for n in sizes]
    plan = kernels.FusedPass(extents)
    results = [plan.run(ptr, eps_c, alpha, 5, threads) for threads in (1, 2, 3, 8)]
    assert len(plan.pieces(8)) - 1 > 8  # it really was cut into pieces for several threads
    for moved, size in results[1:]:
        assert np.array_equal(moved, results[0][0]) and np.array_equal(size, results[0][1])
    moved, size = results[0]
    assert moved[3] == 0.0 and size[3] > 0  # the frozen entry: |w| only
    assert np.all(moved[[0, 1, 2, 4]] > 0)
    w, m, v = (a.astype(np.float64) for a in arrays[0])
    q = np.abs(m / (np.sqrt(v + 1e-30) + 1e-8) + alpha[0] * w)
    if not sampled:
        np.testing.assert_allclose(moved[0], q.sum(), rtol=1e-6)
        np.testing.assert_allclose(size[0], np.abs(w).sum(), rtol=1e-6)


def test_sampled_passes_over_n_phases_sum_to_the_exact_pass():
    """drift_sampling=n's stated bound: phases 0..n-1 read each element of the
    sampled prefix (whole runs) exactly once, in the exact pass's own 64-element
    blocks, so their sums add up to the exact pass's over that prefix: equal up
    to the float64 accumulation order, far inside the 63 u block bound."""
    span, take = 16 * kernels.SUM_BLOCK, kernels.SUM_BLOCK
    sizes = [3 * kernels.CHUNK + 5 * span + 17, 40 * span]  # a tail beyond the last whole run
    arrays, ptr, eps_c, alpha = _inputs(sizes)
    prefix = [n // span * span for n in sizes]
    exact = kernels.FusedPass([(n, n, n) for n in prefix]).run(ptr, eps_c, alpha, 0, 1)
    plan = kernels.FusedPass([(n, span, take) for n in sizes])
    phases = [plan.run(ptr, eps_c, alpha, phase, 2) for phase in range(span // take)]
    for got, want in zip(np.sum(phases, axis=0), exact):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # each phase alone is a 1/16 sample: it differs from every other phase
    assert len({float(moved[0]) for moved, _ in phases}) == span // take


def test_every_element_is_read_by_exactly_one_piece():
    # |w| = 1 everywhere: size counts the elements each entry's pieces read
    sizes = [5 * kernels.CHUNK + 3, 1, kernels.CHUNK, 2 * kernels.PER_THREAD + 17]
    ones = [np.ones(n, dtype=np.float32) for n in sizes]
    ptr = np.array([[w.ctypes.data, 0, 0] for w in ones], dtype=np.int64)
    plan = kernels.FusedPass([(n, n, n) for n in sizes])
    zeros = np.zeros(len(sizes), dtype=np.float32)
    for threads in (1, 2, 4):
        _, size = plan.run(ptr, zeros, zeros, 0, threads)
        assert size.tolist() == [float(n) for n in sizes]


@pytest.mark.parametrize("threads_of", ["torch's team", "helper threads"])
def test_two_threads_may_run_passes_at_once(threads_of, monkeypatch):
    if threads_of == "torch's team":
        pytest.importorskip("torch")
        monkeypatch.setattr(passthreads, "_TEAM", passthreads._UNSEEN)  # look again, torch loaded
        assert passthreads.team() is not None
    else:
        monkeypatch.setattr(passthreads, "team", lambda: None)
    sizes = [2 << 20, 1 << 20]
    _, ptr, eps_c, alpha = _inputs(sizes)
    plans = [kernels.FusedPass([(n, n, n) for n in sizes]) for _ in range(2)]
    expected = plans[0].run(ptr, eps_c, alpha, 0, 1)
    got, errors = [], []

    def caller(plan):
        try:
            for _ in range(5):
                got.append(plan.run(ptr, eps_c, alpha, 0, 2))
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(got) == 10
    assert all(np.array_equal(m, expected[0]) and np.array_equal(s, expected[1]) for m, s in got)


def _fork_script(prelude: str, parent_checks: str, epilogue: str = "") -> str:
    """A script that runs a pass on 2 threads, forks, and has the child run it
    again on 2 and 1 threads. It prints "child 0" when the child's sums equal
    the parent's and the child hired a helper thread of its own (3: other
    sums, 4: no helper; a hang ends the child with SIGALRM, 14)."""
    return textwrap.dedent("""
        import os, signal, threading
        import numpy as np
        from layercheck.drift import kernels, parallel as passthreads
    """) + textwrap.dedent(prelude) + textwrap.dedent("""
        n = 3 << 20
        rng = np.random.default_rng(0)
        w = rng.standard_normal(n, dtype=np.float32)
        m = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
        v = rng.random(n, dtype=np.float32) * np.float32(1e-6)
        ptr = np.array([[w.ctypes.data, m.ctypes.data, v.ctypes.data],
                        [w.ctypes.data, 0, 0]], dtype=np.int64)
        args = (ptr, np.full(2, 1e-8, np.float32), np.full(2, 0.01, np.float32), 0)
        plan = kernels.FusedPass([kernels.Extent(n, n, n)] * 2)
        before = plan.run(*args, threads=2)
    """) + textwrap.dedent(parent_checks) + textwrap.dedent("""
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hang ends the child with SIGALRM, not the test run
            status = 0
            for threads in (2, 1):
                got = plan.run(*args, threads=threads)
                if not (np.array_equal(got[0], before[0]) and np.array_equal(got[1], before[1])):
                    status = 3
            if threading.active_count() != 2:  # the child hired its own helper
                status = 4
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        print("child", status)
    """) + textwrap.dedent(epilogue)


def test_a_child_forked_after_a_threaded_pass_computes_the_same_sums(tmp_path):
    """A process forked after the pass ran on several threads (a DataLoader
    worker, a forked trainer) must not abort or hang on its own pass. The old
    design failed here: its serial twin shared the parallel kernel's numba cache
    entry, so the child re-entered numba's threading layer, and under GNU OpenMP
    (NUMBA_THREADING_LAYER=omp) that aborts a forked process. A fresh cache
    folder: no code compiled elsewhere may stand in for the kernel. (No torch
    here: the pass runs on this module's helper threads.)"""
    code = _fork_script("import numba\n", """
        assert threading.active_count() == 2, "the parent's pass ran on a helper thread"
    """, """
        try:
            print("numba threading layer", numba.threading_layer())
        except ValueError:  # no numba parallel region ever ran in this process
            print("numba threading layer none")
    """)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"),
           "NUMBA_THREADING_LAYER": "omp", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "child 0" in done.stdout, done.stdout + done.stderr
    assert "numba threading layer none" in done.stdout
    assert any((tmp_path / "numba-cache").rglob("*.nbi"))  # it compiled into the fresh cache


def test_a_pass_runs_on_torchs_openmp_team_and_sums_what_one_thread_sums(monkeypatch):
    """Where torch is loaded, the threads of a pass are torch's own OpenMP team
    (the ones that ran the optimizer step): no helper thread is started, and the
    sums are those of one thread, bit for bit."""
    pytest.importorskip("torch")
    monkeypatch.setattr(passthreads, "_TEAM", passthreads._UNSEEN)  # look again, torch being loaded
    monkeypatch.setattr(kernels, "PER_THREAD", 4096)
    assert passthreads.team() is not None
    ran = []
    team_run = passthreads.Team.run
    monkeypatch.setattr(passthreads.Team, "run", lambda self, *a: ran.append(a[-1]) or team_run(self, *a))
    monkeypatch.setattr(passthreads.Crew, "run", lambda *a, **k: pytest.fail("a helper thread ran"))
    sizes = [3 << 20, 70_001, 5, 1 << 20, 300_000]
    _, ptr, eps_c, alpha = _inputs(sizes, frozen={3})
    threads_before = threading.active_count()
    for extents in ([(n, n, n) for n in sizes],
                    [(n, 1024, 64) if n >= 65536 else (n, n, n) for n in sizes]):
        plan = kernels.FusedPass(extents)
        one = [a.copy() for a in plan.run(ptr, eps_c, alpha, 5, 1)]
        for threads in (2, 3, 8):
            moved, size = plan.run(ptr, eps_c, alpha, 5, threads)
            assert np.array_equal(moved, one[0]) and np.array_equal(size, one[1])
    assert ran == [2, 3, 8] * 2  # the team ran every threaded pass, at the thread count asked
    assert threading.active_count() == threads_before  # no thread of this module's own


def test_a_child_forked_after_a_pass_on_torchs_team_computes_the_same_sums(tmp_path):
    """A child forked after torch's OpenMP team ran (a torch op, then a pass on
    the team) inherits a runtime whose threads it does not have: a parallel
    region there waits forever. The child's pass must take its own helper
    threads instead, and give the same sums."""
    pytest.importorskip("torch")
    code = _fork_script("""
        import torch
        torch.set_num_threads(2)
        torch.ones(1 << 22).mul_(2.0)  # torch's team runs, then waits for work
    """, """
        assert passthreads.team() is not None, "the parent's pass did not run on torch's team"
        assert threading.active_count() == 1, "the parent hired a helper thread"
    """)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "child 0" in done.stdout, done.stdout + done.stderr
