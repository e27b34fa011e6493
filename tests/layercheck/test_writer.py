"""The background writer holds at most queue_bytes of snapshots, and nothing after;
a step commits its layers, then its state, or nothing."""
from __future__ import annotations

import errno
import gc
import json
import os
import re
import signal
import threading
import time
import tracemalloc
import weakref
from pathlib import Path

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck import writer as writer_module
from layercheck.format import CHECKSUM, checksum_matches
from layercheck.manifest import check_structure
from layercheck.store import LocalStore
from layercheck.writer import LayerSnapshot, StepJob, Writer
from tests.conftest import optimizer_for, tiny_lm, train_step

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


class GatedStore:
    """A LocalStore whose writer may write job j only once the producer has begun to
    submit job j + ``lead`` (``announce``) or has finished: the writer can never run
    ahead, so whether the queue fills up does not depend on thread timing. Counts
    manifest appends."""

    def __init__(self, root, lead: int) -> None:
        self.inner, self.lead, self.appends = LocalStore(root), lead, 0
        self.url = self.inner.url
        self._cv = threading.Condition()
        self._announced, self._done = 0, False

    def announce(self, step: int) -> None:
        with self._cv:
            self._announced = step
            self._cv.notify_all()

    def finish(self) -> None:
        with self._cv:
            self._done = True
            self._cv.notify_all()

    def write_atomic(self, path, data):
        step = int(re.search(r"@(\d+)", path).group(1))
        with self._cv:
            assert self._cv.wait_for(lambda: self._done or self._announced >= step + self.lead,
                                     timeout=120)
        self.inner.write_atomic(path, data)

    def append(self, path, data):
        self.inner.append(path, data)
        self.appends += 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


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


class HeldFailure:
    """A LocalStore whose first layer-file write of a step >= ``from_step`` holds the
    writer thread until ``release()`` and then fails with ENOSPC, as do the other layer
    files of that step: training goes on meanwhile and hears of the failure only later."""

    def __init__(self, root: Path, from_step: int) -> None:
        self.inner, self.url = LocalStore(root), str(root)
        self.from_step, self.step = from_step, None
        self.reached, self._go = threading.Event(), threading.Event()

    def write_atomic(self, path: str, data: bytes) -> None:
        step = int(re.search(r"@(\d+)", path).group(1)) if path.startswith("layers/") else -1
        if step >= self.from_step and self.step in (None, step):
            if self.step is None:
                self.step = step
                self.reached.set()
                self._go.wait(120)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        self.inner.write_atomic(path, data)

    def release(self) -> None:
        self._go.set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


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
    store = HeldFailure(root, from_step)
    run = Run(store, LayerCheckConfig(**REAL, on_error="warn"))
    try:
        while not any(run.decided.get(s) for s in range(from_step, run.lc.current_step + 1)):
            run.step()
        failed = run.lc.current_step  # its layer files fail once the writer gets to them
        for _ in range(2):
            run.step()  # queued behind the held job: no retry of the failed layers yet
        assert store.reached.wait(120) and store.step == failed
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


class BrokenSerialiser:
    """A LocalStore whose layer-file writes fail with something that is not a storage
    error (as a tensor that safetensors refuses, or a refused file name, would): the
    same failure at every try."""

    def __init__(self, root: Path) -> None:
        self.inner, self.url = LocalStore(root), str(root)

    def write_atomic(self, path: str, data: bytes) -> None:
        if path.startswith("layers/model.layers.1@"):
            raise ValueError("cannot serialise this tensor")
        self.inner.write_atomic(path, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@trains
@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_a_failure_that_no_retry_can_fix_stops_checkpointing_under_either_policy(tmp_path,
                                                                                on_error):
    """'warn' retries storage errors (a disk may empty, a mount come back); a failure that
    is the same at every try was retried forever and nothing was ever committed, and
    under 'raise' its message said to fix the storage. Both now stop, saying what it is."""
    from layercheck.errors import WriteFailed
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=40)
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                           on_error=on_error)
    lc = LayerCheck(model, opt, BrokenSerialiser(tmp_path / "c"), cfg, scheduler=sched)
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
    from layercheck.errors import WriteFailed

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


class CountingStore:
    """A LocalStore whose atomic writes each take ``delay`` seconds longer, counting
    how many are in flight (``most``: at once), what they were handed (``kinds``),
    and how many were in flight at each manifest append (``at_append``); the
    writes of layers named in ``fail`` raise ENOSPC after the delay."""

    def __init__(self, root: Path, delay: float = 0.0, fail: tuple[str, ...] = ()) -> None:
        self.inner, self.url, self.delay, self.fail = LocalStore(root), str(root), delay, fail
        self.in_flight = self.most = 0
        self.kinds: dict[str, type] = {}
        self.at_append: list[int] = []
        self._lock = threading.Lock()

    def write_atomic(self, path: str, data) -> None:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.kinds[path] = type(data)
        try:
            time.sleep(self.delay)
            if any(path.startswith(f"layers/{name}@") for name in self.fail):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            self.inner.write_atomic(path, data)
        finally:
            with self._lock:
                self.in_flight -= 1

    def append(self, path: str, data: bytes) -> None:
        self.at_append.append(self.in_flight)
        self.inner.append(path, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


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
    from layercheck.errors import WriteFailed
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
