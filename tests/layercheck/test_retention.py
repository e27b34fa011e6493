"""Automatic retention (keep_versions): what goes, what stays recoverable."""
from __future__ import annotations

import json
import math

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cli import main
from layercheck.storage.format import Version
from layercheck.storage.manifest import ManifestView, read_manifest
from layercheck.storage.retention import Retention
from layercheck.storage.localstore import LocalStore
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step
from tests.stores import HeldFull


def _v(layer, step, reason="threshold"):
    name = layer or "state"
    return Version(step=step, file=f"x/{name}@{step}", bytes=1, checksum="c",
                   layer=layer, reason=None if layer is None else reason)


def test_keeps_the_newest_and_the_base_and_drops_states_that_lost_a_version():
    r = Retention(1, ManifestView())
    assert r.committed([_v("a", 1, "base"), _v("b", 1, "base"), _v(None, 1)]) == []
    assert r.committed([_v("a", 3), _v(None, 3)]) == []
    assert r.committed([_v(None, 4)]) == []
    dropped = r.committed([_v("a", 5), _v(None, 5)])
    # a@3 is superseded; steps 3 and 4 used a@3, so their states go (first); step 1 keeps base
    assert [(v.layer, v.step) for v in dropped] == [(None, 1), (None, 3), (None, 4), ("a", 3)]


def test_keep_must_be_positive():
    with pytest.raises(ValueError, match="at least"):
        Retention(0, ManifestView())


def _train(path, keep, steps=24):
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, lr=3e-3, total=40)
    cfg = LayerCheckConfig(base_threshold=2e-2, embedding_threshold=5e-2, warmup_steps=3,
                           smax=9, keep_versions=keep)
    with LayerCheck(model, opt, path, cfg, scheduler=sched) as lc:
        lc.restore()
        for _ in range(steps):
            train_step(model, opt, sched)
            lc.step()
    return read_manifest(LocalStore(path))


def test_retention_keeps_the_newest_plan_and_deletes_the_rest(tmp_path, capsys):
    full, kept = _train(tmp_path / "full", None), _train(tmp_path / "kept", 1)
    assert main(["plan", str(tmp_path / "full"), "--json"]) == 0
    plan_full = json.loads(capsys.readouterr().out)
    assert main(["plan", str(tmp_path / "kept"), "--json"]) == 0
    plan_kept = json.loads(capsys.readouterr().out)
    assert plan_kept["step"] == plan_full["step"] == 24
    assert [l["source_step"] for l in plan_kept["layers"]] == \
        [l["source_step"] for l in plan_full["layers"]]
    for name, versions in kept.versions.items():
        assert len([v for v in versions if v.reason != "base"]) <= 1, name
    on_disk = {p.relative_to(tmp_path / "kept").as_posix()
               for p in (tmp_path / "kept").rglob("*.safetensors")}
    assert on_disk == {v.file for v in kept.all_versions()}  # deleted what it dropped, only that
    assert len(on_disk) < len(list((tmp_path / "full").rglob("*.safetensors")))
    assert main(["inspect", str(tmp_path / "kept"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []
    oldest = min(kept.states)
    assert main(["plan", str(tmp_path / "kept"), "--step", str(oldest - 1)]) == 2
    assert "no recoverable step" in capsys.readouterr().err


def test_config_rejects_zero_keep():
    from layercheck.contract.config import ConfigError
    with pytest.raises(ConfigError, match="keep_versions"):
        LayerCheckConfig(keep_versions=0)


# -- retention never costs the newest recoverable step (issue 13, item 1) ------------------
EVERY = dict(base_threshold=0, embedding_threshold=0, warmup_steps=2)


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _one_layer_from(layer: str, from_step: int):
    """For ``HeldFull``: no room for ``layer`` from step ``from_step`` on (every write of
    it fails; the first holds the writer thread, so that the steps training queues
    meanwhile go without that layer, as when a failure is noticed late)."""
    prefix = f"layers/{layer}@"
    return lambda path: path.startswith(prefix) and int(path[len(prefix):].split(".")[0]) >= from_step


def versions_without_any_state(root):
    """A checkpoint at ``root`` holding layer versions but no committed training state:
    ``model.layers.1`` has no room from the base checkpoint (step 2) on, under 'warn',
    while steps 3 and 4 commit the others. Returns (model, optimizer, scheduler,
    config) of the run, for a second run on the same directory."""
    store = HeldFull(root, _one_layer_from("model.layers.1", 2))
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                           thresholds={"model.layers.1": math.inf}, on_error="warn")
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    with LayerCheck(model, opt, store, cfg, scheduler=sched) as lc:
        lc.restore()
        try:
            for _ in range(4):  # the base (2) fails late; 3 and 4 go without the layer
                train_step(model, opt, sched)
                lc.step()
            assert store.reached.wait(120)
        finally:
            store.release()
    return model, opt, sched, cfg


def test_a_layer_that_keeps_failing_under_warn_never_costs_the_newest_recoverable_step(tmp_path):
    """keep_versions=1, on_error='warn', no room for one block from step 8 on. Its write
    at step 10 fails while steps 11 and 12 are queued without it: they commit their
    other layers and hold their states back (a committed step needs every layer).
    Retention must not retire step 9, nor a version step 9 uses: no newer state has
    committed, and none ever will while the disk stays full for that layer."""
    root = tmp_path / "c"
    store = HeldFull(root, _one_layer_from("model.layers.1", 8))
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model, total=40)
    # every layer at every step, but model.layers.1 only when smax forces it (6, 10, 14)
    cfg = LayerCheckConfig(**EVERY, smax=4, thresholds={"model.layers.1": math.inf},
                           keep_versions=1, on_error="warn")
    lc = LayerCheck(model, opt, store, cfg, scheduler=sched)
    lc.restore()
    after = {}
    for _ in range(9):
        train_step(model, opt, sched)
        after[lc.step().step] = _params(model)
    lc.flush()
    try:
        for _ in range(3):  # 10 (held, then fails), 11 and 12 (queued without the layer)
            train_step(model, opt, sched)
            lc.step()
        assert store.reached.wait(120)
    finally:
        store.release()
    for _ in range(4):  # 13..16: the retries fail too
        train_step(model, opt, sched)
        lc.step()
    lc.close()
    view = read_manifest(LocalStore(root))
    assert sorted(view.states) == [9]
    assert (root / view.states[9].file).exists()
    assert view.versions["model.layers.0"][-1].step > 9  # later layers did commit
    again = tiny_lm(seed=3)
    opt2, sched2 = optimizer_for(again, total=40)
    with LayerCheck(again, opt2, root, cfg, scheduler=sched2) as lc2:
        assert lc2.restore() == 9
    for name, value in _params(again).items():  # model.layers.1 as forced at step 6
        assert torch.equal(value, after[6 if "layers.1." in name else 9][name]), name


def test_retention_retires_nothing_until_a_newer_state_commits():
    """The rule itself: layer versions beyond the newest committed state do not count
    towards keep; what they supersede stays until their state commits."""
    r = Retention(1, ManifestView())
    assert r.committed([_v("a", 1, "base"), _v(None, 1)]) == []
    assert r.committed([_v("a", 2), _v(None, 2)]) == []
    assert r.committed([_v("a", 3)]) == []  # step 3's state held back
    assert r.committed([_v("a", 4)]) == []  # and step 4's
    dropped = r.committed([_v("a", 5), _v(None, 5)])
    # states first: a reader that sees part of this append never sees a state whose
    # layer version is already gone
    assert [(v.layer, v.step) for v in dropped] == [(None, 1), (None, 2), ("a", 2), ("a", 3),
                                                    ("a", 4)]


# -- retention never deletes the intact version a restore fell back to (issue 27, item 1) --
def _view(*versions):
    view = ManifestView()
    for version in versions:
        if version.layer is None:
            view.states[version.step] = version
        else:
            view.versions.setdefault(version.layer, []).append(version)
    return view


def test_a_version_the_restore_passed_over_is_neither_counted_nor_dropped():
    """The rule itself. A restore to step 6 stood on a@5 (a@6 was damaged): a@6 does not
    count as the kept version, so step 7 (without a) drops nothing; a@5 goes only once
    a newer version (8) commits, with every state that could have used it; a@6 is never
    retention's to delete (as gc: what failed verification stays, to be reported)."""
    a1, a5, a6 = _v("a", 1, "base"), _v("a", 5), _v("a", 6)
    view = _view(a1, a5, a6, _v(None, 5), _v(None, 6))
    r = Retention(1, view, standing={"a": a5})
    assert r.committed([_v(None, 7)]) == []
    dropped = r.committed([_v("a", 8), _v(None, 8)])
    assert [(v.layer, v.step) for v in dropped] == [(None, 5), (None, 6), (None, 7), ("a", 5)]
    assert r.committed([_v("a", 9), _v(None, 9)]) == [_v(None, 8), _v("a", 8)]


def test_without_a_restore_every_live_version_counts_as_before():
    a5, a6 = _v("a", 5), _v("a", 6)
    r = Retention(1, _view(a5, a6, _v(None, 5), _v(None, 6)))
    assert r.committed([_v(None, 7)]) == [_v(None, 5), a5]


KILLED_BETWEEN_COMMIT_AND_DROPS = r"""
import os, signal, sys
import torch
from layercheck import LayerCheck, LayerCheckConfig
from layercheck.storage import retention
from tests.conftest import every_layer_checkpoint, optimizer_for, tiny_lm, train_step
committed = retention.Retention.committed
def kill_before_the_drop_records(self, versions):
    if any(v.layer is None and v.step == 6 for v in versions):
        os.kill(os.getpid(), signal.SIGKILL)  # step 6 is committed, its drops not yet
    return committed(self, versions)
retention.Retention.committed = kill_before_the_drop_records
torch.manual_seed(0)
model = tiny_lm()
opt, sched = optimizer_for(model, total=40)
config = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=2,
                          keep_versions=1)
lc = LayerCheck(model, opt, sys.argv[1], config, scheduler=sched)
lc.restore()
for _ in range(8):
    train_step(model, opt, sched)
    lc.step()
    lc.flush()
"""


@pytest.mark.slow
def test_retention_never_deletes_the_intact_version_a_restore_fell_back_to(tmp_path):
    """keep_versions=1; a real SIGKILL between step 6's commit and its drop records
    leaves model.layers.1 with live versions 2 (base), 5 and 6; version 6's file is
    then damaged. restore() falls back to 5 for that layer; step 7 (which does not
    write it) must not retire 5 as superseded by the damaged 6: step 7 restores it
    from 5, not from the base."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from layercheck.recovery import make_plan
    root, layer = tmp_path / "c", "model.layers.1"
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_COMMIT_AND_DROPS, str(root)],
                           capture_output=True, text=True, timeout=300, cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"})
    assert child.returncode == -9, child.stderr[-3000:]
    store = LocalStore(root)
    view = read_manifest(store)
    assert [v.step for v in view.versions[layer]] == [2, 5, 6] and view.latest_step() == 6
    damaged = root / view.versions[layer][-1].file
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    intact = root / view.versions[layer][1].file
    model = tiny_lm(seed=1)
    opt, sched = optimizer_for(model, total=40)
    cfg = LayerCheckConfig(**EVERY, thresholds={layer: math.inf}, keep_versions=1)
    with LayerCheck(model, opt, root, cfg, scheduler=sched) as lc:
        with pytest.warns(UserWarning, match="skipping the version of step 6"):
            assert lc.restore() == 6
        assert lc.restored.plan.sources[layer].step == 5
        train_step(model, opt, sched)
        lc.step()  # step 7 writes every layer but model.layers.1
    assert intact.exists()
    view = read_manifest(store)
    assert view.latest_step() == 7 and [v.step for v in view.versions[layer]] == [2, 5, 6]
    plan = make_plan(store, view)
    assert plan.step == 7 and plan.sources[layer].step == 5
    assert damaged.exists()  # retention never deletes what it could not verify


# -- retention deletes only the files the format names for a version ------------------------
SECOND_WRITER = """
import sys
from layercheck.contract.errors import DirectoryLocked
from layercheck.storage.localstore import LocalStore
try:
    LocalStore(sys.argv[1]).lock()
except DirectoryLocked:
    print("refused")
else:
    print("accepted")
"""


def _rename_in_records(root, renames):
    """The manifest of ``root`` with the file of the version (layer, step) of each key of
    ``renames`` rewritten to its value, each line's CRC recomputed: records that pass
    every check of their own but name a file that is not theirs."""
    from layercheck.storage.format import MANIFEST, encode_record
    records = [json.loads(line)["r"] for line in (root / MANIFEST).read_bytes().splitlines()]
    for record in records:
        file = renames.get((record.get("layer"), record.get("step")))
        if record["kind"] == "layer" and file is not None:
            record["file"] = file
    (root / MANIFEST).write_bytes(b"".join(encode_record(r) for r in records))


def test_retention_never_deletes_a_file_a_record_names_that_is_not_its_own(tmp_path):
    """Old versions of three layers whose records (valid CRCs) name notes.txt at the root,
    the manifest and the .lock, and one naming another layer's live version: with
    keep_versions=1 retention deleted each of them (the manifest was recreated without
    its header, a second writer was accepted beside the running job, and the newest
    step fell back to model.norm's base). A record may name only its own file: these
    are skipped as damaged, and retention deletes only paths it derives itself."""
    import subprocess
    import sys
    from pathlib import Path
    from layercheck.storage.format import MANIFEST, layer_path
    from layercheck.recovery import make_plan
    root = tmp_path / "c"
    every_layer_checkpoint(root, steps=4)  # every layer at 2 (base), 3 and 4
    (root / "notes.txt").write_text("the user's own notes\n")
    norm = layer_path("model.norm", 4)  # model.norm's newest: live, as run B never writes it
    _rename_in_records(root, {("model.layers.0", 3): "notes.txt",
                              ("model.layers.1", 3): MANIFEST,
                              ("model.layers.2", 3): ".lock",
                              ("model.embed_tokens", 3): norm})
    model = tiny_lm(seed=1)
    opt, sched = optimizer_for(model, total=40)
    cfg = LayerCheckConfig(**EVERY, thresholds={"model.norm": math.inf}, keep_versions=1)
    with LayerCheck(model, opt, root, cfg, scheduler=sched) as lc:
        assert lc.restore() == 4
        for _ in range(2):  # 5 and 6: every layer but model.norm; versions 3 and 4 retire
            train_step(model, opt, sched)
            lc.step()
        lc.flush()
        repo = Path(__file__).resolve().parents[2]
        second = subprocess.run([sys.executable, "-c", SECOND_WRITER, str(root)], cwd=repo,
                                capture_output=True, text=True, timeout=60,
                                env={**__import__("os").environ, "PYTHONPATH": str(repo)})
        assert second.stdout.strip() == "refused", second.stdout + second.stderr
        assert (root / ".lock").exists()
    assert (root / "notes.txt").read_text() == "the user's own notes\n"
    view = read_manifest(LocalStore(root))
    assert view.header is not None and sorted(view.states) == [6]  # 4 and 5: superseded
    assert len([p for p in view.problems if "names the file" in p]) == 4, view.problems
    plan = make_plan(LocalStore(root), view)
    assert plan.step == 6 and plan.sources["model.norm"].step == 4 and not plan.passed_over
    assert (root / norm).exists()
