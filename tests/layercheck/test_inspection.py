"""inspect: what a checkpoint directory holds, and how its cost grows with the manifest."""
from __future__ import annotations

from layercheck.storage.format import MANIFEST, encode_record, header_record
from layercheck.tools.inspection import inspect_directory
from layercheck.storage.localstore import LocalStore


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


def test_inspect_names_every_damaged_line_once_in_order(tmp_path):
    """Every damaged line is a problem of its own, in the manifest's order, at any count
    (issue 27 item 10 was inspect's cost in them, quadratic: that is measured by
    benchmarks/bench_inspect.py, never by a timed test)."""
    for lines in (5, 40_000):
        info = inspect_directory(_damaged(tmp_path / str(lines), lines), verify=False)
        problems = info["problems"]
        assert len(problems) == len(set(problems)) == lines
        assert [int(p.split("line ", 1)[1].split(":", 1)[0]) for p in problems] == \
            list(range(2, lines + 2))
