"""inspect on a manifest of damaged lines against a plain JSON parse of the same lines.

    python benchmarks/bench_inspect.py [--lines 10000,40000,160000] [--repeats 5]

Per size, a checkpoint directory whose manifest is a header and then that many
damaged lines, three kinds in turn: a record whose CRC does not match, a line
that is not JSON, and a record outside its kind's schema (a ``resume`` whose
step is a string). Variant: ``python -m layercheck inspect`` on it, in-process
(``layercheck.tools.cli.main``, its table written to /dev/null): every line replayed
and reported as damage, the manifest read again to confirm that the damage is
still there (issue 27, item 10: this was quadratic in the damaged lines,
10,000 taking 0.95 s and 40,000 taking 10 s). Reference, in the same run: a
plain read of the same manifest and ``json.loads`` of each line (errors
caught), the least any reader of the lines does. Each repeat times both, in an
order that alternates, at every size; it prints, per size, min and median
seconds of each, min and median of the per-repeat ratio inspect / reference,
and microseconds per line; then the load average (the machine is shared). A
linear inspect keeps the ratio, and the microseconds per line, flat across
the sizes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's layercheck, whatever is installed

from layercheck.tools.cli import main as layercheck_main  # noqa: E402
from layercheck.storage.format import MANIFEST, encode_record, header_record  # noqa: E402

DAMAGE = (b'{"crc":"00000000","r":{"kind":"state","step":%d}}\n',  # the CRC does not match
          b"garbage %d\n",  # not JSON
          encode_record({"kind": "resume", "step": "s%d"}))  # outside the schema


def damaged_checkpoint(folder: Path, lines: int) -> Path:
    """``folder`` holding a manifest of a header and ``lines`` damaged lines."""
    folder.mkdir(parents=True)
    header = header_record(layers=[{"name": "a", "kind": "block", "params": 1}], config={},
                           lr_peak=1e-3)
    body = b"".join(DAMAGE[i % 3].replace(b"%d", str(i).encode()) for i in range(lines))
    (folder / MANIFEST).write_bytes(encode_record(header) + body)
    return folder


def inspect(folder: Path) -> float:
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        start = time.perf_counter()
        code = layercheck_main(["inspect", str(folder)])
        seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"inspect {folder} exited {code}")
    return seconds


def reference(folder: Path) -> float:
    start = time.perf_counter()
    for line in (folder / MANIFEST).read_bytes().splitlines():
        try:
            json.loads(line)
        except ValueError:
            pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", default="10000,40000,160000",
                        help="comma-separated numbers of damaged lines")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(n) for n in args.lines.split(",")]
    scratch = tempfile.TemporaryDirectory(prefix="bench-inspect-")
    folders = {n: damaged_checkpoint(Path(scratch.name) / str(n), n) for n in sizes}
    load = os.getloadavg()[0]
    times: dict[int, dict[str, list[float]]] = {n: {"inspect": [], "reference": []}
                                                for n in sizes}
    for repeat in range(args.repeats):
        for n in sizes:
            order = ("inspect", "reference") if repeat % 2 == 0 else ("reference", "inspect")
            for variant in order:
                times[n][variant].append((inspect if variant == "inspect" else reference)(
                    folders[n]))
    print(f"{args.repeats} interleaved repeats, load average {load:.2f} at the start\n")
    print("| damaged lines | manifest MB | inspect min s | inspect median s | reference min s "
          "| reference median s | ratio min | ratio median | inspect us/line (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        ins, ref = times[n]["inspect"], times[n]["reference"]
        ratios = [a / b for a, b in zip(ins, ref)]
        size = (folders[n] / MANIFEST).stat().st_size / 1e6
        print(f"| {n:,} | {size:.1f} | {min(ins):.3f} | {statistics.median(ins):.3f} | "
              f"{min(ref):.3f} | {statistics.median(ref):.3f} | {min(ratios):.1f}x | "
              f"{statistics.median(ratios):.1f}x | {statistics.median(ins) / n * 1e6:.1f} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    scratch.cleanup()


if __name__ == "__main__":
    main()
