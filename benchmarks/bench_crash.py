"""Crash consistency: SIGKILL a real training process at random moments, then recover.

    python benchmarks/bench_crash.py [--trials 200] [--seed 0] [--json docs/reliability-crash.json]
                                     [--kill-after-commit] [--sabotage] [--retention]

Each trial forks a training process from this one (torch is imported once, so
a trial costs training, not start-up) that trains with LayerCheck on a
checkpoint directory shared with the trials before it (so later trials
restart from what earlier kills left: resume records, abandoned timelines,
leftover temp files). The child flushes at random steps, and every 10 steps
closes LayerCheck, runs ``gc`` and reopens. After a random delay it is killed
with SIGKILL, wherever it is: computing, snapshotting, writing a layer or
state file, appending to the manifest, collecting garbage, restoring. With
``--kill-after-commit`` the delay starts only once the child has committed a
step of its own (it says so on a pipe), so every trial has something new to
recover however slow the machine is (the CI tests use it). The
child reports into shared memory the step whose commit last returned
(``flush()`` or ``close()``) and what it was doing (a Store wrapper marks each
storage operation), so the moment of every kill is known.

After each kill, checks (any failure is a violation; exit status 1):
- ``make_plan`` (checksums verified) and ``restore()`` succeed once anything
  was committed, with no fallback past a damaged file (SIGKILL cannot damage
  a committed file) and no skipped manifest line other than a torn tail;
- the restored step is never older than the last step whose commit returned;
- exact mode (threshold 0, every layer at every step): the restored weights
  and Adam moments equal, bit for bit, those of an uninterrupted reference run
  at that step (so nothing uncommitted or from an abandoned timeline is used);
- composite mode (drift thresholds, small smax): every restored layer equals
  the committed file its plan names.

``--retention`` runs every child with ``keep_versions=1`` and ``on_error="warn"``
(retention retires versions and deletes files at every step) and a 16 KiB
manifest compaction threshold, so kills also land in retirements and
compactions; the checks are the same.

``--sabotage`` makes the child's store write only half of every version of
the head written after the base checkpoint, while reporting success: the checks
must then report violations (the harness's own test that it can fail); with
``--kill-after-commit`` they must in every trial whose child commits past the base.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.tools.cleanup import collect_garbage  # noqa: E402
from layercheck.contract.errors import CheckpointNotFound  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.recovery import make_plan  # noqa: E402
from layercheck.storage.localstore import LocalStore  # noqa: E402

WIDTH, BLOCKS, BATCH = 192, 6, 16
GC_EVERY = 10
MAIN_PHASES = ["start", "compute", "step/snapshot", "flush", "close", "gc", "reopen+restore",
               "restore"]
STORE_PHASES = ["idle", "layer file", "state file", "manifest append",
                "manifest rewrite (gc, compaction)", "delete (gc, retention)", "other write"]
TORN_IS_NOT = ("CRC", "refusing", "malformed", "unknown record kind", "required")
# shared memory slots (int64): committed step, main phase, store phase, current step
SLOTS = struct.Struct("<4q")


class Net(nn.Module):
    """A residual MLP: BLOCKS layers of WIDTH x WIDTH plus a head (layers of ~0.4 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x)


def build() -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def train_step(model: Net, opt: torch.optim.Optimizer, position: int) -> None:
    g = torch.Generator().manual_seed(position)
    x = torch.randn(BATCH, WIDTH, generator=g)
    loss = (model(x) - x[:, :8]).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def fingerprint(model: Net, opt: torch.optim.Optimizer) -> int:
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().numpy().tobytes(), crc)
        for key in ("exp_avg", "exp_avg_sq"):
            if key in opt.state.get(p, {}):
                crc = zlib.crc32(opt.state[p][key].numpy().tobytes(), crc)
    return crc


RETENTION: dict = {}
"""``--retention``: the config's retention and error policy (forked children inherit it)."""


def config(mode: str) -> LayerCheckConfig:
    if mode == "exact":
        return LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2, smax=50,
                                **RETENTION)
    return LayerCheckConfig(base_threshold=2e-3, embedding_threshold=2e-2, warmup_steps=3, smax=6,
                            **RETENTION)


class Shared:
    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, SLOTS.size)

    def set(self, slot: int, value: int) -> None:
        self.mem[slot * 8:(slot + 1) * 8] = struct.pack("<q", value)

    def get(self) -> tuple[int, int, int, int]:
        return SLOTS.unpack(self.mem[:SLOTS.size])


class PhaseStore:
    """A LocalStore that marks, in shared memory, which storage operation runs.
    ``sabotage``: the first step after the base checkpoint; from it on, every
    version of the head is written half (and reported whole)."""

    def __init__(self, root: Path, shared: Shared, sabotage: int | None) -> None:
        self.inner, self.shared, self.sabotage = LocalStore(root), shared, sabotage
        self.url = self.inner.url

    def _mark(self, phase: str) -> None:
        self.shared.set(2, STORE_PHASES.index(phase))

    def write_atomic(self, path: str, data: bytes) -> None:
        phase = ("layer file" if path.startswith("layers/") else "state file"
                 if path.startswith("states/") else "manifest rewrite (gc, compaction)"
                 if path == "manifest.jsonl" else "other write")
        self._mark(phase)
        if self.sabotage is not None and path.startswith("layers/head@") and int(
                path.split("@")[1].split(".")[0]) >= self.sabotage:
            whole = b"".join(data) if not isinstance(data, bytes) else data  # streamed buffers
            data = whole[: len(whole) // 2]  # a store that lies: half the file, reported whole
        self.inner.write_atomic(path, data)
        self._mark("idle")

    def append(self, path: str, data: bytes) -> None:
        self._mark("manifest append")
        self.inner.append(path, data)
        self._mark("idle")

    def delete(self, path: str) -> None:
        self._mark("delete (gc, retention)")
        self.inner.delete(path)
        self._mark("idle")

    def delete_unread(self, paths: list[str]) -> bool:
        self._mark("delete (gc, retention)")
        deleted = self.inner.delete_unread(paths)
        self._mark("idle")
        return deleted

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def child(directory: Path, mode: str, shared: Shared, sabotage: bool, seed: int,
          commits: int) -> None:
    """Train forever (until killed), reporting progress into ``shared``, and its
    first commit (a byte) on the pipe ``commits``."""
    rng = random.Random(seed)
    main = lambda phase: shared.set(1, MAIN_PHASES.index(phase))  # noqa: E731

    def committed(step: int) -> None:
        nonlocal commits
        shared.set(0, step)
        if commits >= 0:
            os.write(commits, b"c")
            os.close(commits)
            commits = -1

    store = PhaseStore(directory, shared, config(mode).warmup_steps + 1 if sabotage else None)
    model, opt = build()
    main("restore")
    lc = LayerCheck(model, opt, store, config(mode))
    step = lc.restore()
    position = (lc.extra or {}).get("position", 0)
    while True:
        step += 1
        shared.set(3, step)
        main("compute")
        train_step(model, opt, position)
        position += BATCH
        main("step/snapshot")
        lc.step(extra={"position": position})
        if rng.random() < 0.3:
            main("flush")
            lc.flush()
            committed(step)
        if step % GC_EVERY == 0:
            main("close")
            lc.close()
            committed(step)
            main("gc")
            collect_garbage(store, keep=2)
            main("reopen+restore")
            lc = LayerCheck(model, opt, store, config(mode))
            assert lc.restore() == step


class Reference:
    """The uninterrupted run's fingerprint at every step (exact mode's yardstick)."""

    def __init__(self) -> None:
        self.model, self.opt = build()
        self.prints = [fingerprint(self.model, self.opt)]

    def at(self, step: int) -> int:
        while len(self.prints) <= step:
            train_step(self.model, self.opt, (len(self.prints) - 1) * BATCH)
            self.prints.append(fingerprint(self.model, self.opt))
        return self.prints[step]


def check(directory: Path, mode: str, committed: int, reference: Reference) -> tuple[int, list[str]]:
    """Recover after a kill; returns (restored step, violations)."""
    problems: list[str] = []
    store = LocalStore(directory)
    view = read_manifest(store)
    # a kill mid-append can only leave a torn (then sealed) line: a broken JSON text;
    # a CRC mismatch, a refused path or a malformed field would mean something else broke
    foreign = [p for p in view.problems if any(w in p for w in TORN_IS_NOT)]
    if foreign:
        problems.append(f"manifest lines damaged other than by a torn append: {foreign}")
    try:
        plan = make_plan(store, view)
        if plan.warnings:
            problems.append(f"plan fell back past damaged files: {plan.warnings}")
    except CheckpointNotFound as exc:
        plan = None
        if committed > 0:
            problems.append(f"plan failed although step {committed} had committed: {exc}")
    model, opt = build()
    try:
        with LayerCheck(model, opt, store, config(mode)) as lc:
            restored = lc.restore()
            report = lc.restored
    except Exception as exc:  # any failure to recover is the violation being counted
        return -1, problems + [f"restore failed: {type(exc).__name__}: {exc}"]
    if restored < committed:
        problems.append(f"restored step {restored} is older than committed step {committed}")
    if plan is not None and restored != plan.step:
        problems.append(f"restore() gave step {restored}, plan said {plan.step}")
    if mode == "exact" and restored > 0 and fingerprint(model, opt) != reference.at(restored):
        problems.append(f"state restored at step {restored} differs from the uninterrupted run")
    if mode == "composite" and report.plan is not None:
        problems += _layers_match_files(directory, model, report.plan)
    return restored, problems


def _layers_match_files(directory: Path, model: Net, plan) -> list[str]:
    from safetensors.torch import load_file
    params = dict(model.named_parameters())
    wrong = []
    for name, version in plan.sources.items():
        for key, tensor in load_file(directory / version.file).items():
            if key.startswith("param/") and not torch.equal(params[key[6:]], tensor):
                wrong.append(f"layer {name}: restored weights differ from {version.file}")
    return wrong


def _warm_drift_kernel() -> None:
    """Compile (or load) the fused drift kernels once, here: every forked child
    inherits them, so no child spends its short life in the JIT instead of training."""
    try:
        from layercheck.drift import kernels
    except ImportError:  # no numba: the torch path needs no warming
        return
    kernels.warm()


def run(trials: int, seed: int, sabotage: bool, max_delay: float,
        after_commit: bool = False, retention: bool = False) -> dict:
    _warm_drift_kernel()
    if retention:
        from layercheck.storage import writer
        RETENTION.update(keep_versions=1, on_error="warn")
        writer.COMPACT_BYTES = 16 << 10
    rng = random.Random(seed)
    references = {"exact": Reference(), "composite": None}
    workdir = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    rows, main_phases, store_phases = [], Counter(), Counter()
    directory, mode = None, None
    started = time.perf_counter()
    try:
        for trial in range(trials):
            if trial % 20 == 0:  # a fresh chain of 20 trials; alternate modes per chain
                mode = "exact" if (trial // 20) % 2 == 0 else "composite"
                directory = workdir / f"chain{trial // 20}"
            rows.append(_trial(directory, mode, rng, sabotage, max_delay, after_commit,
                               references[mode], main_phases, store_phases))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    violations = [p for r in rows for p in r["violations"]]
    return {"trials": trials, "seed": seed, "sabotage": sabotage, "retention": retention,
            "violations": len(violations), "violation_examples": violations[:10],
            "killed_while_main": dict(main_phases), "killed_while_store": dict(store_phases),
            "restored_steps": [r["restored"] for r in rows],
            "restored_minus_committed": Counter(r["restored"] - r["committed"] for r in rows
                                                if r["restored"] >= 0),
            "seconds": round(time.perf_counter() - started, 1)}


def _trial(directory, mode, rng, sabotage, max_delay, after_commit, reference, main_phases,
           store_phases):
    shared = Shared()
    shared.set(0, -1)
    floor = read_manifest(LocalStore(directory)).latest_step() or 0 if directory.exists() else 0
    child_seed = rng.randrange(2**31)
    delay = rng.uniform(0.02, max_delay)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the training process
        try:
            os.close(read)
            child(directory, mode, shared, sabotage, child_seed, write)
        except BaseException:  # noqa: BLE001 - say why, then die as the kill would
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(write)
    try:
        # one byte at the child's first commit, or EOF if it died first, or nothing: it hangs
        if after_commit and not (select.select([read], [], [], 120)[0] and os.read(read, 1)):
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return {"restored": -1, "committed": -1, "violations": [
                f"the child did not commit within 120 s (status {status}: it ended or hung)"]}
    finally:
        os.close(read)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    committed, main, store_op, step = shared.get()
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        return {"restored": -1, "committed": committed, "violations": [
            f"the child ended on its own (status {status}) before the kill, at step {step}"]}
    main_phases[MAIN_PHASES[main]] += 1
    store_phases[STORE_PHASES[store_op]] += 1
    committed = max(committed, floor)  # what an earlier trial committed is committed too
    restored, violations = check(directory, mode, committed, reference)
    return {"restored": restored, "committed": committed, "violations": violations}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-delay", type=float, default=1.5, help="kill within this many seconds")
    ap.add_argument("--sabotage", action="store_true", help="the store lies: checks must fail")
    ap.add_argument("--kill-after-commit", action="store_true",
                    help="start each trial's delay once the child has committed a step")
    ap.add_argument("--retention", action="store_true",
                    help="keep_versions=1, on_error='warn', compaction at 16 KiB")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = run(args.trials, args.seed, args.sabotage, args.max_delay, args.kill_after_commit,
                 args.retention)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
