"""GEMINI's and LowDiff's real checkpointers: their tiers, their processes, and the state they restore.

In one process: the peer process (``profiler.checkpointers.peerstore``) and LowDiff's
writer process (``profiler.checkpointers.diffwriter``) are real, the job is the tiny one.
The real kills are in ``test_killed_checkpointers.py``.
"""
from __future__ import annotations

import socket
import struct

import pytest
import torch

from profiler.config import CaptureConfig
from profiler.checkpointers.differential import DiffCheckpointer
from profiler.checkpointers.diffwriter import batch_files, frame, read_batch
from profiler.checkpointers.inmemory import PeerCheckpointer
from profiler.checkpointers.peerstore import recv_frame, send_frame, start_peer
from profiler.jobs.plain import PlainJob
from profiler.state import TrainingState
from tests.profiler.conftest import TINY

CONFIG = CaptureConfig(**{**TINY, "warmup_steps": 1})


def _job() -> PlainJob:
    return PlainJob.prepare(CONFIG, say=lambda _: None)


def _state(job) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone()
            for k, t in TrainingState(job.model, job.optimizer, job.scheduler).tensors().items()}


def _same(job, expected) -> None:
    """The live state is ``expected`` bit for bit, LRs included."""
    tensors, lrs = expected
    got = _state(job)
    assert got.keys() == tensors.keys()
    for key, tensor in got.items():
        assert torch.equal(tensor, tensors[key]), key
    assert [g["lr"] for g in job.optimizer.param_groups] == lrs


def _train(job, ckpt, steps, start=0):
    """Steps start+1..steps as the worker runs them; the state after each."""
    states = {}
    for step in range(start + 1, steps + 1):
        job.step((step - 1) * CONFIG.batch_size)
        if ckpt is not None and ckpt.due(step, 10 ** 6):
            ckpt.save(step, step * CONFIG.batch_size)
        states[step] = (_state(job), [g["lr"] for g in job.optimizer.param_groups])
    return states


@pytest.fixture
def peer():
    proc, port = start_peer()
    yield proc, port
    proc.kill()
    proc.wait()
    proc.stdout.close()


# -- the peer ---------------------------------------------------------------------
def test_the_peer_keeps_the_newest_complete_copy_of_the_newest_key(peer):
    _, port = peer
    with socket.create_connection(("127.0.0.1", port)) as conn:
        send_frame(conn, {"op": "put", "key": "a", "meta": {"step": 1}, "size": 3})
        conn.sendall(b"abc")
        assert conn.recv(1) == b"k"
        send_frame(conn, {"op": "put", "key": "a", "meta": {"step": 2}, "size": 3})
        conn.sendall(b"de")  # the sender dies mid-copy
    with socket.create_connection(("127.0.0.1", port)) as conn:
        send_frame(conn, {"op": "get", "key": "a"})
        assert recv_frame(conn) == {"meta": {"step": 1}, "size": 3}
        assert conn.recv(3) == b"abc"
        send_frame(conn, {"op": "put", "key": "b", "meta": {"step": 5}, "size": 1})
        conn.sendall(b"z")
        assert conn.recv(1) == b"k"
        send_frame(conn, {"op": "head", "key": "a"})  # a new job's copy dropped the old job's
        assert recv_frame(conn) == {"meta": None, "size": 0}


# -- GEMINI -----------------------------------------------------------------------
def test_gemini_recovers_from_the_peer_and_from_storage_once_the_peer_is_lost(tmp_path, peer):
    job = _job()
    ckpt = PeerCheckpointer(job, tmp_path / "job0", interval=2, storage_every=4, peer=peer[1])
    assert ckpt.load() is None  # nothing anywhere: the job starts at step 1
    assert [s for s in range(1, 9) if ckpt.due(s, 9)] == [2, 4, 6, 8]
    states = _train(job, ckpt, 6)
    ckpt.flush()
    assert [p.name for p in ckpt.storage.durable()] == ["step4"]  # the peer's 6 is newer
    _train(job, None, 7, start=6)  # the live state moves on
    ckpt.close()

    again = PeerCheckpointer(job, tmp_path / "job0", interval=2, storage_every=4, peer=peer[1])
    resume = again.load()
    assert (resume.step, resume.position) == (6, 6 * CONFIG.batch_size)
    _same(job, states[6])
    again.close()

    # the failure took the peer's memory too: storage is the last tier
    resume = _load_after_losing_the_peer(peer[0], job, tmp_path / "job0", interval=2,
                                         storage_every=4)
    assert resume.step == 4
    _same(job, states[4])


def test_gemini_storage_steps_off_the_copies_grid_take_their_own_copy(tmp_path, peer):
    job = _job()
    ckpt = PeerCheckpointer(job, tmp_path / "job0", interval=2, storage_every=3, peer=peer[1])
    assert [s for s in range(1, 7) if ckpt.due(s, 7)] == [2, 3, 4, 6]
    states = _train(job, ckpt, 3)
    ckpt.flush()
    ckpt.close()
    resume = _load_after_losing_the_peer(peer[0], job, tmp_path / "job0", interval=2,
                                         storage_every=3)
    assert resume.step == 3
    _same(job, states[3])


def _load_after_losing_the_peer(proc, job, folder, **options):
    """Kill the peer, start an empty one, and load from it (storage, then)."""
    proc.kill()
    proc.wait()
    fresh, port = start_peer()
    try:
        ckpt = PeerCheckpointer(job, folder, peer=port, **options)
        resume = ckpt.load()
        ckpt.close()
        return resume
    finally:
        fresh.kill()
        fresh.wait()
        fresh.stdout.close()


# -- LowDiff ----------------------------------------------------------------------
def test_the_writer_seals_batches_that_read_back(tmp_path):
    import subprocess
    import sys

    from profiler.checkpointers.differential import WRITER
    proc = subprocess.Popen([sys.executable, str(WRITER), str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    for step in (1, 2):
        proc.stdin.write(frame({"op": "diff", "step": step, "position": 4 * step,
                                "present": [True], "size": 2}) + bytes([step, step]))
    proc.stdin.write(frame({"op": "seal"}) + frame({"op": "sync"}))
    proc.stdin.write(frame({"op": "diff", "step": 3, "position": 12, "present": [True],
                            "size": 2}) + b"xx")  # never sealed: lost with the writer
    proc.stdin.flush()
    assert proc.stdout.readline() == b"sealed 2\n" and proc.stdout.readline() == b"synced\n"
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    files = batch_files(tmp_path)
    assert [p.name for p in files] == ["batch0000001-0000002.bin"]
    got = [(h["step"], h["position"], bytes(d)) for h, d in read_batch(files[0])]
    assert got == [(1, 4, b"\x01\x01"), (2, 8, b"\x02\x02")]
    assert struct.calcsize("!Q") == 8 and not list(tmp_path.glob("*.tmp"))


def test_lowdiff_trains_on_its_differentials_and_replays_them_bit_for_bit(tmp_path):
    job = _job()
    ckpt = DiffCheckpointer(job, tmp_path / "job0", interval=4, batch=2)
    assert ckpt.load() is None
    states = _train(job, ckpt, 7)  # the optimizer applied each step's top-k gradient
    ckpt._sync()
    ckpt.close()  # step 7's differential was never sealed: lost, as a failure loses it
    # the full save at 4 pruned the batch of 1-2; 3-4 was sealed after it (the next prunes it)
    assert [p.name for p in batch_files(tmp_path / "job0" / "diffs")] == \
        ["batch0000003-0000004.bin", "batch0000005-0000006.bin"]

    again = DiffCheckpointer(job, tmp_path / "job0", interval=4, batch=2)
    resume = again.load()
    assert (resume.step, resume.position, again.replayed) == (6, 6 * CONFIG.batch_size, 2)
    _same(job, states[6])
    again.close()


def test_lowdiff_replays_onto_the_initial_model_before_its_first_full_save(tmp_path):
    job = _job()
    ckpt = DiffCheckpointer(job, tmp_path / "job0", interval=100, batch=1)
    states = _train(job, ckpt, 3)
    ckpt._sync()
    ckpt.close()
    fresh = _job()  # a new process builds the initial model
    again = DiffCheckpointer(fresh, tmp_path / "job0", interval=100, batch=1)
    assert again.load().step == 3 and again.replayed == 3
    _same(fresh, states[3])
    again.close()


def test_lowdiff_saves_cost_the_compression_and_a_full_save_every_interval(tmp_path):
    job = _job()
    ckpt = DiffCheckpointer(job, tmp_path / "job0", interval=2, batch=2)
    job.step(0)
    first = ckpt.save(1, 4)
    assert first.tracking_s > 0 and first.stall_s >= first.tracking_s  # compression only
    job.step(4)
    second = ckpt.save(2, 8)                                            # and a full save
    assert second.bytes > 10 * first.bytes
    assert list((tmp_path / "job0" / "full").iterdir())
    ckpt.close()
