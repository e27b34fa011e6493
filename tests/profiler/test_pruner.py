"""The pruner deletes a layer's previous version only once a newer one is committed."""
from __future__ import annotations

from types import SimpleNamespace as Rec

from layercheck.manifest import layer_path
from profiler.pruner import Pruner


def _touch(root, name, step, size=10):
    path = root / layer_path(name, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_superseded_versions_go_newest_stay(tmp_path):
    a1, a5, b1 = _touch(tmp_path, "a", 1), _touch(tmp_path, "a", 5), _touch(tmp_path, "b", 1)
    pruner = Pruner(tmp_path)
    pruner.committed([Rec(name="a", step=1), Rec(name="b", step=1)])
    assert a1.exists() and b1.exists()
    pruner.committed([Rec(name="a", step=5)])
    assert not a1.exists() and a5.exists() and b1.exists()
    assert pruner.freed_bytes == 10
    pruner.committed([Rec(name="a", step=3)])  # an abandoned timeline's older record
    assert a5.exists()


def test_disabled_pruner_keeps_everything(tmp_path):
    a1, _ = _touch(tmp_path, "a", 1), _touch(tmp_path, "a", 2)
    pruner = Pruner(tmp_path, enabled=False)
    pruner.committed([Rec(name="a", step=1), Rec(name="a", step=2)])
    assert a1.exists()
