"""The background writer holds at most queue_bytes of snapshots, and nothing after."""
from __future__ import annotations

import gc
import time
import weakref

import torch

from layercheck import writer as writer_module
from layercheck.store import LocalStore
from layercheck.writer import LayerSnapshot, StepJob, Writer

MB = 1 << 20


class SlowStore:
    """A LocalStore whose atomic writes take ``delay`` seconds; counts manifest appends."""

    def __init__(self, root, delay):
        self.inner, self.delay, self.appends = LocalStore(root), delay, 0
        self.url = self.inner.url

    def write_atomic(self, path, data):
        time.sleep(self.delay)
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
    store = SlowStore(tmp_path, delay=0.02)
    writer = Writer(store, queue_bytes=3 * MB)
    in_flight = []
    for step in range(1, 21):
        writer.submit(_job(step))
        in_flight.append(step - store.appends)
    writer.close()
    assert max(in_flight) <= 3  # never more than queue_bytes of snapshots held
    assert max(in_flight) == 3  # and the bound was reached: the test measured something
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
