"""What each Store backend adds to the protocol's contract (which
test_store_conformance.py runs on every backend): a real directory's fsync, links,
locks and readers (LocalStore), fsspec's URLs and append fallback (FsspecStore);
failures by fault injection into os.write."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from layercheck.contract.errors import DirectoryLocked, LayerCheckError, NotARegularFile
from layercheck.storage.fsspecstore import FsspecStore
from layercheck.storage.localstore import LocalStore
from layercheck.storage.store import Store, check_relative, is_temporary
from layercheck.storage.location import open_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", ["a", "layers/a@3.safetensors", "x/y/z-1_2.json", ".lock"])
def test_plain_relative_paths_are_accepted(path):
    assert check_relative(path) == path


@pytest.mark.parametrize("path", ["/etc/passwd", "..", "a/../b", "a//b", "", "a b", "./a",
                                  "a/.", "a/", "a\\b", "ä"])
def test_paths_that_could_leave_the_directory_are_refused_with_the_rule(path):
    with pytest.raises(LayerCheckError) as err:
        check_relative(path)
    assert str(err.value) == (f"refusing path {path!r}: checkpoint paths must be relative, "
                              "inside the checkpoint directory, without '..'")


def test_temporary_names_are_exactly_those_of_write_atomic():
    assert is_temporary(".a@3.safetensors.0123abcd.tmp")
    assert is_temporary("layers/.a.0123abcd.tmp")
    for name in ("a.0123abcd.tmp", ".a.0123abcd.tmp.x", ".a.0123ABCD.tmp", ".a.0123abc.tmp",
                 ".a.tmp", "layers/.a.0123abcd.tmp/b", ".a b.0123abcd.tmp"):
        assert not is_temporary(name), name


def test_write_atomic_writes_bytes_or_streamed_buffers_into_new_folders(tmp_path):
    store = LocalStore(tmp_path / "ckpt")  # created
    store.write_atomic("a/b/c.bin", b"hello")
    assert (tmp_path / "ckpt/a/b/c.bin").read_bytes() == b"hello"
    store.write_atomic("a/b/c.bin", [b"new ", bytearray(b"con"), memoryview(b"tent")])
    assert store.read("a/b/c.bin") == b"new content"
    assert os.listdir(tmp_path / "ckpt/a/b") == ["c.bin"]  # no temp file left behind
    assert oct((tmp_path / "ckpt/a/b/c.bin").stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_write_atomic_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("f", b"old")

    def buffers():
        yield b"partial"
        raise RuntimeError("the snapshot went away")

    with pytest.raises(RuntimeError, match="went away"):
        store.write_atomic("f", buffers())
    assert store.read("f") == b"old" and os.listdir(tmp_path) == ["f"]
    assert store.list("", temporary=True) == ["f"]


def test_append_creates_and_appends_and_a_failed_append_keeps_the_file_as_it_was(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    store.append("log/m.jsonl", b"one\n")
    store.append("log/m.jsonl", b"two\n")
    assert store.read("log/m.jsonl") == b"one\ntwo\n" and store.size("log/m.jsonl") == 8
    real_write = os.write

    def full_disk(fd, data):  # the disk fills after 2 bytes of the record
        if len(data) > 2:
            return real_write(fd, bytes(data)[:2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.append("log/m.jsonl", b"three\n")
    monkeypatch.setattr(os, "write", real_write)
    assert store.read("log/m.jsonl") == b"one\ntwo\n"  # no half record


def test_short_writes_are_continued_until_everything_is_written(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:3]))
    store.append("m", b"0123456789")
    store.write_atomic("w", [b"abcdefg", b"hi"])
    monkeypatch.setattr(os, "write", real_write)
    assert store.read("m") == b"0123456789" and store.read("w") == b"abcdefghi"


def test_read_with_a_limit_reads_at_most_one_byte_more(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("f", b"0123456789")
    assert store.read("f", limit=3) == b"0123"
    assert store.read("f", limit=9) == b"0123456789"
    assert store.read("f", limit=100) == b"0123456789"
    assert store.read("f", limit=0) == b"0"
    assert store.read("f") == b"0123456789"


def test_links_fifos_and_linked_folders_are_never_followed(tmp_path):
    store = LocalStore(tmp_path / "c")
    (tmp_path / "outside").write_bytes(b"secret")
    os.symlink(tmp_path / "outside", tmp_path / "c/link")
    assert store.exists("link") and store.size("link") == len(str(tmp_path / "outside"))
    with pytest.raises(NotARegularFile, match="is a symbolic link"):
        store.read("link")
    with pytest.raises(NotARegularFile, match="is a symbolic link"):
        store.append("link", b"x")
    assert (tmp_path / "outside").read_bytes() == b"secret"
    os.mkfifo(tmp_path / "c/fifo")
    with pytest.raises(NotARegularFile, match="is a FIFO;"):
        store.read("fifo")  # without blocking on the FIFO
    with pytest.raises(NotARegularFile, match="is a FIFO or device"):
        store.append("fifo", b"x")  # no reader at its other end: not blocking either
    (tmp_path / "c/sub").mkdir()
    with pytest.raises(NotARegularFile, match="is not a regular file"):
        store.read("sub")  # a folder
    os.symlink(tmp_path, tmp_path / "c/folder")
    for call in (lambda: store.read("folder/outside"), lambda: store.write_atomic("folder/x", b"")):
        with pytest.raises(LayerCheckError, match="is a symbolic link; layercheck reads and writes only real"):
            call()
    assert store.list("", temporary=True) == []  # links and FIFOs are not the store's files


def test_list_names_only_files_a_commit_can_name(tmp_path):
    store = LocalStore(tmp_path)
    for name in ("b.bin", "a.bin", "sub/c.bin", ".lock", "odd name", ".x.0123abcd.tmp", "sub/.y.0123abcd.tmp"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "folder").mkdir()
    assert store.list("") == ["a.bin", "b.bin"]
    assert store.list("", temporary=True) == [".x.0123abcd.tmp", "a.bin", "b.bin"]
    assert store.list("sub") == ["sub/c.bin"]
    assert store.list("sub", temporary=True) == ["sub/.y.0123abcd.tmp", "sub/c.bin"]
    assert store.list("missing") == [] and store.list("a.bin") == []


def test_delete_is_idempotent(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("f", b"x")
    store.delete("f")
    store.delete("f")
    assert not store.exists("f") and not (tmp_path / "f").exists()


_READER = """
import sys, time
from layercheck.storage.localstore import LocalStore
with LocalStore(sys.argv[1]).reading():
    print("reading", flush=True)
    sys.stdin.readline()
"""


def test_delete_unread_waits_for_no_reader_in_another_process(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("a", b"1")
    store.write_atomic("b", b"2")
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(tmp_path)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline() == "reading\n"
        assert store.delete_unread(["a"]) is False and store.exists("a")
    finally:
        reader.communicate("done\n", timeout=60)
    assert store.delete_unread(["a", "b"]) is True
    assert not store.exists("a") and not store.exists("b")
    with store.reading():  # this process's own reading does not block it (a record lock)
        pass


def test_one_lock_per_directory_and_process_holding_the_pid(tmp_path):
    store, other = LocalStore(tmp_path), LocalStore(tmp_path)
    store.lock()
    try:
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(DirectoryLocked, match="already open in this process"):
            other.lock()
    finally:
        store.unlock()
    store.unlock()  # twice is harmless
    other.lock()  # free again
    other.unlock()


def test_a_lock_held_by_another_process_names_it(tmp_path):
    code = ("import sys; from layercheck.storage.localstore import LocalStore\n"
            "LocalStore(sys.argv[1]).lock(); print('locked', flush=True); sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        store = LocalStore(tmp_path)
        with pytest.raises(DirectoryLocked, match=f"pid {holder.pid} holds"):
            store.lock()
    finally:
        holder.communicate("done\n", timeout=60)
    store.lock()  # the holder is gone: its lock with it
    store.unlock()


def test_a_linked_lock_file_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", tmp_path / ".lock")
    with pytest.raises(LayerCheckError, match=r"\.lock is a symbolic link or special file"):
        LocalStore(tmp_path).lock()


def test_a_directory_replaced_after_opening_is_written_no_more(tmp_path):
    store = LocalStore(tmp_path / "c")
    store.write_atomic("f", b"1")
    os.rename(tmp_path / "c", tmp_path / "moved")
    (tmp_path / "c").mkdir()  # another run's directory of the same name
    for call in (lambda: store.write_atomic("f", b"2"), lambda: store.append("m", b"2"),
                 lambda: store.delete("f"), store.lock):
        with pytest.raises(LayerCheckError, match="was deleted or replaced after this process opened it"):
            call()
    os.rmdir(tmp_path / "c")
    with pytest.raises(LayerCheckError, match="was deleted or replaced"):
        store.write_atomic("f", b"3")
    assert os.listdir(tmp_path / "moved") == ["f"]


def test_an_fsspec_store_is_named_by_its_url_and_refuses_a_missing_directory_read_only():
    """The rest of the contract, on every backend: test_store_conformance.py."""
    url = f"memory://store-{uuid.uuid4().hex}"
    store = FsspecStore(url)
    assert isinstance(store, Store) and store.url == url
    with pytest.raises(LayerCheckError, match="no such checkpoint directory"):
        FsspecStore(f"memory://absent-{uuid.uuid4().hex}", create=False)


def test_open_store_takes_paths_urls_and_stores(tmp_path):
    local = open_store(tmp_path / "d")
    assert isinstance(local, LocalStore) and local.root == (tmp_path / "d").resolve()
    assert open_store(local) is local
    assert isinstance(open_store(f"file://{tmp_path}/e"), LocalStore) and (tmp_path / "e").is_dir()
    assert isinstance(open_store(f"memory://o-{uuid.uuid4().hex}"), FsspecStore)
    with pytest.raises(LayerCheckError, match="no such checkpoint directory"):
        open_store(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()
    with pytest.raises(LayerCheckError, match="cannot open it as an fsspec URL"):
        open_store("nosuchprotocol://x")
    assert isinstance(open_store(str(tmp_path / "d"), create=False), LocalStore)


def test_read_buffer_reads_what_read_reads_into_one_writable_buffer(tmp_path):
    from layercheck.storage.store import read_buffer
    data = bytes(range(256)) * (3 * 4096 + 7)  # over 3 MiB: several pieces of 1 MiB
    local, memory = LocalStore(tmp_path), FsspecStore(f"memory://rb-{uuid.uuid4().hex}")
    for store in (local, memory):
        store.write_atomic("f", data)
        for limit in (None, 0, 5, len(data) - 1, len(data) + 10):
            pieces = []
            got = read_buffer(store, "f", limit, lambda piece: pieces.append(bytes(piece)))
            expected = store.read("f", limit)
            assert bytes(got) == expected
            assert b"".join(pieces) == expected  # every byte once, in order
            memoryview(got)[:1] = b"\xff"[:len(got)]  # writable: tensors may be views of it
        assert bytes(read_buffer(store, "f")) == data  # consume is optional
    buffer = local.read_buffer("f")
    assert isinstance(buffer, np.ndarray) and buffer.dtype == np.uint8 and buffer.size == len(data)
    with pytest.raises(NotARegularFile):
        os.symlink(tmp_path / "f", tmp_path / "link")
        local.read_buffer("link")

def _file_ends_at(monkeypatch, end: int) -> None:
    """Reads (``os.readv``, ``os.read``) of at most 1000 bytes each that find nothing
    from byte ``end`` on: a file that shrank to ``end`` bytes after it was opened."""
    real_readv, real_read = os.readv, os.read
    monkeypatch.setattr(os, "readv", lambda fd, bufs: 0 if os.lseek(fd, 0, os.SEEK_CUR) >= end
                        else real_readv(fd, [bufs[0][:1000]]))
    monkeypatch.setattr(os, "read", lambda fd, n: b"" if os.lseek(fd, 0, os.SEEK_CUR) >= end
                        else real_read(fd, min(n, 1000)))


def test_a_file_that_shrinks_while_it_is_read_gives_what_is_there(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    store.write_atomic("f", b"0123456789" * 1000)
    _file_ends_at(monkeypatch, 4000)
    assert bytes(store.read_buffer("f")) == b"0123456789" * 400
    assert store.read("f") == b"0123456789" * 400


def test_an_fsspec_append_rewrites_the_object_where_the_filesystem_cannot_append(monkeypatch):
    store = FsspecStore(f"memory://ap-{uuid.uuid4().hex}")
    real_open = store.fs.open

    def no_append(path, mode="rb", **kw):
        if mode == "ab":
            raise NotImplementedError("append")
        return real_open(path, mode, **kw)

    monkeypatch.setattr(store.fs, "open", no_append)
    store.append("m", b"one\n")  # absent: created
    store.append("m", b"two\n")
    assert store.read("m") == b"one\ntwo\n"


def test_an_fsspec_store_lists_only_files_and_an_fsspec_url_that_fails_says_why(tmp_path):
    store = FsspecStore(f"memory://ls-{uuid.uuid4().hex}")
    store.write_atomic("a/b/c.bin", b"x")
    store.write_atomic("a/d.bin", b"y")
    assert store.list("a") == ["a/d.bin"] and store.list("a/b") == ["a/b/c.bin"]
    assert store.list("a/d.bin") == []
    with pytest.raises(LayerCheckError) as err:
        open_store("nosuchprotocol://x")
    assert str(err.value).startswith("nosuchprotocol://x: cannot open it as an fsspec URL (")
    assert str(err.value).endswith("); check the protocol and that its fsspec driver is installed")


def test_an_inflight_write_is_listed_as_temporary_and_a_new_subfolder_of_an_old_one_is_made(tmp_path):
    store = LocalStore(tmp_path)
    store.write_atomic("a/x", b"1")
    seen = []

    def buffers():
        yield b"part"
        seen.extend(store.list("a/b", temporary=True))
        yield b"rest"

    store.write_atomic("a/b/c.bin", buffers())  # a/ exists, a/b/ does not
    assert len(seen) == 1 and is_temporary(seen[0]) and seen[0].startswith("a/b/.c.bin.")
    assert store.read("a/b/c.bin") == b"partrest" and store.list("a/b", temporary=True) == ["a/b/c.bin"]
    assert is_temporary("a/b/" + seen[0].rsplit("/", 1)[-1])  # nested paths too
    (tmp_path / "Xray.bin").write_bytes(b"")
    assert store.list("") == ["Xray.bin"]


def test_a_write_atomic_that_cannot_create_its_temp_raises_that_error(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    real_open = os.open

    def full(path, flags, *args):
        if str(path).endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", full)
    with pytest.raises(OSError) as err:
        store.write_atomic("f", b"x")
    assert err.value.errno == errno.ENOSPC


def test_lock_errors_say_the_fix(tmp_path, monkeypatch):
    store, other = LocalStore(tmp_path), LocalStore(tmp_path)
    store.lock()
    try:
        with pytest.raises(DirectoryLocked) as err:
            other.lock()
        assert str(err.value) == (
            f"{tmp_path} is already open in this process (a LayerCheck, gc or "
            "resume_checkpoint() that has not been closed): close() that one first, "
            "or use `with LayerCheck(...) as lc:`, which closes it")
    finally:
        store.unlock()
    os.unlink(tmp_path / ".lock")  # (the lock file stays after unlock)
    os.symlink(tmp_path / "x", tmp_path / ".lock")
    with pytest.raises(LayerCheckError) as err:
        other.lock()
    assert str(err.value) == (f"{tmp_path}/.lock is a symbolic link or special file; "
                              "layercheck never follows it: delete it and try again")
    os.unlink(tmp_path / ".lock")
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(LayerCheckError) as err:
        other.lock()
    assert str(err.value) == (
        f"{tmp_path} is read-only here (Permission denied): training, restore and gc "
        "write to the checkpoint directory (its lock, the manifest); use a writable "
        "copy, or python -m layercheck inspect, plan or export, which only read it")


def test_the_same_fsspec_url_opens_twice():
    url = f"memory://twice-{uuid.uuid4().hex}"
    FsspecStore(url).write_atomic("f", b"x")
    assert FsspecStore(url).read("f") == b"x" and FsspecStore(url, create=False).read("f") == b"x"


def test_a_new_nested_directory_its_url_and_opening_a_missing_one_read_only(tmp_path):
    store = LocalStore(tmp_path / "a/b/c")
    assert (tmp_path / "a/b/c").is_dir() and store.url == str((tmp_path / "a/b/c").resolve())
    missing = LocalStore(tmp_path / "none", create=False)
    assert not (tmp_path / "none").exists() and not missing.exists("x")


def test_the_refusals_name_the_path_and_say_why(tmp_path):
    import stat
    store = LocalStore(tmp_path / "c")
    root = tmp_path / "c"
    os.symlink(tmp_path, root / "link")
    with pytest.raises(NotARegularFile) as err:
        store.read("link")
    assert str(err.value) == f"{root}/link is a symbolic link; layercheck never follows one where the checkpoint has a regular file"
    os.mkfifo(root / "fifo")
    with pytest.raises(NotARegularFile) as err:
        store.append("fifo", b"x")
    assert str(err.value) == f"{root}/fifo is a FIFO or device; layercheck reads and writes only regular files there"
    with pytest.raises(NotARegularFile) as err:
        store.read("fifo")
    assert str(err.value) == f"{root}/fifo is a FIFO; layercheck reads and writes only regular files there"
    os.mknod(root / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
    with pytest.raises(NotARegularFile) as err:
        store.read("null")
    assert str(err.value) == f"{root}/null is a device; layercheck reads and writes only regular files there"
    (root / "a/b").mkdir(parents=True)
    os.symlink(tmp_path, root / "a/b/deep")
    with pytest.raises(LayerCheckError) as err:
        store.write_atomic("a/b/deep/x", b"")
    assert str(err.value) == (f"refusing 'a/b/deep/x': {root}/a/b/deep is a symbolic link; layercheck "
                              "reads and writes only real folders inside the checkpoint directory")
    store.append("new.jsonl", b"x")
    assert oct((root / "new.jsonl").stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    os.rename(root, tmp_path / "moved")
    with pytest.raises(LayerCheckError) as err:
        store.write_atomic("f", b"")
    assert str(err.value) == (f"{root} was deleted or replaced after this process opened it; nothing "
                              "more is written there (another run may own it now): restore from a copy, or "
                              "start over in a new directory")


def test_an_unlocked_directory_is_free_for_another_process_and_the_holder_is_named(tmp_path):
    store = LocalStore(tmp_path)
    store.lock()
    store.unlock()
    code = ("import sys; from layercheck.storage.localstore import LocalStore\n"
            "s = LocalStore(sys.argv[1]); s.lock(); print('locked', flush=True); sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"  # this process let go of it
        with pytest.raises(DirectoryLocked) as err:
            store.lock()
        assert str(err.value) == (f"{tmp_path} is in use by another process (pid {holder.pid} holds "
                                  f"{tmp_path}/.lock); stop that process or point this one at another "
                                  "directory")
    finally:
        holder.communicate("done\n", timeout=60)


def test_open_store_passes_create_on_and_refuses_what_is_not_a_location(tmp_path):
    with pytest.raises(LayerCheckError, match="no such checkpoint directory"):
        open_store(f"memory://absent-{uuid.uuid4().hex}", create=False)
    with pytest.raises(TypeError):
        open_store(42)
    store = FsspecStore(f"memory://x-{uuid.uuid4().hex}")
    store.write_atomic("Xa", b"1")
    store.write_atomic("d/boX", b"2")
    assert store.list("") == ["Xa"] and store.list("d") == ["d/boX"]


def test_a_linked_folder_at_any_depth_is_refused(tmp_path):
    store = LocalStore(tmp_path / "c")
    (tmp_path / "c/a").mkdir()
    os.symlink(tmp_path, tmp_path / "c/a/b")
    with pytest.raises(LayerCheckError, match=r"c/a/b is a symbolic link"):
        store.write_atomic("a/b/c/x", b"")


_RAW_HOLDER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, bytes.fromhex(sys.argv[2]), 0)
print("locked", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("content,named", [(b"", "unknown"), (b"\xff12\n", "\ufffd12")])
def test_a_holder_that_wrote_no_pid_or_garbage_is_still_named(tmp_path, content, named):
    holder = subprocess.Popen([sys.executable, "-c", _RAW_HOLDER, str(tmp_path), content.hex()],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(DirectoryLocked, match=f"pid {named} holds"):
            LocalStore(tmp_path).lock()
    finally:
        holder.communicate("done\n", timeout=60)


def test_an_fsspec_url_with_a_trailing_slash_is_the_same_store():
    name = f"slash-{uuid.uuid4().hex}"
    FsspecStore(f"memory://{name}/").write_atomic("f", b"x")
    assert FsspecStore(f"memory://{name}").read("f") == b"x"
    assert FsspecStore(f"memory://{name}/").list("") == ["f"]


def test_a_forked_child_holds_none_of_its_parents_locks(tmp_path):
    """A DataLoader worker forked from a trainer: the directory is locked by the parent,
    not by it (it can neither keep nor release the parent's lock)."""
    store = LocalStore(tmp_path)
    store.lock()
    try:
        pid = os.fork()
        if pid == 0:  # the child: report by exit status only
            code = 1
            try:
                LocalStore(tmp_path).lock()
            except DirectoryLocked as exc:  # held by another process: the parent
                code = 0 if "in use by another process" in str(exc) else 2
            except BaseException:
                code = 3
            try:
                store.unlock()  # nothing of this process's to release
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with pytest.raises(DirectoryLocked, match="already open in this process"):
            LocalStore(tmp_path).lock()  # the parent still holds it
    finally:
        store.unlock()


# -- scattered reads: a restore reads a fresh optimizer's moments apart (issue 14) ---------------
def test_read_into_scatters_what_read_reads_and_consumes_every_byte_once(tmp_path):
    """Each target is filled (and its bytes consumed) before the next is asked for;
    bytes beyond the last target are consumed, not kept; a short file stops the
    targets. The same from a store without ``read_into`` (a copy of ``read``)."""
    from layercheck.storage.store import read_into
    data = bytes(range(251)) * (2 * 4096 + 3)  # about 2 MiB: several pieces per target
    local, memory = LocalStore(tmp_path), FsspecStore(f"memory://ri-{uuid.uuid4().hex}")
    for store in (local, memory):
        store.write_atomic("f", data)
        for limit, sizes in ((None, [8, 3, 1 << 20, 5]), (len(data) - 1, [100, len(data)]),
                             (len(data) + 10, [len(data) // 2, len(data) // 2 + 1]), (0, [0, 1, 7]),
                             (100, [8])):  # a limit that cuts the file, past the targets
            expected = store.read("f", limit)
            filled, asked, pieces = [], [], []

            def targets(size, sizes=sizes, filled=filled, asked=asked):
                assert size == len(expected)
                for n in sizes:
                    if filled:  # the one before is full, and holds the file's next bytes
                        asked.append(bytes(filled[-1]))
                    filled.append(np.full(n, 0xAA, dtype=np.uint8))
                    yield memoryview(filled[-1])

            got = read_into(store, "f", limit, lambda piece: pieces.append(bytes(piece)), targets)
            assert got == len(expected)
            assert b"".join(pieces) == expected  # every byte once, in order
            kept = b"".join(bytes(t) for t in filled)
            covered = min(len(kept), len(expected))
            assert kept[:covered] == expected[:covered]
            assert b"".join(asked) == expected[:sum(len(a) for a in asked)]
            if len(kept) > len(expected):  # the file ended inside a target: no target after it
                short = [i for i, t in enumerate(filled) if sum(map(len, filled[:i + 1])) > len(expected)]
                assert len(filled) == short[0] + 1
    with pytest.raises(NotARegularFile):
        os.symlink(tmp_path / "f", tmp_path / "link")
        local.read_into("link", None, lambda piece: None, lambda size: iter(()))


def test_read_into_past_its_targets_stops_where_a_shrinking_file_ends(tmp_path, monkeypatch):
    """The file shrinks after it was opened, past the last target: the bytes read are
    what is there, counted and consumed, as ``read`` gives them."""
    store = LocalStore(tmp_path)
    store.write_atomic("f", b"0123456789" * 1000)
    _file_ends_at(monkeypatch, 4000)
    head, pieces = np.empty(1000, dtype=np.uint8), []
    got = store.read_into("f", None, lambda piece: pieces.append(bytes(piece)),
                          lambda size: iter([memoryview(head)]))
    assert got == 4000 and bytes(head) == b"0123456789" * 100
    assert b"".join(pieces) == store.read("f") == b"0123456789" * 400


def test_a_local_store_reads_into_its_buffers_without_a_copy_of_the_file(tmp_path):
    """``read_buffer`` and ``read_into`` of a LocalStore read straight into the buffers
    they fill: the memory they take at their peak is the file's size (and a few
    objects), not twice it as through ``read`` (what a store without them costs)."""
    import tracemalloc
    from layercheck.storage.store import read_buffer, read_into
    store = LocalStore(tmp_path)
    data = os.urandom(8 << 20)
    store.write_atomic("f", data)
    kept = []

    def targets(size):
        for n in (8, 1000, size):
            kept.append(np.empty(n, dtype=np.uint8))
            yield memoryview(kept[-1])

    for read in (lambda: read_buffer(store, "f", len(data), lambda piece: None),
                 lambda: read_into(store, "f", len(data), lambda piece: None, targets)):
        kept.clear()
        tracing = tracemalloc.is_tracing()  # PYTHONTRACEMALLOC may have started it
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            read()
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            if not tracing:
                tracemalloc.stop()
        assert len(data) <= peak < 1.25 * len(data)


# -- every URL of a local directory is that directory, locked (issue 27, items 2 and 3) ----
def _local_forms(directory: Path) -> list[str]:
    """Every way to name ``directory`` (absolute): a plain path, RFC 8089's file URLs
    (with and without the empty or 'localhost' authority, percent-escaped as
    ``Path.as_uri`` writes them), fsspec's ``local://`` and fsspec caches chained over
    either."""
    path = str(directory)
    return [path, f"file://{path}", f"file://localhost{path}", f"FILE://LOCALHOST{path}",
            f"file:{path}", directory.as_uri(), f"local://{path}", f"local://localhost{path}",
            f"simplecache::file://{path}", f"filecache::local://{path}",
            f"blockcache::file://localhost{path}", f"simplecache::{path}"]


def test_every_url_of_a_local_directory_opens_that_directory_as_a_local_store(tmp_path,
                                                                             monkeypatch):
    target = tmp_path / "run 1%"  # a space and a percent sign: as_uri escapes both
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a form resolved against the working directory lands here
    for form in _local_forms(target):
        store = open_store(form)
        assert isinstance(store, LocalStore) and store.root == target.resolve(), form
        assert isinstance(open_store(form, create=False), LocalStore), form
    assert list(elsewhere.iterdir()) == []


def test_every_url_of_a_local_directory_takes_the_one_lock(tmp_path):
    held = open_store(tmp_path)
    held.lock()
    try:
        for form in _local_forms(tmp_path)[1:]:
            with pytest.raises(DirectoryLocked, match="already open in this process"):
                open_store(form).lock()
    finally:
        held.unlock()


@pytest.mark.parametrize("url, says", [
    ("file://otherhost/data/run", "host 'otherhost'"),
    ("file://relative/run", "host 'relative'"),  # RFC 8089: the first part is a host
    ("local://run", "host 'run'"),
    ("file:run", "not an absolute path"),
    ("file://", "names no directory"),
    ("file:///data/run?version=2", "no query or fragment"),
    ("dir::file:///data/run", "through 'dir'"),
])
def test_a_url_of_the_local_file_system_naming_no_local_directory_is_refused(tmp_path,
                                                                            monkeypatch, url,
                                                                            says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LayerCheckError, match=says) as info:
        open_store(url)
    assert "\n" not in str(info.value) and "file:///" in str(info.value)  # the fix
    assert list(tmp_path.iterdir()) == []


def test_a_plain_path_with_a_colon_or_double_colon_stays_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("ckpt:v2", "a::b"):
        store = open_store(name)
        assert isinstance(store, LocalStore) and store.root == (tmp_path / name).resolve()


def test_a_second_writer_of_one_fsspec_url_in_this_process_is_refused():
    """memory:// lives in this process, so this is every second writer it can have; for
    an object store it is the second writer of this process (the docstring says so)."""
    name = f"w-{uuid.uuid4().hex}"
    first = FsspecStore(f"memory://{name}")
    first.lock()
    try:
        for url in (f"memory://{name}", f"memory://{name}/", f"memory:///{name}"):
            with pytest.raises(DirectoryLocked, match="already open in this process"):
                FsspecStore(url).lock()
        FsspecStore(f"memory://{name}-other").lock()  # another prefix is free
    finally:
        first.unlock()
    again = FsspecStore(f"memory://{name}")
    again.lock()  # released by unlock()
    again.unlock()
    again.unlock()  # twice is harmless
