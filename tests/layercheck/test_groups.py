"""Layer-aligned optimizer parameter groups."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from layercheck.groups import layer_aligned_param_groups  # noqa: E402
from layercheck.backends.layermap import LayerMap  # noqa: E402

from tests.conftest import tiny_lm  # noqa: E402


def test_two_groups_per_layer_cover_every_parameter_once():
    model = tiny_lm(layers=3)
    groups = layer_aligned_param_groups(model, weight_decay=0.1, lr=1e-3)
    layer_map = LayerMap.auto(model)
    layer_of = {id(p): layer_map.names[i] for i in range(len(layer_map))
                for _, p in layer_map.parameters(i)}
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    for g in groups:
        assert {layer_of[id(p)] for p in g["params"]} == {g["layercheck_layer"]}
        assert g["lr"] == 1e-3
    blocks = [g for g in groups if g["layercheck_layer"] == "model.layers.1"]
    assert [g["weight_decay"] for g in blocks] == [0.1, 0.0]
    # the usual policy: matrices decay, biases and norm weights do not
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and p.dim() == 2 for p in blocks[0]["params"])
    assert all(names[id(p)].endswith("bias") or p.dim() == 1 for p in blocks[1]["params"])


def test_a_custom_rule_and_torch_accepts_the_groups():
    model = tiny_lm(layers=2)
    groups = layer_aligned_param_groups(model, weight_decay=0.05,
                                        no_decay=lambda name, p: "norm" in name)
    opt = torch.optim.AdamW(groups, lr=1e-3)
    assert len(opt.param_groups) == len(groups)
    decayed_biases = [p for g in groups if g["weight_decay"] for p in g["params"] if p.dim() == 1]
    assert decayed_biases, "biases decay under a rule that exempts only norms"
    with pytest.raises(ValueError, match="weight_decay"):
        layer_aligned_param_groups(model, weight_decay=-1)
