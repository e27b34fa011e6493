"""Two real processes on one checkpoint directory: the second is refused, clearly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.errors import DirectoryLocked
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.stores import BeforeFirstRead

ROOT = Path(__file__).resolve().parents[2]

# A training process that says READY, waits for the go file, trains a few steps,
# reports, then holds the directory.
HOLDER = r"""
import sys, time, torch
from torch import nn
from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.errors import DirectoryLocked
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
go = sys.argv[2]
print("READY", flush=True)
while not __import__("os").path.exists(go):
    time.sleep(0.005)
try:
    lc = LayerCheck(model, opt, sys.argv[1], LayerCheckConfig(warmup_steps=1, base_threshold=0,
                                                              embedding_threshold=0))
except DirectoryLocked as exc:
    print("LOCKED", exc, flush=True)
    sys.exit(3)
start = lc.restore()
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    lc.step()
lc.flush()
print("HOLDING", start + 3, flush=True)
sys.stdin.read()
lc.close()
"""


def _holder(directory: Path, go: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(go)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _model():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.slow
def test_second_process_and_gc_are_refused_until_the_holder_dies(tmp_path):
    go = tmp_path / "go"
    go.touch()
    holder = _holder(tmp_path / "c", go)
    try:
        assert holder.stdout.readline() == "READY\n"
        line = holder.stdout.readline()
        assert line.startswith("HOLDING 3"), line + holder.stderr.read()
        model, opt = _model()
        with pytest.raises(DirectoryLocked) as info:
            LayerCheck(model, opt, tmp_path / "c")
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "in use by another process" in message
        assert "point this one at another directory" in message
        gc = subprocess.run([sys.executable, "-m", "layercheck", "gc", str(tmp_path / "c")],
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert gc.returncode == 2 and "Traceback" not in gc.stderr
        assert gc.stderr.count("\n") == 1 and f"pid {holder.pid}" in gc.stderr
        before = (tmp_path / "c" / "manifest.jsonl").read_bytes()
        assert LocalStore(tmp_path / "c").list("layers")  # nothing was collected
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / "c" / "manifest.jsonl").read_bytes() == before
    with LayerCheck(model, opt, tmp_path / "c") as lc:  # the kernel released the dead lock
        assert lc.restore() == 3
    assert read_manifest(LocalStore(tmp_path / "c")).problems == []


@pytest.mark.slow
def test_two_processes_racing_for_a_fresh_directory_exactly_one_wins(tmp_path):
    go = tmp_path / "go"
    racers = [_holder(tmp_path / "c", go) for _ in range(2)]
    try:
        # both are at the start line (imports done) before the go: a real race
        assert [r.stdout.readline() for r in racers] == ["READY\n"] * 2
        go.touch()
        lines = sorted(r.stdout.readline() for r in racers)
        assert lines[0].startswith("HOLDING 3"), lines
        assert lines[1].startswith("LOCKED") and "in use by another process" in lines[1], lines
    finally:
        for r in racers:
            r.send_signal(signal.SIGKILL)
            r.wait()
    view = read_manifest(LocalStore(tmp_path / "c"))
    assert view.problems == [] and sorted(view.states) == [1, 2, 3]
    assert view.resumes == [0]  # one timeline: the loser wrote nothing


# -- the lock belongs to the process, not to what it forks (issue 13, item 8) --------------
FORKING_TRAINER = r"""
import os, signal, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from layercheck import LayerCheck, LayerCheckConfig
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
lc = LayerCheck(model, opt, sys.argv[1], LayerCheckConfig(warmup_steps=1, base_threshold=0,
                                                          embedding_threshold=0))
lc.restore()
loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=4, num_workers=2,
                    persistent_workers=True, multiprocessing_context="fork")
batches = iter(loader)
for _ in range(3):
    (x,) = next(batches)
    model(x).sum().backward(); opt.step(); opt.zero_grad()
    lc.step()
lc.flush()
read, write = os.pipe()
helper = os.fork()
if helper == 0:  # a forked helper that outlives its parent until told otherwise
    os.close(write)
    os.read(read, 1)
    os._exit(0)
workers = [w.pid for w in batches._workers]
print("READY", helper, *workers, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_a_killed_trainers_forked_children_do_not_keep_the_directory_locked(tmp_path):
    """flock locks belong to the open file, which forked children share: a DataLoader's
    workers and a forked helper kept a SIGKILLed trainer's directory locked, and an
    immediate restart was refused naming the dead pid. The lock is the process's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen([sys.executable, "-c", FORKING_TRAINER, str(tmp_path / "c")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    children: list[int] = []
    try:
        line = trainer.stdout.readline()
        assert line.startswith("READY"), line + trainer.stderr.read()
        children = [int(pid) for pid in line.split()[1:]]
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        assert all(_alive(pid) for pid in children)  # they still run: the point of the test
        model, opt = _model()
        with LayerCheck(model, opt, tmp_path / "c") as lc:  # at once, no waiting
            assert lc.restore() == 3
    finally:
        trainer.kill()
        trainer.wait()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_second_layercheck_in_the_same_process_is_told_so(tmp_path):
    """Not 'another process (pid <its own pid>)': the holder is this process, and the
    second opener must not release the first one's lock by failing."""
    model, opt = _model()
    with LayerCheck(model, opt, tmp_path / "c") as first:
        first.restore()
        with pytest.raises(DirectoryLocked) as info:
            LayerCheck(model, opt, tmp_path / "c")
        message = str(info.value)
        assert "this process" in message and "another process" not in message
        assert "close()" in message
        # the first one still holds the directory against other processes
        probe = subprocess.run([sys.executable, "-m", "layercheck", "gc", str(tmp_path / "c")],
                               capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert probe.returncode == 2 and f"pid {os.getpid()}" in probe.stderr, probe.stderr
    with LayerCheck(model, opt, tmp_path / "c") as again:  # released by close()
        assert again.restore() == 0


# -- offline readers beside a live writer under keep_versions (issue 13, item 4) ------------
EVERY_STEP = dict(base_threshold=0, embedding_threshold=0, warmup_steps=2, keep_versions=1)


class LiveTrainer:
    """A tiny LM trained with keep_versions=1 and every layer at every step, in this
    process; ``weights[t]``: its parameters after step t."""

    def __init__(self, root) -> None:
        from tests.conftest import optimizer_for, tiny_lm
        torch.manual_seed(0)
        self.model = tiny_lm()
        self.opt, self.sched = optimizer_for(self.model, total=400)
        self.lc = LayerCheck(self.model, self.opt, root, LayerCheckConfig(**EVERY_STEP),
                             scheduler=self.sched)
        self.lc.restore()
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def train(self, steps: int) -> None:
        from tests.conftest import train_step
        for _ in range(steps):
            train_step(self.model, self.opt, self.sched)
            step = self.lc.step().step
            self.weights[step] = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.lc.flush()


def _recoverable(plan, weights=None, exported=None) -> None:
    """A plan (and an export) of a state that was recoverable: no fallback, every layer
    of its own step (all are written at every step), and the weights of that step."""
    assert plan.warnings == [], plan.warnings
    assert {v.step for v in plan.sources.values()} == {plan.step}, plan.to_dict()
    if exported is not None:
        for name, value in weights[plan.step].items():
            assert torch.equal(exported[name], value), name


def test_export_inspect_and_plan_while_the_trainer_retires_what_they_planned(tmp_path):
    """The trainer commits two steps, and with keep_versions=1 retires (drop records,
    then files) every version the reader's snapshot planned, between the reader's
    manifest read and its first file read. Before: 'all damaged', false damage, a
    FileNotFoundError, or a silent export of the base layers (never recoverable)."""
    from safetensors.torch import load_file
    from layercheck.tools.export import export_model
    from layercheck.tools.inspection import inspect_directory
    from layercheck.storage.manifest import read_consistent
    from layercheck.recovery import make_plan
    root = tmp_path / "c"
    trainer = LiveTrainer(root)
    try:
        trainer.train(6)
        plan = export_model(BeforeFirstRead(root, lambda: trainer.train(2)), tmp_path / "out")
        assert plan.step == 8
        _recoverable(plan, trainer.weights, load_file(tmp_path / "out" / "model.safetensors"))
        info = inspect_directory(BeforeFirstRead(root, lambda: trainer.train(2)))
        assert info["problems"] == [] and info["newest_step"] >= 8
        reader = BeforeFirstRead(root, lambda: trainer.train(2))
        plan = read_consistent(reader, lambda view: make_plan(reader, view),
                               suspects=lambda p: p.passed_over, finish=lambda p: p)
        assert plan.step == 12
        _recoverable(plan)
    finally:
        trainer.lc.close()


@pytest.mark.slow
def test_offline_commands_beside_a_real_trainer_never_report_false_damage(tmp_path, capsys):
    """A real training process (keep_versions=1, every layer at every step) runs while
    this one exports, inspects and plans, round after round. Every answer is a state
    that was recoverable, or a clear refusal; never a traceback, false damage or a
    fallback. (How often the race strikes depends on the machine; what is asserted
    does not.)"""
    from safetensors.torch import load_file
    from layercheck.tools.cli import main
    trainer = subprocess.Popen(
        [sys.executable, "-c", LIVE_TRAINER, str(tmp_path / "c")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        assert trainer.stdout.readline().startswith("COMMITTED"), trainer.stderr.read()
        steps = []
        for round in range(12):
            out = tmp_path / f"export{round}"
            for argv in (["export", "--out", str(out)], ["inspect", "--json"],
                         ["plan", "--json"]):
                code = main([argv[0], str(tmp_path / "c"), *argv[1:]])
                captured = capsys.readouterr()
                assert code == 0 and captured.err == "", captured.err
                answer = json.loads((out / "layercheck_plan.json").read_text()
                                    if argv[0] == "export" else captured.out)
                assert answer.get("problems", []) == [] and answer.get("warnings", []) == []
                if argv[0] != "inspect":
                    assert {l["source_step"] for l in answer["layers"]} == {answer["step"]}
                    steps.append(answer["step"])
                if argv[0] == "export":
                    assert load_file(out / "model.safetensors")
        assert trainer.poll() is None and len(set(steps)) > 1  # it trained all along
    finally:
        trainer.kill()
        trainer.wait()


LIVE_TRAINER = r"""
import sys, torch
from layercheck import LayerCheck, LayerCheckConfig
from tests.conftest import optimizer_for, tiny_lm, train_step
torch.manual_seed(0)
model = tiny_lm()
opt, sched = optimizer_for(model, total=10 ** 6)
cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2, keep_versions=1)
with LayerCheck(model, opt, sys.argv[1], cfg, scheduler=sched) as lc:
    lc.restore()
    for step in range(1, 10 ** 6):
        train_step(model, opt, sched)
        lc.step()
        if step == 3:
            lc.flush()
            print("COMMITTED", flush=True)
"""


READER = r"""
import sys
from layercheck.storage.localstore import LocalStore
with LocalStore(sys.argv[1]).reading():
    print("READING", flush=True)
    sys.stdin.readline()
print("DONE", flush=True)
"""


def test_retention_deletes_no_file_while_a_reader_reads(tmp_path):
    """An offline reader (another process) holds the directory's reader lock: the
    trainer still drops superseded versions (records), but deletes their files only
    once no one reads, so what the reader planned stays readable however long it takes."""
    root = tmp_path / "c"
    trainer = LiveTrainer(root)
    reader = None
    try:
        trainer.train(4)
        reader = subprocess.Popen([sys.executable, "-c", READER, str(root)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert reader.stdout.readline() == "READING\n"
        planned = {v.file for v in read_manifest(LocalStore(root)).all_versions()
                   if v.step == 4}  # the newest step's (the base, of step 2, stays)
        trainer.train(3)
        assert not planned & {v.file for v in read_manifest(LocalStore(root)).all_versions()}
        assert all((root / f).exists() for f in planned)  # dropped, not deleted
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline() == "DONE\n"
        trainer.train(1)
        assert not any((root / f).exists() for f in planned)
    finally:
        trainer.lc.close()
        if reader is not None:
            reader.kill()
            reader.wait()


# -- every URL of a held directory meets its lock (issue 27, items 2 and 3) -----------------
@pytest.mark.slow
def test_every_url_of_a_directory_another_process_holds_is_refused(tmp_path):
    """The holder opened the directory by its plain path. An intruder naming it
    ``local:///abs`` (fsspec's name for the local file system) got a lock-free store and
    its ``restore(step=1)`` appended ``resume 1``, abandoning the holder's steps 2 and 3;
    ``file://localhost/abs`` went to ./localhost/abs. Every form now meets the lock,
    from LayerCheck and from gc, and nothing is written anywhere."""
    go = tmp_path / "go"
    go.touch()
    holder = _holder(tmp_path / "c", go)
    root = str(tmp_path / "c")
    forms = [f"local://{root}", f"file://localhost{root}", f"file:{root}",
             (tmp_path / "c").as_uri(), f"simplecache::file://{root}", f"filecache::local://{root}"]
    try:
        assert holder.stdout.readline() == "READY\n"
        line = holder.stdout.readline()
        assert line.startswith("HOLDING 3"), line + holder.stderr.read()
        before = (tmp_path / "c" / "manifest.jsonl").read_bytes()
        model, opt = _model()
        for form in forms:
            with pytest.raises(DirectoryLocked, match=f"pid {holder.pid} holds") as info:
                LayerCheck(model, opt, form).restore(step=1)
            assert "in use by another process" in str(info.value), form
        gc = subprocess.run([sys.executable, "-m", "layercheck", "gc", f"local://{root}"],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert gc.returncode == 2 and f"pid {holder.pid}" in gc.stderr, gc.stderr
        assert (tmp_path / "c" / "manifest.jsonl").read_bytes() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "go"]  # no ./localhost/...
    view = read_manifest(LocalStore(tmp_path / "c"))
    assert sorted(view.states) == [1, 2, 3] and view.resumes == [0]
