"""The background writer holds at most queue_bytes of snapshots, and nothing after;
a step commits its layers, then its state, or nothing."""
from __future__ import annotations

import errno
import gc
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref
from pathlib import Path

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.storage import writer as writer_module
from layercheck.storage.commit import Commit
from layercheck.contract.errors import WriteFailed
from layercheck.storage.format import CHECKSUM, checksum_matches
from layercheck.storage.format import MANIFEST, encode_record
from layercheck.storage.layerread import check_structure
from layercheck.storage.manifest import ManifestView, read_manifest
from layercheck.storage.retention import Retention
from layercheck.storage.localstore import LocalStore
from layercheck.storage.writer import LayerSnapshot, StepJob, Writer
from tests.conftest import optimizer_for, tiny_lm, train_step
from tests.stores import (CannotDelete, CountingStore, DropsBuffers, FailingWrites, GatedStore,
                          HeldFull, RecordingStore, layer_step, one_step_of_layers_from)

MB = 1 << 20

# -- no call blocks forever -------------------------------------------------------------------
DEADLINE_S = 60
"""What a test of the Writer alone may take: seconds on a quiet machine, a minute on a
loaded one. A test that trains a model with LayerCheck (``@trains``) may take twice that."""


def trains(test):
    """Marks a test that trains a model: it gets 2 x DEADLINE_S."""
    test.deadline_s = 2 * DEADLINE_S
    return test


@pytest.fixture(autouse=True)
def _no_call_blocks_forever(request):
    """The contract behind every test here: ``submit`` returns once the queue has room,
    ``flush`` once its jobs are committed or failed, ``close`` once the thread has
    ended. A call that blocks forever is a hung trainer; here it fails its test at the
    deadline, saying so, instead of hanging until someone kills it (SIGALRM interrupts
    the main thread's waits)."""
    seconds = getattr(request.function, "deadline_s", DEADLINE_S)

    def expired(signum, frame):
        raise TimeoutError(f"{request.node.name} still blocked after {seconds} s: a Writer "
                           "call (submit, flush, close) that never returns hangs the trainer")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _job(step: int, nbytes: int = MB) -> StepJob:
    tensors = {"param/w": torch.zeros(nbytes // 4)}
    return StepJob(step=step, layers=[LayerSnapshot(0, "w", "threshold", tensors, nbytes)],
                   state=None, nbytes=nbytes)


def test_submit_blocks_once_queue_bytes_are_pending(tmp_path):
    store = GatedStore(tmp_path, lead=3)  # job j is written once job j + 3 is being submitted
    writer = Writer(store, queue_bytes=3 * MB)
    in_flight = []
    for step in range(1, 21):
        store.announce(step)
        writer.submit(_job(step))  # from step 4 on, returns only once job step - 3 committed
        in_flight.append(step - store.appends)
    store.finish()
    writer.close()
    # never more than queue_bytes of snapshots held, and the bound was reached at every step
    assert in_flight == [1, 2] + [3] * 18
    assert store.appends == 20


def test_a_persisted_snapshot_is_released_at_once(tmp_path):
    writer = Writer(LocalStore(tmp_path), queue_bytes=8 * MB)
    job = _job(1)
    alive = weakref.ref(job.layers[0].tensors["param/w"])
    writer.submit(job)
    del job
    writer.flush()
    gc.collect()
    assert alive() is None  # not kept until the next job arrives
    writer.close()


def test_undrained_write_records_stay_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "MAX_RECORDS", 5)
    writer = Writer(LocalStore(tmp_path), queue_bytes=8 * MB)
    for step in range(1, 13):
        writer.submit(_job(step, 1024))
    writer.flush()
    records = writer.drain_completed()
    writer.close()
    assert [r.step for r in records] == [8, 9, 10, 11, 12]  # the newest, in order


# -- what a step commits, read from manifest.jsonl itself -------------------------------------
# The paper's thresholds on a model that learns slowly (lr 1e-5): every step writes some
# layers and not others, and smax forces the rest.
REAL = dict(base_threshold=1e-3, embedding_threshold=1e-2, warmup_steps=3, smax=8)


def _records(root: Path) -> list[dict]:
    """Every intact record of ``root``'s manifest, in file order (a manifest line is
    ``{"crc": ..., "r": record}``; a torn or garbled line is left out)."""
    out = []
    for line in (root / "manifest.jsonl").read_bytes().split(b"\n"):
        try:
            out.append(json.loads(line)["r"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


class Run:
    """A tiny model trained with LayerCheck, remembering per step what the policy
    decided (``decided[t]``: layer names) and the weights and Adam moments after the
    step (``saved[t]``: name -> tensor), so that a restore can be checked against them."""

    def __init__(self, directory, config: LayerCheckConfig, *, lr: float = 1e-5) -> None:
        torch.manual_seed(0)
        self.model = tiny_lm()
        self.opt, self.sched = optimizer_for(self.model, lr=lr, total=40)
        self.lc = LayerCheck(self.model, self.opt, directory, config, scheduler=self.sched)
        assert self.lc.restore() == 0
        self.names = self.lc.layer_map.names
        self.params = {name: [n for n, _ in self.lc.layer_map.parameters(i)]
                       for i, name in enumerate(self.names)}
        self.decided: dict[int, set[str]] = {}
        self.saved: dict[int, dict[str, torch.Tensor]] = {}

    def step(self) -> int:
        train_step(self.model, self.opt, self.sched)
        report = self.lc.step()
        self.decided[report.step] = {self.names[i] for i in report.decision.layers.tolist()}
        self.saved[report.step] = _tensors(self.model, self.opt)
        return report.step

    def last_decided(self, layer: str, step: int) -> int | None:
        return max((s for s, names in self.decided.items() if s <= step and layer in names),
                   default=None)


def _tensors(model, opt) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        out[name] = p.detach().clone()
        for key in ("exp_avg", "exp_avg_sq"):
            if key in opt.state.get(p, {}):
                out[f"{key}/{name}"] = opt.state[p][key].clone()
    return out


def _assert_restores_what_was_decided(run: Run, root: Path, expected_step: int, *,
                                      torn: bool = False) -> None:
    """A new process's view: a fresh model restores ``expected_step``, and every layer
    holds exactly its weights and moments of the last step that decided to write it."""
    model = tiny_lm(seed=7)
    opt, sched = optimizer_for(model, lr=1e-5, total=40)
    with LayerCheck(model, opt, root, LayerCheckConfig(**REAL), scheduler=sched) as again:
        if torn:
            with pytest.warns(UserWarning, match="manifest.jsonl line"):
                assert again.restore() == expected_step
        else:
            assert again.restore() == expected_step
    if expected_step == 0:
        return
    live = _tensors(model, opt)
    for layer, names in run.params.items():
        source = run.saved[run.last_decided(layer, expected_step)]
        for name in names:
            for key in (name, f"exp_avg/{name}", f"exp_avg_sq/{name}"):
                assert torch.equal(live[key], source[key]), (layer, key)


@trains
def test_a_steps_layer_records_precede_its_state_record(tmp_path):
    run = Run(tmp_path / "c", LayerCheckConfig(**REAL))
    for _ in range(20):
        run.step()
    run.lc.close()
    records = [r for r in _records(tmp_path / "c") if r["kind"] in ("layer", "state")]
    steps = sorted({r["step"] for r in records})
    assert steps == list(range(3, 21))  # the base at 3, then a state every step
    for step in steps:
        where = [i for i, r in enumerate(records) if r["step"] == step]
        block = [records[i] for i in where]
        # one contiguous append: the step's layers, then its state, last
        assert where == list(range(where[0], where[-1] + 1)), step
        assert [r["kind"] for r in block] == ["layer"] * (len(block) - 1) + ["state"], step
        assert {r["layer"] for r in block[:-1]} == run.decided[step]
    sizes = {len(run.decided[s]) for s in steps[1:]}
    assert 0 in sizes and max(sizes) < len(run.names)  # partial writes, and state-only steps


@trains
@pytest.mark.parametrize("cut", ["after the first line", "inside the first line",
                                 "inside the last line"])
def test_a_power_cut_inside_a_steps_append_commits_nothing_of_that_step(tmp_path, cut):
    """The manifest is cut where an append of step t stopped: whatever reached the
    disk, step t is not recoverable and the restore is the step before, intact."""
    root = tmp_path / "c"
    run = Run(root, LayerCheckConfig(**REAL))
    while True:
        last = run.step()
        if last > 6 and len(run.decided[last]) >= 2:
            break
    run.lc.close()
    data = (root / "manifest.jsonl").read_bytes()
    lines = data.splitlines(keepends=True)
    block = [i for i, line in enumerate(lines)
             if json.loads(line)["r"].get("step") == last and json.loads(line)["r"]["kind"]
             in ("layer", "state")]
    assert len(block) == len(run.decided[last]) + 1
    first, final = lines[block[0]], lines[block[-1]]
    keep = {"after the first line": b"".join(lines[:block[0] + 1]),
            "inside the first line": b"".join(lines[:block[0]]) + first[:len(first) // 2],
            "inside the last line": b"".join(lines[:block[-1]]) + final[:len(final) // 2]}[cut]
    (root / "manifest.jsonl").write_bytes(keep)
    _assert_restores_what_was_decided(run, root, last - 1, torn=cut != "after the first line")


@trains
@pytest.mark.parametrize("then", ["stop", "go on"])
@pytest.mark.parametrize("from_step", [3, 7], ids=["base", "later"])
def test_a_failed_layer_write_under_warn_never_commits_a_state_without_it(tmp_path, from_step,
                                                                          then):
    """on_error='warn' at the paper's thresholds: a step's layer writes fail while the
    next steps (which do not all rewrite those layers) are already queued. No state
    may commit until the failed layers are written again: every committed step
    restores exactly the layer versions its policy decided, and restore() works."""
    root = tmp_path / "c"
    store = HeldFull(root, one_step_of_layers_from(from_step))
    run = Run(store, LayerCheckConfig(**REAL, on_error="warn"))
    try:
        while not any(run.decided.get(s) for s in range(from_step, run.lc.current_step + 1)):
            run.step()
        failed = run.lc.current_step  # its layer files fail once the writer gets to them
        for _ in range(2):
            run.step()  # queued behind the held job: no retry of the failed layers yet
        assert store.reached.wait(120) and layer_step(store.first) == failed
    finally:
        store.release()
    run.lc.flush()
    # the guard matters here: a queued step carries a state but not every failed layer
    assert any(run.decided[failed] - run.decided[s] for s in (failed + 1, failed + 2))
    if then == "go on":
        for _ in range(6):
            run.step()  # the failed layers are written again at the next opportunity
    run.lc.close()

    records = _records(root)
    header = next(r for r in records if r["kind"] == "header")
    states = [r["step"] for r in records if r["kind"] == "state"]
    for step in states:
        for layer in (entry["name"] for entry in header["layers"]):
            newest = max((r["step"] for r in records if r["kind"] == "layer"
                          and r["layer"] == layer and r["step"] <= step), default=None)
            assert newest is not None and newest == run.last_decided(layer, step), (
                f"step {step} committed with {layer} of step {newest}, but the policy wrote "
                f"it at step {run.last_decided(layer, step)}")
    if then == "go on":
        assert states[-1] == run.lc.current_step
    else:
        assert max(states, default=0) < failed
    _assert_restores_what_was_decided(run, root, max(states, default=0))


@trains
@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_failure_that_no_retry_can_fix_stops_checkpointing_under_either_policy(tmp_path,
                                                                                on_error):
    """'warn' retries storage errors (a disk may empty, a mount come back); a failure that
    is the same at every try was retried forever and nothing was ever committed, and
    under 'raise' its message said to fix the storage. Both now stop, saying what it is."""
    from layercheck.contract.errors import WriteFailed
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=40)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                           on_error=on_error)
    # a failure that is not a storage error (as a tensor safetensors refuses): the same at every try
    broken = FailingWrites(tmp_path / "c", fails=lambda p: p.startswith("layers/model.layers.1@"),
                           error=lambda p: ValueError("cannot serialise this tensor"))
    lc = LayerCheck(model, opt, broken, cfg, scheduler=sched)
    lc.restore()
    with pytest.raises(WriteFailed) as info:
        for _ in range(6):
            train_step(model, opt, sched)
            lc.step()
        lc.flush()
    message = str(info.value)
    assert "cannot serialise this tensor" in message and "fix the storage" not in message.lower()
    assert "not retried" in message
    with pytest.raises(WriteFailed):
        lc.close()


@trains
def test_a_bug_in_the_writer_thread_stops_checkpointing_instead_of_hanging(tmp_path):
    """An exception outside the storage calls (here in retention's bookkeeping, as a
    mutation of it did) killed the writer thread, and the next flush() waited
    forever: a trainer that hangs. It stops checkpointing with the error instead."""
    from layercheck.contract.errors import WriteFailed

    class BrokenRetention:
        def committed(self, versions):
            raise IndexError("pop from an empty list")

    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=40)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                           keep_versions=1, on_error="warn")
    lc = LayerCheck(model, opt, tmp_path / "c", cfg, scheduler=sched)
    lc.restore()
    lc.writer.retention = BrokenRetention()
    outcome: list[BaseException] = []

    def train():
        try:
            for _ in range(4):
                train_step(model, opt, sched)
                lc.step()
            lc.flush()
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    worker = threading.Thread(target=train, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "flush() hung after the writer thread failed"
    assert isinstance(outcome[0], WriteFailed) and "pop from an empty list" in str(outcome[0])
    with pytest.raises(WriteFailed):
        lc.close()


# -- streamed files, several at once ------------------------------------------------------
def _layer_job(step: int, layers: int = 6, floats: int = 1 << 16) -> StepJob:
    """A job of ``layers`` layer files (fp32 weight, bf16 moment, fp64 0-d step) and a state."""
    gen = torch.Generator().manual_seed(step)
    snaps = []
    for i in range(layers):
        tensors = {"param/w": torch.randn(floats, generator=gen),
                   "optim/exp_avg/w": torch.randn(floats, generator=gen).to(torch.bfloat16),
                   "optim/step/w": torch.tensor(float(step), dtype=torch.float64)}
        snaps.append(LayerSnapshot(i, f"enc.{i}", "threshold", tensors, floats * 6 + 8))
    state = ({"rng/torch": torch.arange(5)},
             {"format": "layercheck-state/2", "state": json.dumps({"step": step})})
    return StepJob(step=step, layers=snaps, state=state, nbytes=layers * (floats * 6 + 8))


def test_recorded_checksums_and_sizes_are_those_of_the_files_on_disk(tmp_path):
    writer = Writer(LocalStore(tmp_path), queue_bytes=64 * MB)
    for step in (1, 2):
        writer.submit(_layer_job(step))
    writer.close()
    records = [r for r in _records(tmp_path) if r["kind"] in ("layer", "state")]
    assert len(records) == 2 * 7
    for record in records:
        data = (tmp_path / record["file"]).read_bytes()
        assert record["bytes"] == len(data), record["file"]
        assert record["checksum"].startswith(f"{CHECKSUM}:")
        assert checksum_matches(data, record["checksum"]), record["file"]
        check_structure(data, record["file"])
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_layer_file_is_streamed_from_the_snapshot_never_serialised_whole(tmp_path):
    """The store is handed buffers, not one bytes object, and the writer's Python
    allocations stay far below the file's size (safetensors.save built a whole copy)."""
    store = CountingStore(tmp_path)
    job = _layer_job(1, layers=1, floats=8 << 20)  # a 48 MB layer file
    writer = Writer(store, queue_bytes=256 * MB)
    tracemalloc.start()
    try:
        writer.submit(job)
        writer.flush()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        writer.close()
    size = (tmp_path / "layers/enc.0@000000001.safetensors").stat().st_size
    assert size > 48 * MB
    assert peak < size / 16, f"the writer allocated {peak} bytes for a file of {size}"
    assert not any(issubclass(kind, (bytes, bytearray)) for path, kind in store.kinds.items()
                   if path.startswith("layers/"))


def test_parallel_writes_commit_exactly_the_records_of_serial_writes(tmp_path):
    """Several files at once, yet the same records in the same order (per step: its
    layers in job order, then its state), each appended once no write is in flight."""
    outcome = {}
    for threads in (1, 4):
        root = tmp_path / f"threads{threads}"
        store = CountingStore(root, delay=0.1)
        writer = Writer(store, queue_bytes=64 * MB, threads=threads)
        for step in (1, 2, 3):
            writer.submit(_layer_job(step))
        writer.close()
        assert store.most == threads and store.at_append == [0, 0, 0]
        outcome[threads] = _records(root)[:]
    assert outcome[1] == outcome[4]
    assert [(r["step"], r.get("layer")) for r in outcome[4]] == [
        (step, layer) for step in (1, 2, 3) for layer in [f"enc.{i}" for i in range(6)] + [None]]


def test_a_failed_file_among_parallel_writes_commits_nothing_of_its_step(tmp_path):
    """One layer fails while others are in flight: the step commits nothing, the
    writes in flight end before the failure is reported, and no temp file stays."""
    from layercheck.contract.errors import WriteFailed
    store = CountingStore(tmp_path, delay=0.05, fail=("enc.2",))
    writer = Writer(store, queue_bytes=64 * MB, threads=4)
    writer.submit(_layer_job(1))
    with pytest.raises(WriteFailed, match="No space left"):
        writer.flush()
    assert store.in_flight == 0 and store.at_append == []
    assert not (tmp_path / "manifest.jsonl").exists()
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.glob("states/*"))
    with pytest.raises(WriteFailed):
        writer.close()


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_a_writer_needs_at_least_one_thread(tmp_path, threads):
    with pytest.raises(ValueError, match="integer >= 1"):
        Writer(LocalStore(tmp_path), queue_bytes=MB, threads=threads)


# -- what each failure says, what each commit records (tests the mutants asked for) ----------
ENOSPC = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "layercheck"]


@pytest.mark.parametrize("on_error", ["raise", "warn"])
@pytest.mark.parametrize("what", ["layer", "state", "manifest"])
def test_a_failed_write_says_what_failed_at_which_step_and_what_training_hears(
        tmp_path, caplog, what, on_error):
    """The module contract's ``on_error``: one log line names what failed (a layer, the
    training state, the manifest append), the step and the OS error. Under 'warn' it
    says nothing of the step was committed and its layers will be written again, and
    take_failed_layers hands training every layer of the step, once; under 'raise' it
    says checkpointing stops, and flush raises saying to fix the storage."""
    failing = {"layer": "layers/enc.2@000000001.safetensors",
               "state": "states/000000001.safetensors", "manifest": "manifest.jsonl"}[what]
    store = FailingWrites(tmp_path, fails=lambda path: path == failing,
                         append_fails=what == "manifest")
    writer = Writer(store, queue_bytes=64 * MB, on_error=on_error, threads=1)
    with caplog.at_level(logging.ERROR, logger="layercheck"):
        writer.submit(_layer_job(1))
        if on_error == "raise":
            with pytest.raises(WriteFailed) as info:
                writer.flush()
            assert str(info.value) == (
                f"a background checkpoint write failed ({ENOSPC}: '{failing}'); nothing of it "
                "was committed, every earlier step is still recoverable. Fix the storage "
                "(space, permissions) and resume with restore()")
        else:
            writer.flush()
    named = {"layer": "layer enc.2", "state": "the training state", "manifest": "the manifest"}
    then = {"raise": "checkpointing stops",
            "warn": "nothing of step 1 was committed; training goes on and the layers are "
                    "written again at the next opportunity"}[on_error]
    assert _messages(caplog) == [
        f"layercheck: writing {named[what]} at step 1 failed: {ENOSPC}: '{failing}'; {then}"]
    assert writer.take_failed_layers() == (set(range(6)) if on_error == "warn" else set())
    assert writer.take_failed_layers() == set()
    assert not (tmp_path / "manifest.jsonl").exists()
    if on_error == "raise":
        with pytest.raises(WriteFailed):
            writer.close()
    else:
        writer.close()


@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_failure_no_retry_can_fix_says_so_word_for_word(tmp_path, caplog, on_error):
    """Not a storage error (``errors.retryable``): the same at every try, so it stops
    checkpointing under either policy, and the message says to fix its cause, not the
    storage. A store that drops buffers yet reports success is such a failure: the
    writer counts what passed through it and refuses the file."""
    for store, cause in ((FailingWrites(tmp_path / "a", fails=lambda p: p.startswith("layers/enc.2@"),
                                       error=lambda p: ValueError("cannot serialise this tensor")),
                          "cannot serialise this tensor"),
                         (DropsBuffers(tmp_path / "b"), None)):
        caplog.clear()
        writer = Writer(store, queue_bytes=64 * MB, on_error=on_error, threads=1)
        with caplog.at_level(logging.ERROR, logger="layercheck"):
            writer.submit(_layer_job(1))
            with pytest.raises(WriteFailed) as info:
                writer.flush()
        if cause is None:  # the sizes: of the first buffer, and of the whole file
            first = re.search(r"the store wrote (\d+) of the (\d+) bytes of ", str(info.value))
            assert first and 0 < int(first[1]) < int(first[2])
            reference = Writer(LocalStore(tmp_path / "c"), queue_bytes=64 * MB)
            reference.submit(_layer_job(1))
            reference.close()
            assert int(first[2]) == (tmp_path / "c/layers/enc.0@000000001.safetensors").stat().st_size
            cause = (f"the store wrote {first[1]} of the {first[2]} bytes of "
                     "layers/enc.0@000000001.safetensors and reported success: its write_atomic "
                     "must consume every buffer it is given")
            layer = "enc.0"
        else:
            layer = "enc.2"
        assert str(info.value) == (
            f"a background checkpoint write failed ({cause}); nothing of it was committed, "
            "every earlier step is still recoverable. It is not a storage error, so it is not "
            "retried: fix its cause and resume with restore()")
        assert _messages(caplog) == [
            f"layercheck: writing layer {layer} at step 1 failed: {cause}; checkpointing stops"]
        with pytest.raises(WriteFailed):
            writer.submit(_layer_job(2))  # stopped: nothing more is queued
        with pytest.raises(WriteFailed):
            writer.close()


def test_a_bug_in_the_writer_thread_is_logged_with_its_step(tmp_path, caplog):
    """The writer thread's own failure (here retention's bookkeeping) is logged once,
    naming the step and the exception, and stops checkpointing. Retention runs after
    the commit, so the error says that step was committed, and it was."""

    class BrokenRetention:
        def committed(self, versions):
            raise IndexError("pop from an empty list")

    writer = Writer(LocalStore(tmp_path), queue_bytes=64 * MB, on_error="warn")
    writer.retention = BrokenRetention()
    with caplog.at_level(logging.ERROR, logger="layercheck"):
        writer.submit(_layer_job(3))
        with pytest.raises(WriteFailed, match=re.escape(
                "the background writer failed at step 3 (the writer thread failed "
                "(IndexError('pop from an empty list'))), after committing it: that step and "
                "every earlier committed one are recoverable. It is not a storage error")):
            writer.flush()
    assert _messages(caplog) == [
        "layercheck: the writer thread failed at step 3 (IndexError('pop from an empty list')); "
        "checkpointing stops"]
    assert list(read_manifest(LocalStore(tmp_path)).states) == [3]
    with pytest.raises(WriteFailed):
        writer.close()


class VanishingGroup(Commit):
    """A one-process commit whose process group goes away once ``gone`` is set: asking
    its world size then raises, as torch.distributed does after destroy_process_group.
    The writer asks before it writes a job, so that is a bug before the job's commit."""

    gone = False

    @property
    def world_size(self) -> int:
        if self.gone:
            raise RuntimeError("Default process group has not been initialized")
        return 1


@pytest.mark.parametrize("where", ["before its commit", "its state held back"])
def test_a_bug_in_the_writer_thread_says_when_its_step_was_not_committed(tmp_path, where):
    """The contract of WriteFailed for the writer thread's own failure: when the failing
    step's training state was not committed, the error says so ("before committing it"),
    even after an earlier step did commit its state: a bug before step 2's commit (the
    commit's process group gone), or in retention's bookkeeping after a commit that held
    step 2's state back because layer a, whose write failed at step 1, is still owed."""

    class BrokenRetention:
        def committed(self, versions):
            raise IndexError("pop from an empty list")

    commit = VanishingGroup()
    failing = {"layers/a@000000001.safetensors"} if where == "its state held back" else set()
    writer = Writer(FailingWrites(tmp_path, fails=lambda path: path in failing),
                    queue_bytes=64 * MB, on_error="warn", commit=commit)
    writer.submit(_job_of(1, (0, "a"), (1, "b")))
    writer.flush()
    if where == "before its commit":
        commit.gone, cause = True, "RuntimeError('Default process group has not been initialized')"
    else:
        assert writer.take_failed_layers() == {0, 1}
        writer.retention, cause = BrokenRetention(), "IndexError('pop from an empty list')"
    writer.submit(_job_of(2, (1, "b")))
    with pytest.raises(WriteFailed) as info:
        writer.flush()
    assert str(info.value) == (
        f"the background writer failed at step 2 (the writer thread failed ({cause})), before "
        "committing it: every earlier committed step is recoverable. It is not a storage "
        "error, so it is not retried: fix its cause and resume with restore()")
    states = {"before its commit": [1], "its state held back": []}[where]
    assert list(read_manifest(LocalStore(tmp_path)).states) == states
    with pytest.raises(WriteFailed):
        writer.close()


def _job_of(step: int, *layers: tuple[int, str], reasons=None) -> StepJob:
    """A job writing ``layers`` ((index, name), small tensors) and a training state."""
    snaps = [LayerSnapshot(index, name, (reasons or {}).get(name, "threshold"),
                           {"param/w": torch.full((64,), float(step))}, 256)
             for index, name in layers]
    state = ({"rng/torch": torch.arange(3)},
             {"format": "layercheck-state/2", "state": json.dumps({"step": step})})
    return StepJob(step=step, layers=snaps, state=state, nbytes=256 * len(snaps))


def test_write_records_and_files_say_what_each_committed_version_is(tmp_path):
    """drain_completed: per committed layer version, in job order, its step, index,
    name, the policy's reason, its file's size and the seconds from submit to commit;
    bytes_written: the bytes of the layer files. The manifest records the same reason;
    a file's metadata is the layer's (or the state's as given: one process adds no
    rank); submit returns the seconds it waited, no more than the call took."""
    reasons = {"a": "threshold", "b": "smax", "c": "retry"}
    writer = Writer(LocalStore(tmp_path), queue_bytes=64 * MB)
    start = time.perf_counter()
    for step in (1, 2):
        job = _job_of(step, (0, "a"), (1, "b"), (2, "c"), reasons=reasons)
        before = time.perf_counter()
        waited = writer.submit(job)
        assert 0 <= waited <= time.perf_counter() - before
    writer.flush()
    wall = time.perf_counter() - start
    records = writer.drain_completed()
    writer.close()
    size = {p.relative_to(tmp_path).as_posix(): p.stat().st_size for p in tmp_path.rglob("*.safetensors")}
    assert [(r.step, r.layer, r.name, r.reason, r.bytes) for r in records] == [
        (step, i, name, reasons[name], size[f"layers/{name}@{step:09d}.safetensors"])
        for step in (1, 2) for i, name in enumerate("abc")]
    assert all(0 <= r.persist_s <= wall for r in records)
    assert writer.bytes_written == sum(r.bytes for r in records) < sum(size.values())
    manifest = _records(tmp_path)
    assert [(r["step"], r.get("layer"), r.get("reason")) for r in manifest] == [
        (step, name, reasons.get(name)) for step in (1, 2) for name in ["a", "b", "c", None]]
    for step in (1, 2):
        assert check_structure((tmp_path / f"states/{step:09d}.safetensors").read_bytes(), "s") == {
            "format": "layercheck-state/2", "state": json.dumps({"step": step})}
        assert check_structure((tmp_path / f"layers/b@{step:09d}.safetensors").read_bytes(), "l") == {
            "format": "layercheck-layer/1", "layer": "b", "step": str(step)}


def test_layers_owed_by_several_failed_steps_hold_states_back_until_all_are_written(tmp_path):
    """Under 'warn', step 1 fails to write layer a and step 2 layer b. Step 3 rewrites b
    but not a: its state must not commit (a committed step needs a version of every
    layer). Step 4 rewrites a: its state commits. Training hears of both failed layers."""
    failing = {"layers/a@000000001.safetensors", "layers/b@000000002.safetensors"}
    writer = Writer(FailingWrites(tmp_path, fails=lambda path: path in failing),
                    queue_bytes=64 * MB, on_error="warn")
    writer.submit(_job_of(1, (0, "a")))
    writer.submit(_job_of(2, (1, "b")))
    writer.flush()
    assert writer.take_failed_layers() == {0, 1}
    writer.submit(_job_of(3, (1, "b")))
    writer.submit(_job_of(4, (0, "a")))
    writer.close()
    assert [(r["kind"], r["step"], r.get("layer")) for r in _records(tmp_path)] == [
        ("layer", 3, "b"), ("layer", 4, "a"), ("state", 4, None)]


class RankOneOfTwo(Commit):
    """What the writer asks of a sharded commit, as rank 1 of two: its rank and the
    world size, and a commit per job naming the job's step (the ranks check that
    they agree on it; commit.py). It commits this rank's versions as one process does
    (the exchange between ranks is test_commit's)."""

    rank, world_size = 1, 2

    def __init__(self) -> None:
        self.steps: list[int] = []

    def commit(self, store, step, versions, error):
        self.steps.append(step)
        return super().commit(store, step, versions, error)


def test_a_rank_of_a_sharded_job_names_its_files_and_state_by_rank_and_retires_nothing(tmp_path):
    """Each rank writes its own shard files, named and labelled with its rank (the state
    too); only rank 0 appends drop records (naming every rank's shards), so a rank that
    is not rank 0 retires nothing itself."""
    commit = RankOneOfTwo()
    writer = Writer(LocalStore(tmp_path), queue_bytes=64 * MB, commit=commit)
    writer.retention = Retention(1, ManifestView())
    for step in (1, 2, 3):
        writer.submit(_job_of(step, (0, "a")))
    writer.close()
    assert commit.steps == [1, 2, 3]
    assert [(r["kind"], r["step"], r["file"]) for r in _records(tmp_path)] == [
        (kind, step, path) for step in (1, 2, 3) for kind, path in (
            ("layer", f"layers/a@{step:09d}.rank00001.safetensors"),
            ("state", f"states/{step:09d}.rank00001.safetensors"))]
    for step in (1, 2, 3):
        assert check_structure((tmp_path / f"layers/a@{step:09d}.rank00001.safetensors").read_bytes(),
                               "l") == {"format": "layercheck-layer/1", "layer": "a",
                                        "step": str(step), "rank": "1"}
        assert check_structure((tmp_path / f"states/{step:09d}.rank00001.safetensors").read_bytes(),
                               "s") == {"format": "layercheck-state/2",
                                        "state": json.dumps({"step": step}), "rank": "1"}


# -- retention: drop records, compaction, deletion once no reader reads ----------------------


LAYERS = "abcdefgh"


def _written_at(step: int) -> list[tuple[int, str]]:
    """Every layer at step 1, then one layer a step, in turn: most of what is live
    stays live for several steps, as under a real policy."""
    return list(enumerate(LAYERS)) if step == 1 else [(step % 8, LAYERS[step % 8])]


def _retained_run(root: Path, steps: int, monkeypatch, compact_bytes: int):
    """keep_versions=1 over ``steps`` steps (``_written_at``) each with a state; returns
    the store, the writer and the events (drop appends, compactions with the
    manifest's size before and after)."""
    events: list = []
    real = writer_module.compact

    def compact(store):
        before = store.size(MANIFEST)
        after = real(store)
        events.append(("compact", before, after))
        return after

    monkeypatch.setattr(writer_module, "compact", compact)
    monkeypatch.setattr(writer_module, "COMPACT_BYTES", compact_bytes)
    store = RecordingStore(root, events)
    store.inner.append(MANIFEST, encode_record(  # what LayerCheck appends first (no clock in it)
        {"kind": "header", "layers": [{"name": n, "kind": "block", "params": 64} for n in LAYERS]}))
    writer = Writer(store, queue_bytes=64 * MB)
    writer.retention = Retention(1, ManifestView())
    for step in range(1, steps + 1):
        writer.submit(_job_of(step, *_written_at(step)))
    writer.close()
    return store, writer, events


def test_retention_drops_what_newer_steps_supersede_and_compacts_as_the_manifest_grows(
        tmp_path, monkeypatch):
    """keep_versions=1: after each commit the versions it supersedes get drop records
    and their files go (bytes_dropped counts them); what stays on disk is exactly the
    live versions. The manifest is compacted once it passes COMPACT_BYTES, then once it
    passes twice its size after the last compaction, whatever COMPACT_BYTES is."""
    _, _, sizes = _retained_run(tmp_path / "plain", 12, monkeypatch, 1 << 40)
    drops = [size for kind, size, *_ in sizes if kind == "drop"]
    assert len(drops) == 11 and not [e for e in sizes if e[0] == "compact"]
    # a limit exactly at the manifest's size after the third drop: it is not passed there
    for name, limit in (("tie", drops[2]), ("small", drops[0] // 2)):
        store, writer, events = _retained_run(tmp_path / name, 30, monkeypatch, limit)
        threshold, compactions, doubled = limit, 0, False
        for i, event in enumerate(events):
            if event[0] != "drop":
                continue
            compacted = i + 1 < len(events) and events[i + 1][0] == "compact"
            assert compacted == (event[1] > threshold), (name, i, event, threshold)
            if compacted:
                _, before, after = events[i + 1]
                assert before == event[1] and after < before
                threshold, compactions = max(limit, 2 * after), compactions + 1
                doubled |= 2 * after > limit
        assert compactions >= 2 and (doubled or name == "tie")  # each rule was used
        view = read_manifest(LocalStore(tmp_path / name))
        assert view.latest_step() == 30 and view.problems == []
        live = {v.file for v in view.all_versions()}
        assert live == {f"layers/{n}@{max(s for s in range(1, 31) if (i, n) in _written_at(s)):09d}"
                        ".safetensors" for i, n in enumerate(LAYERS)} | {"states/000000030.safetensors"}
        on_disk = {p.relative_to(tmp_path / name).as_posix()
                   for p in (tmp_path / name).rglob("*.safetensors")}
        assert on_disk == live
        assert writer.bytes_dropped == sum(size for path, size in store.written.items()
                                           if path not in live | {MANIFEST}) > 0


def _hold_a_reader(root: Path):
    """A reader process holding ``root`` open for reading (``LocalStore.reading``)
    until the returned function is called."""
    held_r, held_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader: nothing here but the store's lock
        try:
            os.close(go_w)
            with LocalStore(root).reading():
                os.write(held_w, b"x")
                os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(go_r)
    assert os.read(held_r, 1) == b"x"

    def release() -> None:
        os.close(go_w)
        os.waitpid(pid, 0)

    return release


@pytest.mark.parametrize("released", ["before the last steps", "before close"])
def test_files_of_dropped_versions_wait_for_readers_and_all_go_once_none_reads(tmp_path,
                                                                              released):
    """A reader (an offline restore, inspect) holds off deletion: the drop records are
    appended at once, and the files wait. Every file dropped while it read is deleted
    once no reader reads: at the next retirement, or at close."""
    root = tmp_path / "c"
    writer = Writer(LocalStore(root), queue_bytes=64 * MB)
    writer.retention = Retention(1, ManifestView())
    writer.submit(_job_of(1, (0, "a"), (1, "b")))
    writer.flush()
    release = _hold_a_reader(root)
    try:
        for step in (2, 3, 4):
            writer.submit(_job_of(step, (0, "a"), (1, "b")))
        writer.flush()
        assert len(list(root.rglob("*.safetensors"))) == 4 * 3  # dropped, not yet deleted
        assert {v.step for v in read_manifest(LocalStore(root)).all_versions()} == {4}
    finally:
        release()
    if released == "before the last steps":
        writer.submit(_job_of(5, (0, "a"), (1, "b")))
        writer.flush()
        assert len(list(root.rglob("*.safetensors"))) == 3
    writer.close()
    live = {v.file for v in read_manifest(LocalStore(root)).all_versions()}
    assert {p.relative_to(root).as_posix() for p in root.rglob("*.safetensors")} == live
    assert len(live) == 3


def test_a_failed_retirement_is_logged_and_never_stops_training(tmp_path, caplog):
    """Retiring loses nothing when it fails (the versions stay, or their files become
    gc's leftovers): a warning says so, and training and commits go on."""
    writer = Writer(CannotDelete(tmp_path), queue_bytes=64 * MB, on_error="raise")
    writer.retention = Retention(1, ManifestView())
    with caplog.at_level(logging.WARNING, logger="layercheck"):
        for step in (1, 2):
            writer.submit(_job_of(step, (0, "a")))
        writer.close()
    assert read_manifest(LocalStore(tmp_path)).latest_step() == 2
    eio = f"[Errno {errno.EIO}] {os.strerror(errno.EIO)}"
    assert set(_messages(caplog)) == {
        f"layercheck: retiring superseded versions failed ({eio}); they stay on disk until "
        "`python -m layercheck gc`"}


def test_the_writers_threads_are_named_and_never_keep_a_process_alive(tmp_path):
    """A stack dump of a stalled trainer (py-spy, faulthandler) names LayerCheck's
    threads. A script that ends without close() still exits: the writer thread is a
    daemon (what it had queued is lost, as in a crash, which commits nothing of it)."""
    before = set(threading.enumerate())
    writer = Writer(LocalStore(tmp_path / "a"), queue_bytes=64 * MB, threads=2)
    writer.submit(_layer_job(1))
    writer.flush()
    names = sorted(t.name for t in threading.enumerate() if t not in before)
    writer.close()
    assert names == ["layercheck-file_0", "layercheck-file_1", "layercheck-writer"]
    script = ("import sys; from layercheck.storage.localstore import LocalStore; "
              "from layercheck.storage.writer import Writer; "
              "Writer(LocalStore(sys.argv[1]), queue_bytes=1 << 20)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "b")], cwd=root,
                          capture_output=True, text=True, timeout=DEADLINE_S - 10)
    assert done.returncode == 0, done.stderr[-2000:]


def test_retention_deletes_the_files_the_format_names_never_a_path_as_recorded(tmp_path):
    """What retention retires is deleted (and dropped) by the path its layer and step
    give (``format.version_files``), never by the file its record names: a version
    whose record named the manifest (as a hostile record did, before the replay
    refused it) deletes its own file, not the manifest."""
    import dataclasses
    store = LocalStore(tmp_path)
    writer = Writer(store, queue_bytes=64 * MB)
    writer.submit(_job_of(1, (0, "a")))
    writer.flush()
    old = read_manifest(store).versions["a"][0]

    class Retires:
        def committed(self, versions):
            return [dataclasses.replace(old, file=MANIFEST)] if versions[0].step == 2 else []

    writer.retention = Retires()
    writer.submit(_job_of(2, (0, "a")))
    writer.close()
    view = read_manifest(store)
    assert [v.step for v in view.versions["a"]] == [2] and sorted(view.states) == [1, 2]
    assert not (tmp_path / old.file).exists() and (tmp_path / view.versions["a"][0].file).exists()
