"""Automatic retention (keep_versions): what goes, what stays recoverable."""
from __future__ import annotations

import json

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.cli import main
from layercheck.format import Version
from layercheck.manifest import ManifestView, read_manifest
from layercheck.retention import Retention
from layercheck.store import LocalStore
from tests.conftest import optimizer_for, tiny_lm, train_step


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
    # a@3 is superseded; steps 3 and 4 used a@3, so their states go; step 1 keeps base
    assert [(v.layer, v.step) for v in dropped] == [("a", 3), (None, 1), (None, 3), (None, 4)]


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
    from layercheck.config import ConfigError
    with pytest.raises(ConfigError, match="keep_versions"):
        LayerCheckConfig(keep_versions=0)
