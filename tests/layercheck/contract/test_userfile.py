"""layercheck.contract.userfile: a user's path is read only if it is a regular file, and no
further than its kind's bound (FIFOs, devices, links to them, directories, sockets, files
that are too large, grow, or decompress too far)."""
from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from layercheck.contract import userfile
from layercheck.contract.userfile import (LIMITS, RefusedFile, read_bytes, read_csv_bytes,
                                          read_json, read_parquet)
from tests.deadline import deadline

ROOT = Path(__file__).resolve().parents[3]


def _capped(address_space: int, code: str, path) -> str:
    """``code`` (with ``sys`` and this module's readers imported) run on ``path`` in a
    Python limited to ``address_space`` bytes; its stdout, once it exited 0."""
    head = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
            "from layercheck.contract.userfile import RefusedFile, read_bytes, read_csv_bytes\n")
    done = subprocess.run([sys.executable, "-c", head + code, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def small_limits(monkeypatch):
    """Every kind bounded at 1 KiB (the real bounds are tens of MiB to GiBs)."""
    small = {k: dataclasses.replace(v, bytes=1024) for k, v in LIMITS.items()}
    monkeypatch.setattr(userfile, "LIMITS", small)
    return small


def test_a_regular_file_is_read_whole(tmp_path):
    (tmp_path / "a.json").write_text('{"x": [1, 2]}')
    assert read_json(tmp_path / "a.json") == {"x": [1, 2]}
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")   # a link to a file is that file
    assert read_bytes(tmp_path / "link.json", "json") == b'{"x": [1, 2]}'


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path):
    os.mkfifo(tmp_path / "manifest.json")
    (tmp_path / "link").symlink_to(tmp_path / "manifest.json")
    for path in (tmp_path / "manifest.json", tmp_path / "link"):
        with deadline(10, "reading a FIFO"), pytest.raises(RefusedFile, match="a FIFO"):
            read_json(path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_or_a_link_to_one_is_refused_before_a_byte_is_read(tmp_path, device):
    (tmp_path / "log.csv").symlink_to(device)
    for path in (device, tmp_path / "log.csv"):
        with deadline(10, f"reading {device}"), pytest.raises(RefusedFile, match="character device"):
            read_csv_bytes(path)


def test_a_directory_and_a_socket_are_refused(tmp_path):
    with pytest.raises(RefusedFile, match="a directory"):
        read_bytes(tmp_path, "json")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.json"))
        with pytest.raises(RefusedFile, match="a socket"):
            read_bytes(tmp_path / "s.json", "json")
    finally:
        sock.close()


def test_a_missing_file_is_the_usual_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "none.json", "json")


def test_a_file_past_its_kinds_bound_is_refused_naming_the_bound(tmp_path, small_limits):
    (tmp_path / "big.json").write_bytes(b" " * 1025)
    with pytest.raises(RefusedFile, match=r"1,025 bytes, more than the 1,024 bytes a trace's or "
                       r"calibration's JSON file may hold"):
        read_json(tmp_path / "big.json")
    (tmp_path / "ok.json").write_bytes(b"[" + b" " * 1022 + b"]")
    assert read_json(tmp_path / "ok.json") == []


def test_the_real_bounds_are_named_in_their_errors(tmp_path):
    assert LIMITS["json"].text() == "64 MiB" and LIMITS["table"].text() == "1 GiB"
    with open(tmp_path / "sparse.csv", "wb") as f:     # a sparse file: no disk used
        f.truncate(LIMITS["record"].bytes + 1)
    with pytest.raises(RefusedFile, match="more than the 256 MiB a failure log or record"):
        read_csv_bytes(tmp_path / "sparse.csv")


@pytest.mark.parametrize("suffix,compress", [(".xz", lzma.compress), (".gz", gzip.compress),
                                             (".bz2", bz2.compress)])
def test_a_compressed_record_is_decompressed_no_further_than_its_bound(tmp_path, monkeypatch,
                                                                       suffix, compress):
    small = {**LIMITS, "record": dataclasses.replace(LIMITS["record"], bytes=20_000)}
    monkeypatch.setattr(userfile, "LIMITS", small)
    ok = b"node,time\n" + b"0,1h\n" * 100
    (tmp_path / f"ok.csv{suffix}").write_bytes(compress(ok))
    assert read_csv_bytes(tmp_path / f"ok.csv{suffix}") == ok
    (tmp_path / f"bomb.csv{suffix}").write_bytes(compress(b"0" * 10_000_000))  # 10 MB of zeros
    with pytest.raises(RefusedFile, match="decompressing past that"):
        read_csv_bytes(tmp_path / f"bomb.csv{suffix}")
    (tmp_path / f"cut.csv{suffix}").write_bytes(compress(ok)[:-8])
    with pytest.raises(RefusedFile, match=f"cut short|not a readable \\{suffix} file"):
        read_csv_bytes(tmp_path / f"cut.csv{suffix}")


@pytest.mark.parametrize("suffix,compress", [(".xz", lzma.compress), (".gz", gzip.compress),
                                             (".bz2", bz2.compress)])
def test_a_file_of_several_compressed_members_is_read_whole(tmp_path, suffix, compress):
    """``cat a.gz b.gz > c.gz`` is a valid file of two members: both are read."""
    (tmp_path / f"two.csv{suffix}").write_bytes(compress(b"time\n1\n") + compress(b"2\n3\n"))
    assert read_csv_bytes(tmp_path / f"two.csv{suffix}") == b"time\n1\n2\n3\n"


def test_archives_pandas_would_open_are_refused_with_the_fix(tmp_path):
    for name in ("r.zip", "r.csv.zst", "r.tar.gz", "r.tgz"):
        (tmp_path / name).write_bytes(b"x")
        with pytest.raises(RefusedFile, match="decompress it and give the CSV"):
            read_csv_bytes(tmp_path / name)


def test_a_table_declaring_more_than_its_bound_uncompressed_is_refused(tmp_path, monkeypatch):
    frame = pd.DataFrame({"step": range(1, 20_001), "x": 0.5})
    frame.to_parquet(tmp_path / "steps.parquet", compression="zstd")
    assert read_parquet(tmp_path / "steps.parquet").equals(frame)
    small = dict(LIMITS)
    small["table data"] = dataclasses.replace(LIMITS["table data"], bytes=100_000)
    monkeypatch.setattr(userfile, "LIMITS", small)
    assert os.path.getsize(tmp_path / "steps.parquet") < 100_000     # small on disk
    with pytest.raises(RefusedFile, match="bytes of columns uncompressed, more than"):
        read_parquet(tmp_path / "steps.parquet")


def test_json_nested_past_the_parsers_depth_is_a_decode_error(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        read_json(tmp_path / "deep.json")


def test_a_file_is_read_without_reserving_its_bound(tmp_path):
    """read(n) allocates n bytes first: asking for the bound (a GiB for a table) failed
    under a 2 GiB address-space limit where the file itself is a megabyte."""
    (tmp_path / "t.parquet").write_bytes(os.urandom(1 << 20))
    _capped(1 << 30, "assert len(read_bytes(sys.argv[1], 'table')) == 1 << 20\n",
            tmp_path / "t.parquet")


def test_a_file_that_grows_past_its_bound_while_read_is_refused(tmp_path, monkeypatch):
    """What fstat said is read first; what the file adds after that is read a chunk at a
    time and refused once past the bound (a writer appending to a /dev/zero-sized log)."""
    small = {**LIMITS, "json": dataclasses.replace(LIMITS["json"], bytes=1024)}
    monkeypatch.setattr(userfile, "LIMITS", small)
    monkeypatch.setattr(userfile, "_CHUNK", 100)
    path = tmp_path / "grows.json"
    path.write_bytes(b" " * 10)
    real_fstat = os.fstat

    def fstat_then_grow(fd):
        info = real_fstat(fd)
        path.write_bytes(b" " * 5000)                  # the writer appends after the fstat
        return info
    monkeypatch.setattr(userfile.os, "fstat", fstat_then_grow)
    with pytest.raises(RefusedFile, match="growing, more than the 1,024 bytes"):
        read_bytes(path, "json")


def test_a_decompression_bomb_is_never_held_whole(tmp_path):
    """A gzip of 1 GiB of zeros (two members of 512 MiB, 4.5 MB on disk) under 768 MiB of
    address space: decompressed no further than the record bound (256 MiB), then refused;
    a member decompressed whole is a MemoryError."""
    member = gzip.compress(bytes(512 << 20), compresslevel=1)
    (tmp_path / "bomb.csv.gz").write_bytes(member * 2)
    out = _capped(768 << 20, "try:\n    read_csv_bytes(sys.argv[1])\n"
                  "except RefusedFile as exc:\n    print(exc)\n", tmp_path / "bomb.csv.gz")
    assert "decompressing past that, more than the 256 MiB" in out, out
