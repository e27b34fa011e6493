"""The Store protocol's contract (``layercheck.storage.store.Store``), once, on every backend.

Each test takes ``store``, a fresh store of every backend in ``BACKENDS``; a new
backend is one line there and must pass all of them. What only one backend has
(LocalStore's fsync, links, cross-process locks and readers; FsspecStore's append
fallback) is tested in ``test_store.py``.
"""
from __future__ import annotations

import uuid
from typing import Callable

import pytest

from layercheck.contract.errors import DirectoryLocked, LayerCheckError
from layercheck.storage.fsspecstore import FsspecStore
from layercheck.storage.localstore import LocalStore
from layercheck.storage.store import Store
from layercheck.storage.location import open_store

BACKENDS: dict[str, Callable] = {
    "local": lambda tmp_path: LocalStore(tmp_path / "store"),
    "fsspec-memory": lambda tmp_path: FsspecStore(f"memory://conformance-{uuid.uuid4().hex}"),
}
"""Every Store backend of ``layercheck.storage.store``: name -> a fresh, empty store."""


@pytest.fixture(params=sorted(BACKENDS))
def store(request, tmp_path) -> Store:
    return BACKENDS[request.param](tmp_path)


def test_it_is_a_store_and_open_store_passes_it_through(store):
    assert isinstance(store, Store) and isinstance(store.url, str) and store.url
    assert open_store(store) is store


def test_write_atomic_takes_bytes_or_buffers_in_order_into_new_folders(store):
    store.write_atomic("a/b/c.bin", b"bytes")
    store.write_atomic("a/d.bin", [b"stre", bytearray(b"am"), memoryview(b"ed")])
    store.write_atomic("e.bin", (piece for piece in (b"gen", b"erated")))
    assert store.read("a/b/c.bin") == b"bytes" and store.read("a/d.bin") == b"streamed"
    assert store.read("e.bin") == b"generated"
    store.write_atomic("e.bin", b"replaced")
    assert store.read("e.bin") == b"replaced" and store.size("e.bin") == 8


def test_a_streamed_write_that_fails_is_never_seen_in_part(store):
    """Readers never see a partial write_atomic: after a failure the path holds its
    old bytes or nothing, and no temporary file is listed as the store's."""
    store.write_atomic("f", b"old")

    def broken():
        yield b"new-"
        raise OSError("the producer failed")

    with pytest.raises(OSError, match="the producer failed"):
        store.write_atomic("f", broken())
    assert not store.exists("f") or store.read("f") == b"old"
    with pytest.raises(OSError, match="the producer failed"):
        store.write_atomic("g", broken())
    assert not store.exists("g")
    assert store.list("") == (["f"] if store.exists("f") else [])


def test_append_creates_then_adds_at_the_end(store):
    store.append("m.jsonl", b"one\n")
    store.append("m.jsonl", b"two\n")
    assert store.read("m.jsonl") == b"one\ntwo\n" and store.size("m.jsonl") == 8


@pytest.mark.parametrize("limit, expected", [(None, b"0123456789"), (0, b"0"), (3, b"0123"),
                                             (9, b"0123456789"), (50, b"0123456789")])
def test_read_with_a_limit_gives_at_most_one_byte_more(store, limit, expected):
    store.write_atomic("f", b"0123456789")
    assert store.read("f", limit) == expected


def test_exists_size_and_a_missing_file(store):
    store.write_atomic("a/f", b"xyz")
    assert store.exists("a/f") and store.size("a/f") == 3
    assert not store.exists("a/g") and not store.exists("b/f")
    for call in (lambda: store.read("a/g"), lambda: store.size("a/g")):
        with pytest.raises(FileNotFoundError):
            call()


def test_list_names_the_files_directly_under_a_prefix_sorted(store):
    for path in ("a/z.bin", "a/b.bin", "a/sub/c.bin", "top.bin"):
        store.write_atomic(path, b"x")
    assert store.list("a") == ["a/b.bin", "a/z.bin"]
    assert store.list("a/sub") == ["a/sub/c.bin"] and store.list("") == ["top.bin"]
    assert store.list("nothing") == [] and store.list("top.bin") == []
    assert store.list("a", temporary=True) == ["a/b.bin", "a/z.bin"]  # no write in flight


def test_list_leaves_out_dot_files_which_no_commit_names(store):
    """A commit names layers/, states/ and the manifest, never a dot file: the
    store's own (.lock, .readers) and anyone else's stay out of every listing."""
    store.write_atomic("a/.hidden", b"x")
    store.write_atomic("a/seen", b"x")
    assert store.list("a") == ["a/seen"] and store.list("a", temporary=True) == ["a/seen"]


def test_delete_is_idempotent_and_delete_unread_deletes_without_a_reader(store):
    store.write_atomic("a", b"1")
    store.write_atomic("b", b"2")
    store.delete("a")
    store.delete("a")  # absent: nothing to do
    assert not store.exists("a")
    assert store.delete_unread(["b", "never-written"]) is True and not store.exists("b")


@pytest.mark.parametrize("path", [".lock", ".readers", "a/.hidden"])
def test_delete_refuses_a_file_list_never_names_so_never_the_lock(store, path):
    """Deleting .lock under a running job let a second writer in: a store deletes only
    files its listing names (a temp file of a write too), never a dot file."""
    store.write_atomic(path, b"x")
    for call in (lambda: store.delete(path), lambda: store.delete_unread([path])):
        with pytest.raises(LayerCheckError, match="refusing to delete"):
            call()
    assert store.exists(path)
    store.write_atomic("a/.f.0123abcd.tmp", b"x")  # what a write cut short left: deletable
    store.delete("a/.f.0123abcd.tmp")
    assert not store.exists("a/.f.0123abcd.tmp")


def test_reading_is_a_context_that_lets_the_store_be_used(store):
    store.write_atomic("f", b"x")
    with store.reading():
        assert store.read("f") == b"x"


def test_one_writer_holds_the_lock_until_unlock(store, tmp_path):
    other = open_store(store.url)  # the same location, opened again in this process
    store.lock()
    try:
        with pytest.raises(DirectoryLocked, match="already open in this process"):
            other.lock()
    finally:
        store.unlock()
    other.lock()
    other.unlock()
    store.unlock()  # not held: nothing to do


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "a//b"])
def test_paths_that_leave_the_store_are_refused_by_every_operation(store, path):
    for call in (lambda: store.read(path), lambda: store.write_atomic(path, b"x"),
                 lambda: store.append(path, b"x"), lambda: store.exists(path),
                 lambda: store.size(path), lambda: store.delete(path),
                 lambda: store.list(path)):
        with pytest.raises(LayerCheckError, match="refusing path"):
            call()
