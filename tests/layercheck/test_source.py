"""A plain module's layers: captured to host memory, applied back exactly."""
from __future__ import annotations

import pytest
import torch

from layercheck.errors import ModelMismatch
from layercheck.layermap import LayerMap
from layercheck.source import ModuleSource
from tests.conftest import optimizer_for, tiny_lm, train_step


def test_capture_then_apply_is_the_identity_on_weights_and_adam_state():
    torch.manual_seed(0)
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    train_step(model, opt, sched)
    source = ModuleSource(model, opt, LayerMap.auto(model))
    i = source.layer_map.index["model.layers.1"]
    saved = source.capture(i)
    assert {k.split("/")[0] for k in saved} == {"param", "optim"}
    train_step(model, opt, sched)  # the live layer moves on
    source.apply(i, saved)
    for name, p in source.layer_map.parameters(i):
        assert torch.equal(p, saved[f"param/{name}"])
        assert torch.equal(opt.state[p]["exp_avg"], saved[f"optim/exp_avg/{name}"])
        assert torch.equal(opt.state[p]["step"], saved[f"optim/step/{name}"])
    assert source.drift_layers()[i] == [p for _, p in source.layer_map.parameters(i)]


def test_a_version_of_another_model_is_refused_naming_layer_and_key():
    model = tiny_lm()
    opt, _ = optimizer_for(model)
    source = ModuleSource(model, opt, LayerMap.auto(model))
    i = source.layer_map.index["model.norm"]
    with pytest.raises(ModelMismatch, match="model.norm.*param/model.norm.weight"):
        source.apply(i, {})
    with pytest.raises(ModelMismatch, match="has shape \\(3,\\) in the checkpoint"):
        source.apply(i, {"param/model.norm.weight": torch.zeros(3)})
