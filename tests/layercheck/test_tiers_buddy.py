"""The buddy replica on two "nodes": two torchruns of one rank each, each with its own
memory-tier folder, meeting over gloo (``tiers_worker.py --dist``).

A node's loss is its processes killed and its memory tier wiped: its rank comes
back from the copy its buddy on the other node keeps, bit-identical to the
failure-free run. Both nodes' tiers lost: the durable composite, as without tiers.
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler.launch import rank_environment
from tests.layercheck.torchrun import descendants, failure

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "layercheck" / "tiers_worker.py"
STEPS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nodes(work: Path, out: str, *args: str) -> list[subprocess.Popen]:
    """Two torchruns, nodes 0 and 1, one rank each, on ``work/ckpt`` (shared storage)
    and ``work/mem<node>`` (each node's memory tier)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--node_rank", str(node), "--nproc_per_node", "1", "--master_addr",
                   "127.0.0.1", "--master_port", str(port), str(WORKER), "--dist",
                   "--dir", str(work / "ckpt"), "--tier", str(work / f"mem{node}"),
                   "--out", str(work / out), "--steps", str(STEPS), *args]
        procs.append(subprocess.Popen(command, env=rank_environment(1), cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    return procs


def run(work: Path, out: str) -> list[dict]:
    procs = nodes(work, out)
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, failure(subprocess.CompletedProcess([], 1, stdout, stderr))
    return [json.loads((work / out / f"rank{r}.json").read_text()) for r in (0, 1)]


def kill_at(work: Path, out: str, step: int) -> None:
    """Run until step ``step`` is committed in every tier on both nodes, then SIGKILL all."""
    procs = nodes(work, out, "--halt-at", str(step))
    deadline = time.monotonic() + 180
    try:
        while not all((work / out / f"halted{r}").exists() for r in (0, 1)):
            assert all(p.poll() is None for p in procs), "a node ended before it halted"
            assert time.monotonic() < deadline, "the nodes did not halt"
            time.sleep(0.05)
    finally:
        for proc in procs:
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    os_kill(pid)
                except ProcessLookupError:
                    pass
            proc.communicate()


def os_kill(pid: int) -> None:
    import os
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    return [r["digests"] for r in run(tmp_path_factory.mktemp("reference"), "out")]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("killed")
    kill_at(work, "first", 5)
    return work


def test_a_lost_node_resumes_from_its_buddy_bit_identical(killed, reference, tmp_path):
    work = tmp_path / "w"
    shutil.copytree(killed, work)
    assert (work / "mem0" / "ward1").is_dir()  # node 0 keeps rank 1's copies
    shutil.rmtree(work / "mem1")  # node 1 lost: its processes and its memory tier
    ranks = run(work, "again")
    for r, resumed in enumerate(ranks):
        assert resumed["restored_step"] == 5
        assert resumed["restored_digest"] == reference[r]["5"]
        assert resumed["digests"][str(STEPS)] == reference[r][str(STEPS)]
    assert {tier for tier, _ in ranks[0]["sources"].values()} == {"memory"}
    assert {tier for tier, _ in ranks[1]["sources"].values()} == {"buddy"}


def test_a_node_and_its_buddy_lost_resume_from_storage(killed, tmp_path):
    work = tmp_path / "w"
    shutil.copytree(killed, work)
    shutil.rmtree(work / "mem0")
    shutil.rmtree(work / "mem1")
    ranks = run(work, "again")
    for resumed in ranks:
        assert resumed["restored_step"] <= 5
        assert {tier for tier, _ in resumed["sources"].values()} == {"storage"}
    assert ranks[0]["restored_step"] == ranks[1]["restored_step"]
