"""The buddy replica on two "nodes": two torchruns of one rank each, each with its own
memory-tier folder, meeting over gloo (``tiers_worker.py --dist``).

A node's loss is its processes killed and its memory tier wiped: its rank comes
back from the copy its buddy on the other node keeps, bit-identical to the
failure-free run. Both nodes' tiers lost: the durable composite, as without tiers.

Kills in the middle of the buddy protocol (the worker's fault-injection points,
``tiers_worker.py --die-in-send/--die-in-receive/--die-in-move``): a ward slot
being received holds no marker and is never used, the restore takes the
buddy's previous complete copy, bit-identical; a kill during a restore's buddy
transfer changes nothing, and the next restart restores as if it had not happened.
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
        kill_all(procs)


def os_kill(pid: int) -> None:
    import os
    os.kill(pid, signal.SIGKILL)


def kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGKILL both nodes' torchruns and every process under them, and reap them."""
    for proc in procs:
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os_kill(pid)
            except ProcessLookupError:
                pass
        proc.communicate()


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


def die(work: Path, out: str, *args: str, node: int) -> None:
    """Run both nodes with a fault injected on ``node``'s rank (it SIGKILLs itself at
    the worker's injection point), wait for that node's torchrun to end, then SIGKILL
    every process of both nodes (the other is stuck on its dead peer, or failing)."""
    procs = nodes(work, out, *args)
    try:
        _, stderr = procs[node].communicate(timeout=180)
        assert "Signal 9 (SIGKILL)" in stderr or "exitcode  : -9" in stderr, stderr[-3000:]
    finally:
        kill_all(procs)


def half_written(ward: Path) -> int:
    """The step of the one committed slot in ``ward``, whose other slot was being
    received: its files there, its marker not."""
    steps = [json.loads(m.read_text())["step"] if (m := ward / f"slot{k}.json").exists()
             else None for k in (0, 1)]
    assert steps.count(None) == 1, steps
    assert any((ward / f"slot{steps.index(None)}").iterdir())
    return next(step for step in steps if step is not None)


def resumes_from_the_buddy(work: Path, reference: list[dict], step: int) -> None:
    """Node 1 lost (its memory tier wiped): both ranks restart at ``step``, rank 1 from
    the copy node 0 keeps, bit-identical to the failure-free run, and finish as it did."""
    shutil.rmtree(work / "mem1", ignore_errors=True)
    ranks = run(work, "again")
    for r, resumed in enumerate(ranks):
        assert resumed["restored_step"] == step
        assert resumed["restored_digest"] == reference[r][str(step)]
        assert resumed["digests"][str(STEPS)] == reference[r][str(STEPS)]
    assert set(map(tuple, ranks[1]["sources"].values())) == {("buddy", step)}


def test_a_sender_killed_in_the_middle_of_a_buddy_send_leaves_the_previous_copy(
        reference, tmp_path):
    work = tmp_path / "w"
    die(work, "first", "--die-in-send", "1:5", node=1)
    assert half_written(work / "mem0" / "ward1") == 4  # step 5 was arriving
    shutil.copytree(work, tmp_path / "processes")
    ranks = run(tmp_path / "processes", "again")  # processes lost only: step 5 is committed
    for r, resumed in enumerate(ranks):           # in each rank's own memory tier
        assert resumed["restored_step"] == 5
        assert resumed["restored_digest"] == reference[r]["5"]
        assert set(map(tuple, resumed["sources"].values())) == {("memory", 5)}
    resumes_from_the_buddy(work, reference, 4)


@pytest.mark.drill
def test_a_receiver_killed_in_the_middle_of_a_buddy_send_leaves_the_previous_copy(
        reference, tmp_path):
    die(tmp_path, "first", "--die-in-receive", "0:5", node=0)
    assert half_written(tmp_path / "mem0" / "ward1") == 4
    resumes_from_the_buddy(tmp_path, reference, 4)


@pytest.mark.parametrize("dies", [pytest.param(0, marks=pytest.mark.drill), 1], ids=["holder", "receiver"])
def test_a_kill_during_a_restores_buddy_transfer_changes_nothing(killed, reference, tmp_path,
                                                                   dies):
    work = tmp_path / "w"
    shutil.copytree(killed, work)
    shutil.rmtree(work / "mem1")  # node 1 lost: rank 1's copies come from node 0
    die(work, "interrupted", "--die-in-move", str(dies), node=dies)
    assert not list((work / "interrupted").glob("restored*.json"))  # no rank got through
    resumes_from_the_buddy(work, reference, 5)
