"""Real multi-rank jobs for the tests: a worker script under torchrun, judged by its files.

    job = Torchrun(WORKER, env={"DS_ACCELERATOR": "cpu"})
    text = job.run("--dir", d, "--out", o, "--steps", "12")       # AssertionError unless exit 0
    ranks = job.results(o)                                         # o/rank<r>.json of each rank
    step = job.kill_mid_run(d, o, "--steps", "24", at=9)          # the newest committed step

A worker writes ``<out>/rank<r>.json`` when it finishes; with ``--halt-at T``
it waits once step T is committed on every rank, writes ``<out>/halted<r>``
and sleeps, so that the test kills it at a known step, never after a sleep.

The workers' side of that protocol is here too, shared by ``fsdp_worker.py``
and ``zero_worker.py``: their common options (``worker_arguments``), the data
and schedule of the job, and the report (``Report``: the restored step and
its sources, per step losses, drift and writes, the halt, ``rank<r>.json``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from layercheck.storage.format import Version
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from layercheck.storage.location import open_store
from profiler.launch import rank_environment, torchrun

ROOT = Path(__file__).resolve().parents[2]


class Torchrun:
    """Launches ``worker`` on ``ranks`` local ranks (gloo, one thread each)."""

    def __init__(self, worker: Path, *, env: dict[str, str] | None = None, ranks: int = 2) -> None:
        self.worker, self.ranks = worker, ranks
        self.env = rank_environment(1, **(env or {}))

    def command(self, *args: str, ranks: int | None = None) -> list[str]:
        # --standalone (profiler.launch.torchrun): the rendezvous binds a port the
        # system gives it, so jobs of tests running at once never race for one
        return torchrun([str(self.worker), *args], ranks or self.ranks)

    def run(self, *args: str, timeout: float = 300, ranks: int | None = None,
            ok: bool = True) -> str:
        """Run the job to its end; its output. AssertionError unless it exits 0 (``ok``)
        or fails (not ``ok``)."""
        done = subprocess.run(self.command(*args, ranks=ranks), env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        assert (done.returncode == 0) == ok, failure(done)
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


def assert_ranks_fall_back_together(job: Torchrun, source: Path, work: Path, step: int) -> None:
    """Copy ``source`` (written by 2 ranks, newest step ``step``) to ``work``, flip a bit
    in rank 1's shard of the newest version of ``model.layers.1`` and resume with
    ``--check``: rank 0's shard of that version is intact, but it must not mix it
    with rank 1's older one: both ranks restore ``step`` with the older version,
    exactly, rank 1 says why, and they end with the same weights."""
    ckpt, out = work / "ckpt", work / "out"
    shutil.copytree(source, ckpt)
    _, older = damage_newest_shard(ckpt, "model.layers.1", rank=1)
    job.run("--dir", str(ckpt), "--out", str(out), "--steps", str(step + 2), "--check")
    rank0, rank1 = job.results(out)
    for r in (rank0, rank1):
        assert r["restored_step"] == step
        assert r["sources"]["model.layers.1"] == older.step
        assert r["problems"] == []
    assert any("checksum" in w for w in rank1["warnings"])
    assert rank0["params"] == rank1["params"]


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


def failure(done: subprocess.CompletedProcess) -> str:
    """What a failed command printed, for its assertion: the end of its stdout, and
    enough of its stderr to hold the failing rank's traceback, which torchrun prints
    before its own summary of a few thousand characters."""
    return done.stdout[-3000:] + done.stderr[-20000:]


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


# --- the workers' side -------------------------------------------------------------------

VOCAB = 128
"""The tiny Qwen2's vocabulary (tests.conftest.tiny_lm)."""


FROZEN = "model.layers.1.mlp."
"""The parameters a worker's ``--freeze`` freezes (requires_grad False: ZeRO puts them in
no sub-group)."""


def worker_arguments(steps: int) -> argparse.ArgumentParser:
    """The options every worker takes (``steps``: the default of ``--steps``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="the layercheck directory")
    ap.add_argument("--out", required=True, help="where each rank writes rank<r>.json")
    ap.add_argument("--steps", type=int, default=steps, help="the job's length (LR schedule)")
    ap.add_argument("--threshold", type=float, default=5e-3, help="K of every layer")
    ap.add_argument("--smax", type=int, default=6)
    ap.add_argument("--check", action="store_true",
                    help="compare the restored state with the shards the restore used")
    ap.add_argument("--stop-at", type=int, default=0, help="end after this step")
    ap.add_argument("--halt-at", type=int, default=0,
                    help="once this step is committed, write halted<r> and sleep")
    ap.add_argument("--check-drift", action="store_true",
                    help="record each whole layer's drift from gathered weight copies")
    ap.add_argument("--check-composite", default="",
                    help="after a load: compare with the composite of this layercheck directory")
    return ap


def batch(step: int, rank: int):
    """The batch of ``step`` on ``rank``: it depends on nothing else (not the global
    RNG), so runs that resume by different routes see the same data."""
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 16), generator=g)


def schedule(optimizer, steps: int, warm: int = 3):
    """Linear warm-up over ``warm`` steps, then linear decay to 5% at ``steps``."""
    import torch
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) * max(0.05, (steps - s) / steps))


def reference_drift(lc, before: dict, after: dict) -> list[float]:
    """d_l = mean|w(t) - w(t-1)| / mean|w(t)| per layer of ``lc.layer_map``, from
    whole weight copies keyed by the names of ``lc.model``'s parameters."""
    names = {id(p): n for n, p in lc.model.named_parameters()}
    out = []
    for i in range(len(lc.layer_map)):
        members = [names[id(p)] for _, p in lc.layer_map.parameters(i)]
        moved = sum(float((after[n] - before[n]).abs().sum()) for n in members)
        out.append(moved / sum(float(after[n].abs().sum()) for n in members))
    return out


def saved_shards(url: str, rank: int, names: list[str], sources: dict[str, Version]):
    """Per layer ``names[i]`` of the directory ``url``: (i, name, the version ``sources``
    names for it, this rank's tensors of it, every rank's tensors of it)."""
    from layercheck.recovery import parse_safetensors
    store = open_store(url)
    view = read_manifest(store, rank)
    for i, name in enumerate(names):
        version = next(v for v in view.versions[name] if v.step == sources[name].step)
        mine, _ = parse_safetensors(store.read(version.file), version.file)
        everyone = [parse_safetensors(store.read(s.file), s.file)[0] for s in version.shards]
        yield i, name, version, mine, everyone


def digest(tensor) -> str:
    """sha256 of a tensor's bytes: equal digests, bit-for-bit equal weights."""
    import torch
    data = tensor.detach().cpu().contiguous().view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


class Report:
    """What a rank reports in ``<out>/rank<r>.json``."""

    def __init__(self, out: str, rank: int) -> None:
        self.out, self.rank = Path(out), rank
        self.out.mkdir(parents=True, exist_ok=True)
        self.result: dict = {"rank": rank, "losses": {}}

    def restored(self, lc, start: int) -> None:
        """The step ``lc.restore()`` returned and, if any, the version each layer came
        from and the plan's warnings."""
        self.result["restored_step"] = start
        if start:
            self.result["sources"] = {n: v.step for n, v in lc.restored.plan.sources.items()}
            self.result["warnings"] = list(lc.restored.plan.warnings)

    def step(self, lc, step: int, loss: float, halt_at: int, dump=None) -> None:
        """After ``step``: its loss and, with a LayerCheck ``lc``, its checkpoint step
        (drift, written layers, fused-kernel and fused-step counts); at ``halt_at``, wait until the
        step is committed on every rank, write ``halted<r>`` and sleep until killed.
        ``dump``: at a step that writes layers, called on every rank (a collective
        may gather); where it returns whole tensors by parameter
        (``tests.layercheck.elastic``), those of the written layers are saved in
        ``gathered/<step>.pt``: what each version holds, whatever its layout."""
        if lc is not None:
            report = lc.step(extra={"step": step})
            self.result.setdefault("drift", []).append(report.drift.tolist())
            self.result.setdefault("written", []).append(report.decision.layers.tolist())
            self.result.setdefault("fused", []).append(lc.drift.fused_params)
            self.result.setdefault("in_step", []).append(lc.drift.step_params)
            if dump is not None and len(report.decision.layers):
                whole = dump()
                if whole is not None:
                    import torch
                    names = {n for i in report.decision.layers.tolist()
                             for n, _ in lc.layer_map.parameters(i)}
                    (self.out / "gathered").mkdir(exist_ok=True)
                    torch.save({n: t for n, t in whole.items() if n in names},
                               self.out / "gathered" / f"{step}.pt")
        self.result["losses"][step] = loss
        if lc is not None and step == halt_at:
            lc.flush()  # the failure strikes once step T is committed on every rank
            self.write()  # what it found so far (a restore's checks) outlives the kill
            (self.out / f"halted{self.rank}").write_text(str(step))
            while True:
                time.sleep(3600)

    def write(self) -> None:
        (self.out / f"rank{self.rank}.json").write_text(json.dumps(self.result))
