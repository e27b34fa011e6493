"""The memory tier in one process: real SIGKILLed training runs resume bit-identically.

Each killed run is compared with the failure-free run of the same job
(``tiers_worker.py``): the digest of the whole training state restored at step
T equals the failure-free run's at T, and so does the end of the run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from layercheck import LayerCheck, LayerCheckConfig
from layercheck import ConfigError
from layercheck.tiers import TierConfig
from layercheck.tiers.memory import TierFull
from profiler.launch import rank_environment

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "layercheck" / "tiers_worker.py"
STEPS = 10


def run(work: Path, out: str, *args: str, halt: int = 0) -> dict:
    """The worker on ``work/ckpt`` and ``work/mem``; its report (``out``/rank0.json).
    ``halt``: SIGKILL it once step ``halt`` is committed in every tier."""
    command = [sys.executable, str(WORKER), "--dir", str(work / "ckpt"), "--tier",
               str(work / "mem"), "--out", str(work / out), "--steps", str(STEPS), *args]
    env = rank_environment(1)
    if not halt:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
        report = work / out / "rank0.json"
        return json.loads(report.read_text()) if report.exists() else {}
    proc = subprocess.Popen([*command, "--halt-at", str(halt)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (work / out / "halted0").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not halt"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return json.loads((work / out / "rank0.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The failure-free run: the digest after every step. Its durable tier writes every
    layer at steps 2 (the base), 6 and 10 only (Smax 4, thresholds no drift reaches)."""
    return run(tmp_path_factory.mktemp("reference"), "out")["digests"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A run SIGKILLed once step 7 is committed: its checkpoint and memory tier."""
    work = tmp_path_factory.mktemp("killed")
    run(work, "first", halt=7)
    return work


def copy_of(killed: Path, tmp_path: Path) -> Path:
    shutil.copytree(killed, tmp_path / "w")
    return tmp_path / "w"


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def slot_of(work: Path, step: int) -> Path:
    for k in (0, 1):
        marker = work / "mem" / "rank0" / f"slot{k}.json"
        if marker.exists() and json.loads(marker.read_text())["step"] == step:
            return work / "mem" / "rank0" / f"slot{k}"
    raise AssertionError(f"no slot of step {step}")


def test_sigkill_resumes_bit_identical_at_the_failure_step(killed, reference, tmp_path):
    work = copy_of(killed, tmp_path)
    resumed = run(work, "again")
    assert resumed["restored_step"] == 7
    assert resumed["extra"] == {"step": 7}
    assert {tier for tier, _ in resumed["sources"].values()} == {"memory"}
    assert resumed["restored_digest"] == reference["7"]
    assert resumed["digests"][str(STEPS)] == reference[str(STEPS)]


def test_a_damaged_memory_file_falls_back_to_the_older_slot_then_to_storage(killed, tmp_path):
    work = copy_of(killed, tmp_path)
    flip(slot_of(work, 7) / "L1")  # layer "3", the second
    resumed = run(work, "again")
    assert resumed["restored_step"] == 7
    assert resumed["sources"]["3"] == ["memory", 6]  # the other slot: one step older
    assert resumed["sources"]["0"] == ["memory", 7]
    work = copy_of(killed, tmp_path / "second")
    flip(slot_of(work, 7) / "L1")  # layer "3", the second
    with open(slot_of(work, 6) / "L1", "r+b") as f:  # partial: cut short
        f.truncate(10)
    resumed = run(work, "again")
    tier, step = resumed["sources"]["3"]
    assert resumed["restored_step"] == 7 and tier == "storage" and step < 7


def test_a_slot_without_its_marker_is_not_used(killed, reference, tmp_path):
    work = copy_of(killed, tmp_path)
    (slot_of(work, 7).parent / (slot_of(work, 7).name + ".json")).unlink()
    resumed = run(work, "again")
    # memory's consistent step 6, exactly, though storage committed step 7
    assert resumed["restored_step"] == 6
    assert resumed["restored_digest"] == reference["6"]


def test_a_kill_during_a_memory_tier_write_resumes_at_the_step_before(reference, tmp_path):
    run(tmp_path, "first", "--die-in-write", "8")
    resumed = run(tmp_path, "again")
    assert resumed["restored_step"] == 7
    assert resumed["restored_digest"] == reference["7"]
    assert resumed["digests"][str(STEPS)] == reference[str(STEPS)]


def test_another_runs_memory_tier_is_not_used(killed, tmp_path):
    work = copy_of(killed, tmp_path)
    shutil.rmtree(work / "ckpt")  # a new run in the same directory and folder
    resumed = run(work, "again")
    assert resumed["restored_step"] == 0


def tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_tier_over_its_budget_is_refused_before_anything_is_written(tmp_path):
    model, optimizer = tiny()
    lc = LayerCheck(model, optimizer, str(tmp_path / "ckpt"), LayerCheckConfig(),
                    tiers=TierConfig(folder=str(tmp_path / "mem"), budget_bytes=4096))
    lc.restore()
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    with pytest.raises(TierFull, match="raise TierConfig\\(budget_bytes"):
        lc.step()
    assert not list((tmp_path / "mem").rglob("slot*"))
    lc.close()


def test_the_config_refuses_bad_values():
    with pytest.raises(ConfigError, match="budget_bytes"):
        TierConfig(budget_bytes=0)
    with pytest.raises(ConfigError, match="node"):
        TierConfig(node="")
    with pytest.raises(TypeError):
        TierConfig("/dev/shm/x")  # keyword only
    assert TierConfig(node="n1").folder_for("ckpt").endswith("/n1")
    assert os.path.dirname(TierConfig(node="n1").folder_for("a")) != \
        os.path.dirname(TierConfig(node="n1").folder_for("b"))


def test_plan_and_inspect_say_which_tier_each_layer_would_come_from(killed, tmp_path, capsys):
    from layercheck.tools.cli import main
    work = copy_of(killed, tmp_path)
    flip(slot_of(work, 7) / "L1")
    flip(slot_of(work, 6) / "L1")
    assert main(["plan", str(work / "ckpt"), "--memory-tier", str(work / "mem"), "--json"]) == 0
    tiers = json.loads(capsys.readouterr().out)["tiers"]
    assert tiers["step"] == 7
    (rank,) = tiers["ranks"]
    assert rank["state"] == "memory"
    assert [(l["layer"], l["tier"], l["step"]) for l in rank["layers"]] == [
        ("0", "memory", 7), ("3", "storage", 6), ("5", "memory", 7)]
    assert main(["inspect", str(work / "ckpt"), "--memory-tier", str(work / "mem")]) == 0
    text = capsys.readouterr().out
    assert "a restore now takes step 7" in text
    assert "0/3 layers intact" not in text and "2/3 layers intact" in text


def test_a_write_budget_counts_in_the_layers_sizes_after_a_memory_tier_restore(tmp_path):
    """The budget charges each write a layer's bytes; a restore from memory gives the
    policy those sizes as a restore from storage does (a fresh process knows none)."""
    config = LayerCheckConfig(write_budget=2000.0, warmup_steps=2, smax=4)
    tiers = TierConfig(folder=str(tmp_path / "mem"), budget_bytes=1 << 20)

    def train(lc: LayerCheck, model: nn.Module, optimizer: torch.optim.Optimizer,
              steps: range) -> None:
        for step in steps:
            model(torch.full((2, 4), float(step))).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            lc.step()

    model, optimizer = tiny()
    lc = LayerCheck(model, optimizer, str(tmp_path / "ckpt"), config, tiers=tiers)
    lc.restore()
    train(lc, model, optimizer, range(1, 8))
    sizes = lc.policy.sizes
    assert sizes is not None and sizes.sum() > 0
    lc.close()

    model, optimizer = tiny()
    lc = LayerCheck(model, optimizer, str(tmp_path / "ckpt"), config, tiers=tiers)
    assert lc.restore() == 7 and set(lc.tiers.last.tiers()) == {"memory"}
    assert lc.policy.sizes is not None
    np.testing.assert_array_equal(lc.policy.sizes, sizes)
    train(lc, model, optimizer, range(8, 12))  # the budget settles every opportunity
    assert lc.state.spent > 0
    lc.close()


def test_a_restore_of_an_older_step_abandons_the_memory_tiers_later_steps(tmp_path):
    """``restore(step)`` is the durable one; the memory tier's copies of later steps
    belong to the timeline it abandons and are never restored after it."""
    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
    tiers = TierConfig(folder=str(tmp_path / "mem"), budget_bytes=1 << 20)

    def run_until(restore: "int | None", last: int) -> int:
        model, optimizer = tiny()
        lc = LayerCheck(model, optimizer, str(tmp_path / "ckpt"), config, tiers=tiers)
        start = lc.restore(restore)
        for step in range(start + 1, last + 1):
            model(torch.full((2, 4), float(step))).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            lc.step()
        lc.close()
        return start

    run_until(None, 6)  # storage and memory hold step 6
    assert run_until(3, 4) == 3  # back to step 3, on to 4
    assert run_until(None, 4) == 4  # not the abandoned timeline's step 6


def digest(model: nn.Module) -> list[list[float]]:
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


class Job:
    """The ``tiny`` job on ``tmp/ckpt``, on the "node" whose memory-tier folder is
    ``tmp/<node>`` (in one process: each node is a folder)."""

    config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.digests: dict[int, list[list[float]]] = {}

    def run(self, node: str, restore: "int | None", last: int) -> tuple[int, list]:
        """Restore (``restore``: that step) and train on to ``last``; the restored step
        and the model as restored."""
        model, optimizer = tiny()
        lc = LayerCheck(model, optimizer, str(self.tmp / "ckpt"), self.config,
                        tiers=TierConfig(folder=str(self.tmp / node), budget_bytes=1 << 20))
        start = lc.restore(restore)
        restored = digest(model)
        for step in range(start + 1, last + 1):
            model(torch.full((2, 4), float(step))).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            lc.step()
            self.digests[step] = digest(model)
        lc.close()
        return start, restored


@pytest.mark.parametrize("held", ["rank0", "ward0"])
def test_a_node_that_sat_out_a_rewind_never_gives_back_the_abandoned_timeline(
        tmp_path, held, capsys):
    """The job trains on node B (its memory tier holds steps 5 and 6), moves to node A,
    goes back to step 3 (``restore(3)``: B's folder is not reached) and trains to 8;
    back on node B, the restore takes storage's step 8, never B's step 6 of the
    abandoned timeline (memory's step would be taken before storage's newer one), as
    its own copy or as a buddy's ward copy (``held``); ``plan`` says so first, and
    the restore drops them."""
    from layercheck.tools.cli import main
    job = Job(tmp_path)
    job.run("nodeB", None, 6)
    if held != "rank0":
        (tmp_path / "nodeB" / "rank0").rename(tmp_path / "nodeB" / held)
    assert job.run("nodeA", 3, 8)[0] == 3
    eighth = job.digests[8]
    assert main(["plan", str(tmp_path / "ckpt"), "--memory-tier", str(tmp_path / "nodeB")]) == 0
    text = capsys.readouterr().out
    assert "a restore now takes step 8" in text
    for step in (5, 6):
        assert re.search(rf"rank 0's copy of step {step} \((memory|buddy)\): abandoned: a "
                         r"restore of step 3 left timeline [0-9a-f]+, which wrote it: not "
                         "used", text), text
    step, restored = job.run("nodeB", None, 9)
    assert (step, restored) == (8, eighth)
    assert [json.loads(m.read_text())["step"] for m in
            (tmp_path / "nodeB").rglob("slot*.json")] == [9]  # 5 and 6 dropped


def test_a_kill_between_the_rewinds_record_and_the_memory_tiers_drop(tmp_path, monkeypatch):
    """``restore(3)`` records the new timeline, then is killed before it drops the
    memory tier's later copies (here: the drop never runs); the next restore takes
    storage's step 3, not the abandoned step 6 still in the folder."""
    from layercheck.tiers.tiered import Tiers
    job = Job(tmp_path)
    job.run("node", None, 6)
    third = Job(tmp_path / "x")
    third.run("node", None, 3)  # the same job, trained to step 3 only
    with monkeypatch.context() as patched:
        patched.setattr(Tiers, "drop_after", lambda self, step: None)
        assert job.run("node", 3, 3)[0] == 3
    assert len(list((tmp_path / "node" / "rank0").glob("slot*.json"))) == 2  # 5 and 6 stay
    step, restored = job.run("node", None, 3)
    assert (step, restored) == (3, third.digests[3])
