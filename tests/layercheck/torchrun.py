"""Real multi-rank jobs for the tests: a worker script under torchrun, judged by its files.

    job = Torchrun(WORKER, env={"DS_ACCELERATOR": "cpu"})
    text = job.run("--dir", d, "--out", o, "--steps", "12")       # AssertionError unless exit 0
    ranks = job.results(o)                                         # o/rank<r>.json of each rank
    step = job.kill_mid_run(d, o, "--steps", "24", at=9)          # the newest committed step

A worker writes ``<out>/rank<r>.json`` when it finishes; with ``--halt-at T``
it waits once step T is committed on every rank, writes ``<out>/halted<r>``
and sleeps, so that the test kills it at a known step, never after a sleep.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from layercheck.format import Version
from layercheck.manifest import read_manifest
from layercheck.store import LocalStore, open_store

ROOT = Path(__file__).resolve().parents[2]


class Torchrun:
    """Launches ``worker`` on ``ranks`` local ranks (gloo, one thread each)."""

    def __init__(self, worker: Path, *, env: dict[str, str] | None = None, ranks: int = 2) -> None:
        self.worker, self.ranks = worker, ranks
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": str(ROOT), **(env or {})}

    def command(self, *args: str, ranks: int | None = None) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                str(ranks or self.ranks), "--master_addr", "127.0.0.1", "--master_port",
                str(free_port()), str(self.worker), *args]

    def run(self, *args: str, timeout: float = 300, ranks: int | None = None,
            ok: bool = True) -> str:
        """Run the job to its end; its output. AssertionError unless it exits 0 (``ok``)
        or fails (not ``ok``)."""
        done = subprocess.run(self.command(*args, ranks=ranks), env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        assert (done.returncode == 0) == ok, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    def results(self, out: Path, ranks: int | None = None) -> list[dict]:
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks or self.ranks)]

    def kill_mid_run(self, ckpt: Path, out: Path, *args: str, at: int) -> int:
        """Start a job that halts once step ``at`` is committed (``--halt-at``), wait
        until every rank says so, SIGKILL all its processes; the newest committed step."""
        proc = subprocess.Popen(self.command("--dir", str(ckpt), "--out", str(out), "--halt-at",
                                             str(at), *args),
                                env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        try:
            while not all((out / f"halted{r}").exists() for r in range(self.ranks)):
                assert proc.poll() is None, f"the job ended before it halted at step {at}"
                assert time.monotonic() < deadline, f"no rank reached step {at} within 300 s"
                time.sleep(0.05)
        finally:
            # torchrun starts each worker in a session of its own: kill them all at once
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        return latest(ckpt)


def damage_newest_shard(ckpt: Path, layer: str, rank: int) -> tuple[Version, Version]:
    """Flip a bit in ``rank``'s shard of ``layer``'s newest version; (newest, the one before)."""
    versions = read_manifest(LocalStore(ckpt)).versions[layer]
    damaged = ckpt / versions[-1].shards[rank].file
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    return versions[-1], versions[-2]


def newest_versions(url: str, step: int) -> dict[str, Version]:
    """Per layer, its newest committed version at or before ``step`` (the composite)."""
    view = read_manifest(open_store(url))
    return {name: max((v for v in view.versions[name] if v.step <= step), key=lambda v: v.step)
            for name in view.layer_names}


def latest(ckpt: Path) -> int:
    """The newest committed step of a checkpoint directory (0 if none)."""
    if not (ckpt / "manifest.jsonl").exists():
        return 0
    return read_manifest(LocalStore(ckpt, create=False)).latest_step() or 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> list[int]:
    """Every process below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
