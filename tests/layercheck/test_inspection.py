"""inspect: what a checkpoint directory holds, and how its cost grows with the manifest."""
from __future__ import annotations

import time

from layercheck.format import MANIFEST, encode_record, header_record
from layercheck.inspection import inspect_directory
from layercheck.store import LocalStore


def _damaged(path, lines: int) -> LocalStore:
    """A header, then ``lines`` damaged lines of three kinds (a bad CRC, not JSON, a
    record outside its schema)."""
    path.mkdir(exist_ok=True)
    header = header_record(layers=[{"name": "a", "kind": "block", "params": 1}], config={},
                           lr_peak=1e-3)
    kinds = [b'{"crc":"00000000","r":{"kind":"state","step":%d}}\n', b"garbage %d\n",
             encode_record({"kind": "resume", "step": "x"}).replace(b"x", b"x%d")]
    body = b"".join(kinds[i % 3].replace(b"%d", str(i).encode()) for i in range(lines))
    (path / MANIFEST).write_bytes(encode_record(header) + body)
    return LocalStore(path)


def _seconds(store: LocalStore, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        info = inspect_directory(store, verify=False)
        best = min(best, time.perf_counter() - start)
    return best, info


def test_inspect_is_linear_in_damaged_manifest_lines(tmp_path):
    """8 times the damaged lines cost about 8 times as much (it compared each problem
    with every other one: 10,000 lines took 0.95 s, 40,000 took 10 s; issue 27 item 10)."""
    small, info = _seconds(_damaged(tmp_path / "small", 5_000), repeats=5)  # best of 5: noise
    assert len(info["problems"]) == 5_000
    large, info = _seconds(_damaged(tmp_path / "large", 40_000))
    assert len(info["problems"]) == 40_000
    assert large / small < 20, f"5,000 lines {small:.3f} s, 40,000 lines {large:.3f} s"
