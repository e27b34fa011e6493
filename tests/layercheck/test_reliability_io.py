"""Full disk and I/O errors during persistence: no partial commit, training is told.

Faults are injected through a Store wrapper (ENOSPC, EACCES, EIO on a layer
file, a state file or the manifest append, including an append that leaves
half a line behind), and for real on a 2 MiB tmpfs where this machine allows
mounting one.
"""
from __future__ import annotations

import errno
import math
import logging
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.errors import WriteFailed
from layercheck.storage.format import MANIFEST, encode_record
from layercheck.storage.manifest import read_manifest
from layercheck.recovery import make_plan
from layercheck.storage import fds as store_module
from layercheck.storage.fsspecstore import FsspecStore
from layercheck.storage.localstore import LocalStore
from tests.conftest import optimizer_for, tiny_lm, train_step
from tests.stores import Faults

EVERY_STEP = dict(base_threshold=0, embedding_threshold=0, warmup_steps=2)
ROOT_DIR = Path(__file__).resolve().parents[2]


def _run(store, steps, *, on_error="raise", model=None, opt=None, sched=None):
    """Train ``steps`` steps on a fresh tiny model; returns (lc, model, opt, sched) open."""
    torch.manual_seed(0)
    if model is None:
        model = tiny_lm()
        opt, sched = optimizer_for(model, total=40)
    lc = LayerCheck(model, opt, store, LayerCheckConfig(**EVERY_STEP, on_error=on_error),
                    scheduler=sched)
    lc.restore()
    for _ in range(steps):
        train_step(model, opt, sched)
        lc.step()
    lc.flush()
    return lc, model, opt, sched


def _committed_steps(root):
    view = read_manifest(LocalStore(root))
    return sorted(view.states), view


@pytest.mark.parametrize("where,err", [
    ("layers/model.layers.1", errno.ENOSPC), ("layers/model.layers.1", errno.EACCES),
    ("states/", errno.EIO), (MANIFEST, errno.ENOSPC), (MANIFEST, errno.EIO)])
def test_raise_policy_stops_training_with_a_clear_error_and_commits_nothing_partial(
        tmp_path, err, where):
    store = Faults(tmp_path / "c")
    lc, model, opt, sched = _run(store, 4)
    assert _committed_steps(tmp_path / "c")[0] == [2, 3, 4]
    store.fail("append" if where == MANIFEST else "write_atomic", where, err, torn=True)
    train_step(model, opt, sched)
    lc.step()  # step 5: its write fails in the background
    with pytest.raises(WriteFailed) as info:
        lc.flush()
    message = str(info.value)
    assert os.strerror(err) in message and "nothing of it was committed" in message
    assert "restore()" in message  # says what to do
    with pytest.raises(WriteFailed):
        lc.step()  # training is stopped, not silently continued
    with pytest.raises(WriteFailed):
        lc.close()
    steps, view = _committed_steps(tmp_path / "c")
    assert steps == [2, 3, 4]
    assert all(v.step <= 4 for vs in view.versions.values() for v in vs)
    assert not list((tmp_path / "c").rglob("*.tmp"))  # no temp file left behind
    model2 = tiny_lm(seed=3)
    opt2, sched2 = optimizer_for(model2, total=40)
    with LayerCheck(model2, opt2, tmp_path / "c", scheduler=sched2) as again:
        assert again.restore() == 4


def test_warn_policy_keeps_training_says_so_loudly_and_rewrites_the_failed_layer(
        tmp_path, caplog):
    store = Faults(tmp_path / "c")
    lc, model, opt, sched = _run(store, 4, on_error="warn")
    store.fail("write_atomic", "layers/model.layers.0", errno.ENOSPC, times=3)
    with caplog.at_level(logging.ERROR, logger="layercheck"):
        for _ in range(6):  # steps 5..10; the first three attempts at layers.0 fail
            train_step(model, opt, sched)
            lc.step()
            lc.flush()  # never raises under 'warn'
    lc.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3
    assert all("No space left on device" in r.getMessage() for r in errors)
    assert all("written again at the next opportunity" in r.getMessage() for r in errors)
    steps, view = _committed_steps(tmp_path / "c")
    assert steps == [2, 3, 4, 8, 9, 10]  # a step with a failed write is not committed
    assert [v.step for v in view.versions["model.layers.0"]] == [2, 3, 4, 8, 9, 10]
    plan = make_plan(LocalStore(tmp_path / "c"), view)
    assert plan.step == 10 and set(plan.staleness().values()) == {0}


def test_warn_policy_survives_a_failed_base_checkpoint(tmp_path):
    """The base checkpoint fails for one layer: no step may be committed that
    has no version of that layer, or restore() would be stuck."""
    store = Faults(tmp_path / "c")
    store.fail("write_atomic", "layers/model.norm", errno.EIO, times=1)
    lc, *_ = _run(store, 3, on_error="warn")  # base at step 2 fails for model.norm
    lc.close()
    steps, view = _committed_steps(tmp_path / "c")
    assert steps == [3]
    model = tiny_lm(seed=5)
    opt, sched = optimizer_for(model, total=40)
    with LayerCheck(model, opt, tmp_path / "c", scheduler=sched) as again:
        assert again.restore() == 3


def test_a_retried_write_is_recorded_as_a_retry_not_as_a_threshold_crossing(tmp_path):
    """Under 'warn' the layers of a failed job are written again at the next
    opportunity because the write failed, not because they drifted: their
    versions say so, and the traces' reason counts stay honest."""
    store = Faults(tmp_path / "c")
    store.fail("write_atomic", "layers/model.norm", errno.EIO, times=1)  # fails the base
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=40)
    config = LayerCheckConfig(base_threshold=math.inf, embedding_threshold=math.inf,
                              warmup_steps=2, on_error="warn")
    with LayerCheck(model, opt, store, config, scheduler=sched) as lc:
        lc.restore()
        for _ in range(4):
            train_step(model, opt, sched)
            lc.step()
            lc.flush()
    _, view = _committed_steps(tmp_path / "c")
    assert {name: [(v.step, v.reason) for v in versions]
            for name, versions in view.versions.items()} == {
        name: [(3, "retry")] for name in view.layer_names}


def test_a_torn_manifest_append_never_swallows_the_next_commit(tmp_path):
    """ENOSPC in the middle of the manifest append leaves half a line; the
    records appended after it must still be readable."""
    store = Faults(tmp_path / "c")
    lc, model, opt, sched = _run(store, 3, on_error="warn")
    store.fail("append", MANIFEST, errno.ENOSPC, torn=True)
    for _ in range(2):
        train_step(model, opt, sched)
        lc.step()
        lc.flush()
    lc.close()
    steps, view = _committed_steps(tmp_path / "c")
    assert steps == [2, 3, 5]
    assert view.problems == []  # the torn half line was rolled back


def test_a_crash_torn_manifest_tail_does_not_swallow_the_resume_record(tmp_path):
    """A process dies mid-append (power loss): the next process's first record
    (the resume record) must not merge with the torn tail, or versions of the
    abandoned timeline would be mixed into later restores."""
    root = tmp_path / "c"
    lc, *_ = _run(root, 6)
    lc.close()
    manifest = root / MANIFEST
    lines = manifest.read_bytes().splitlines(keepends=True)
    # drop state 6 and tear the last layer record of step 6: step 6 never committed
    state6 = [i for i, line in enumerate(lines) if b'"states/000000006' in line]
    lines = lines[:state6[0]]
    lines[-1] = lines[-1][:25]
    manifest.write_bytes(b"".join(lines))
    model = tiny_lm(seed=1)
    opt, sched = optimizer_for(model, total=40)
    with LayerCheck(model, opt, root, scheduler=sched) as again:
        with pytest.warns(UserWarning, match="manifest.jsonl line"):
            assert again.restore() == 5
    view = read_manifest(LocalStore(root))
    assert view.resumes[-1] == 5
    assert all(v.step <= 5 for vs in view.versions.values() for v in vs)


# -- a real full disk -----------------------------------------------------------
@pytest.fixture()
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs, or a skip saying why there is none."""
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); fault injection covers ENOSPC")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"this machine does not allow mounting a tmpfs: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill_until_full(lc, model, opt, sched, limit=200):
    for _ in range(limit):
        train_step(model, opt, sched)
        lc.step()
        lc.flush()
    raise AssertionError(f"a 2 MiB filesystem took {limit} full checkpoints without filling up")


def test_real_full_disk_raise_policy(tiny_fs):
    """Every step writes every layer (~190 KiB) into 2 MiB until the disk is full."""
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=400)
    lc = LayerCheck(model, opt, tiny_fs / "c", LayerCheckConfig(**EVERY_STEP), scheduler=sched)
    lc.restore()
    with pytest.raises(WriteFailed, match="No space left on device"):
        _fill_until_full(lc, model, opt, sched)
    last = lc.current_step
    with pytest.raises(WriteFailed):
        lc.close()
    view = read_manifest(LocalStore(tiny_fs / "c"))
    assert view.problems == [] and view.states and max(view.states) < last
    plan = make_plan(LocalStore(tiny_fs / "c"), view)  # verifies every planned file
    assert plan.warnings == []
    assert not list((tiny_fs / "c").rglob("*.tmp"))
    model2 = tiny_lm(seed=2)
    opt2, sched2 = optimizer_for(model2, total=400)
    with LayerCheck(model2, opt2, tiny_fs / "c", scheduler=sched2) as again:
        assert again.restore() == plan.step


def test_real_full_disk_warn_policy_recovers_when_space_returns(tiny_fs, caplog):
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=400)
    lc = LayerCheck(model, opt, tiny_fs / "c", LayerCheckConfig(**EVERY_STEP, on_error="warn"),
                    scheduler=sched)
    lc.restore()
    with caplog.at_level(logging.ERROR, logger="layercheck"):
        for _ in range(30):
            train_step(model, opt, sched)
            lc.step()
            lc.flush()
    assert any("No space left on device" in r.getMessage() for r in caplog.records)
    stuck = read_manifest(LocalStore(tiny_fs / "c")).latest_step()
    assert stuck is not None and stuck < lc.current_step
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_fs)], check=True)
    for _ in range(2):
        train_step(model, opt, sched)
        lc.step()
    lc.close()
    view = read_manifest(LocalStore(tiny_fs / "c"))
    assert view.latest_step() == lc.current_step
    assert view.problems == []
    assert make_plan(LocalStore(tiny_fs / "c"), view).warnings == []


# -- a read-only directory, and a directory deleted under a running writer (issue 13) -------
READ_ONLY_CHILD = r"""
import fcntl, json, os, sys
import layercheck.tools.cleanup, layercheck.tools.export, layercheck.tools.inspection, layercheck.recovery
from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cli import main
from tests.conftest import optimizer_for, tiny_lm
root, out, report = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = tiny_lm()
opt, sched = optimizer_for(model)
if os.geteuid() == 0:  # root ignores file modes: become nobody (everything is imported)
    os.setgid(65534); os.setuid(65534)
result = {}
try:
    LayerCheck(model, opt, root, scheduler=sched)
    result["open"] = "opened"
except Exception as exc:
    result["open"] = f"{type(exc).__name__}: {exc}"
for argv in (["inspect", root, "--json"], ["plan", root, "--json"], ["export", root, "--out", out],
             ["gc", root]):
    sys.stdout = open(os.devnull, "w")
    result[argv[0]] = main(argv)
    sys.stdout = sys.__stdout__
os.write(report, json.dumps(result).encode())
"""


def test_a_read_only_directory_is_read_by_the_offline_commands_and_refused_clearly(tmp_path):
    """restore needs to write (its lock, a resume record): on a read-only directory
    LayerCheck says so instead of a PermissionError traceback; inspect, plan and export
    only read, and work; gc, which deletes, is one line and exit 2."""
    import json
    import stat
    import sys
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="layercheck-read-only-"))  # a path 'nobody' may walk
    try:
        lc, *_ = _run(base / "c", 4)
        lc.close()
        out = base / "out"
        out.mkdir()
        for folder in (base, out):
            folder.chmod(0o777)
        for path in [base / "c", *(base / "c").rglob("*")]:
            if path.is_dir():
                path.chmod(0o555)
        before = {p: p.stat().st_mtime_ns for p in (base / "c").rglob("*")}
        read, write = os.pipe()
        done = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(base / "c"),
                               str(out / "model"), str(write)], pass_fds=(write,),
                              capture_output=True, text=True, cwd=ROOT_DIR,
                              env={**os.environ, "PYTHONPATH": str(ROOT_DIR)})
        os.close(write)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(os.read(read, 1 << 16))
        os.close(read)
        assert result["open"].startswith("LayerCheckError") and "read-only" in result["open"]
        assert "python -m layercheck" in result["open"]
        assert (result["inspect"], result["plan"], result["export"], result["gc"]) == (0, 0, 0, 2)
        assert (out / "model" / "model.safetensors").exists()
        assert {p: p.stat().st_mtime_ns for p in (base / "c").rglob("*")} == before
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(stat.S_IRWXU)
        shutil.rmtree(base)


@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_directory_deleted_under_a_running_writer_stops_checkpointing(tmp_path, on_error):
    """The directory is deleted (rm -rf) while training runs, and another run creates it
    anew. The first writer would retry forever (warn), or say to fix the storage
    (raise), and recreate folders and append records in the other run's directory.
    It stops, under either policy, saying what happened, and writes nothing there."""
    root = tmp_path / "c"
    lc, model, opt, sched = _run(root, 4, on_error=on_error)
    shutil.rmtree(root)
    other, _, _, _ = _run(root, 2)  # a new run in a new directory of the same name
    mine = (root / MANIFEST).read_bytes()
    with pytest.raises(WriteFailed, match="deleted or replaced") as info:
        for _ in range(3):
            train_step(model, opt, sched)
            lc.step()
        lc.flush()
    assert "not retried" in str(info.value)
    with pytest.raises(WriteFailed):
        lc.close()
    assert (root / MANIFEST).read_bytes() == mine  # the new run's directory is untouched
    other.close()


# -- streamed atomic writes (the writer hands a file as buffers) -----------------------------
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_a_streamed_write_cut_short_leaves_neither_file_nor_temp(tmp_path, err):
    """The disk fails on the second buffer, after the first reached the temp file:
    the temp file goes, nothing appears under the name, the error is the disk's."""
    store = LocalStore(tmp_path)
    real_write_all, calls = store_module.write_all, []

    def fail_on_second(fd, buffer):
        calls.append(len(buffer))
        if len(calls) == 2:
            raise OSError(err, os.strerror(err))
        real_write_all(fd, buffer)

    path = "layers/a@000000001.safetensors"
    with mock.patch.object(store_module, "write_all", fail_on_second), \
            pytest.raises(OSError) as caught:
        store.write_atomic(path, iter([b"x" * 100, memoryview(b"y" * 100), b"z"]))
    assert caught.value.errno == err and len(calls) == 2
    assert not store.exists(path) and store.list("layers", temporary=True) == []


def test_a_streamed_write_writes_each_buffer_in_order(tmp_path):
    store = LocalStore(tmp_path)
    words = np.arange(5, dtype=np.int32)
    store.write_atomic("layers/b@000000001.safetensors",
                       (b for b in [b"ab", memoryview(b"cd"), bytearray(b"ef"), memoryview(words),
                                    b""]))
    assert store.read("layers/b@000000001.safetensors") == b"abcdef" + words.tobytes()
    assert store.list("layers", temporary=True) == ["layers/b@000000001.safetensors"]


def test_an_fsspec_store_streams_buffers_and_discards_a_failed_object():
    store = FsspecStore(f"memory://streamed-{uuid.uuid4().hex[:8]}")
    store.write_atomic("layers/a@000000001.safetensors", iter([b"ab", memoryview(b"cd")]))
    assert store.read("layers/a@000000001.safetensors") == b"abcd"

    def cut_short():
        yield b"ab"
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(OSError):
        store.write_atomic("layers/b@000000001.safetensors", cut_short())
    assert not store.exists("layers/b@000000001.safetensors")
    assert store.list("layers", temporary=True) == ["layers/a@000000001.safetensors"]


def test_a_streamed_write_survives_short_writes(tmp_path):
    """os.write may write less than asked (signals, pipes, some filesystems): the rest
    of each buffer follows, counted in bytes whatever the buffer's item size."""
    store = LocalStore(tmp_path)
    words = np.arange(50, dtype=np.int64)
    real_write = os.write
    with mock.patch.object(store_module.os, "write", lambda fd, b: real_write(fd, bytes(b)[:7])):
        store.write_atomic("layers/c@000000001.safetensors", iter([b"header", memoryview(words)]))
    assert store.read("layers/c@000000001.safetensors") == b"header" + words.tobytes()
