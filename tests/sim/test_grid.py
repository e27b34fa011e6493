"""A grid of lanes in pieces: a local process pool and a real Dask cluster give the
numbers of one process, whatever the number of workers."""
import sys

import numpy as np
import pytest

import sim.grid
from sim import Scenario, simulate
from sim.engine import RESULT_FIELDS, run_lanes
from sim.errors import SimError
from sim.grid import _pieces, run_grid

from .conftest import sweep_lanes


def _equal(a, b):
    for field in RESULT_FIELDS:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


@pytest.fixture(scope="module")
def grid():
    return sweep_lanes(mtbfs=(60.0, 900.0, 7200.0), seeds=3, window=2 * 86400.0)


def test_pieces_cover_every_lane_once_and_keep_rows_whole():
    row = np.array([2, 0, 1, 2, 0, 3, 3, 1, 0])
    counts = np.array([100, 5, 0, 40])
    for wanted in (1, 2, 3, 4, 9, 50):
        pieces = _pieces(row, counts, wanted)
        assert 1 <= len(pieces) <= min(wanted, 4)
        assert sorted(np.concatenate(pieces).tolist()) == list(range(len(row)))
        owners = [{int(r) for r in row[p]} for p in pieces]
        assert all(a.isdisjoint(b) for i, a in enumerate(owners) for b in owners[i + 1:])


@pytest.mark.parametrize("workers,start", [(1, None), (2, "fork"), (3, "fork"), (2, "forkserver")])
def test_a_process_pool_gives_the_numbers_of_one_process(grid, monkeypatch, workers, start):
    """Forked workers inherit the grid; others (forkserver: where this process has other
    threads) are sent their pieces."""
    import multiprocessing
    if start:
        monkeypatch.setattr(sim.grid, "_context", lambda: multiprocessing.get_context(start))
    used = []
    monkeypatch.setattr(sim.grid, "ProcessPoolExecutor",
                        lambda **kw: used.append(kw["max_workers"]) or POOL(**kw))
    _equal(run_grid(*grid, workers=workers), run_lanes(*grid))
    assert used == ([] if workers == 1 else [workers])       # a given count: a pool, however small
    used.clear()
    monkeypatch.setattr(sim.grid, "POOL_MIN_WORK", 0)       # the default count, for a grid this big
    _equal(run_grid(*grid), run_lanes(*grid))
    cpus = sim.grid._workers(None)
    assert used == ([] if cpus == 1 else [cpus])


def test_workers_never_run_a_main_script_that_is_not_import_safe(grid, monkeypatch, tmp_path):
    """Streamlit makes a page script ``__main__``: forkserver and spawn workers would run it
    again (and crash, BrokenProcessPool) unless the pool hides it while they start."""
    import multiprocessing
    import types
    ran = tmp_path / "ran"
    page = tmp_path / "page.py"
    page.write_text(f"open({str(ran)!r}, 'w').close()\nraise SystemExit('a page, not a module')\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(page)
    monkeypatch.setitem(sys.modules, "__main__", main)
    for start in ("forkserver",):
        monkeypatch.setattr(sim.grid, "_context", lambda: multiprocessing.get_context(start))
        _equal(run_grid(*grid, workers=2), run_lanes(*grid))
        assert not ran.exists(), f"a {start} worker ran the main script"
        assert sys.modules["__main__"] is main                  # given back


def test_a_real_dask_cluster_gives_the_numbers_of_one_process(grid):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  protocol="tcp", dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://")
        _equal(run_grid(*grid, scheduler=address), run_lanes(*grid))
        # through the API, from the environment, as the command line's --scheduler does
        scenario = Scenario.from_preset("qwen2.5-7b", window_s=86400.0)
        here = simulate(scenario, mtbf_s=600.0, seeds=3, workers=1)
        there = simulate(scenario, mtbf_s=600.0, seeds=3, scheduler=address)
        assert here.equals(there)


def test_bad_schedulers_and_workers_say_what_to_fix(grid, monkeypatch):
    with pytest.raises(SimError, match="e.g. tcp://10.0.0.5:8786"):
        run_grid(*grid, scheduler="localhost")
    monkeypatch.setattr(sim.grid, "CONNECT_TIMEOUT_S", 0.5)
    with pytest.raises(SimError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        run_grid(*grid, scheduler="tcp://127.0.0.1:9")
    monkeypatch.setenv(sim.grid.SCHEDULER_ENV, "tcp://127.0.0.1:9")
    with pytest.raises(SimError, match="unset --scheduler / LAYERCHECK_SIM_SCHEDULER"):
        run_grid(*grid)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(SimError, match="must be a positive integer"):
            run_grid(*grid, workers=bad)


POOL = sim.grid.ProcessPoolExecutor


def test_more_workers_than_lanes_cut_the_grid_into_lanes_not_into_workers(monkeypatch):
    """--workers 10**30 asked numpy for 4 x 10**30 piece edges (ValueError: Maximum allowed
    size exceeded): a grid is never cut into more pieces than it has lanes."""
    grid = sweep_lanes(mtbfs=(900.0,), seeds=2, window=86400.0)
    used = []
    monkeypatch.setattr(sim.grid, "ProcessPoolExecutor",
                        lambda **kw: used.append(kw["max_workers"]) or POOL(**kw))
    _equal(run_grid(*grid, workers=10**30), run_lanes(*grid))
    assert len(used) == 1 and 1 <= used[0] <= len(grid[3])


def test_the_torch_free_install_needs_neither_numba_nor_dask():
    """Both are optional extras: with neither importable, a long grid takes the numpy loop
    and a process pool, and gives the numbers the compiled loop gives here; asking for
    a scheduler says what to install."""
    import subprocess
    import sys
    from pathlib import Path
    code = """
import sys
sys.modules["numba"] = sys.modules["distributed"] = None      # as if not installed
import numpy as np, sim.grid
from sim.grid import run_grid
from sim.errors import SimError
from tests.sim.conftest import sweep_lanes
grid = sweep_lanes(mtbfs=(15.0,), seeds=2, window=86400.0)           # 5,760 turns: auto would compile
res = run_grid(*grid, workers=2)
np.save(sys.argv[1], np.stack([res.useful_s, res.stale_s, res.events]))
try:
    run_grid(*grid, scheduler="tcp://127.0.0.1:9")
except SimError as exc:
    assert "pip install 'layercheck[distributed]'" in str(exc), exc
else:
    raise AssertionError("no error without distributed")
assert "numba" not in sys.modules or sys.modules["numba"] is None
"""
    root = Path(__file__).resolve().parents[2]
    out = root / ".pytest-torchfree-grid.npy"
    try:
        done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=root, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        there = np.load(out)
    finally:
        out.unlink(missing_ok=True)
    grid = sweep_lanes(mtbfs=(15.0,), seeds=2, window=86400.0)
    res = run_lanes(*grid, kernel="compiled" if _has_numba() else "numpy")
    np.testing.assert_array_equal(there, np.stack([res.useful_s, res.stale_s, res.events]))


def _has_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True
