"""Update-path drift against a reference computed from weight copies."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from layercheck.drift import DriftTracker
from layercheck.layermap import LayerMap
from tests.conftest import tiny_lm


def _reference(before, model, layer_map):
    out = []
    params = dict(model.named_parameters())
    for layer in layer_map:
        moved = sum(float((params[n].detach().double() - before[n].double()).abs().sum()) for n in layer.params)
        size = sum(float(params[n].detach().double().abs().sum()) for n in layer.params)
        out.append(moved / size)
    return np.array(out)


@pytest.mark.parametrize("opt_cls,wd,amsgrad", [
    (torch.optim.AdamW, 0.0, False), (torch.optim.AdamW, 0.1, False),
    (torch.optim.AdamW, 0.1, True), (torch.optim.Adam, 0.05, False)])
def test_drift_matches_copy_reference(opt_cls, wd, amsgrad):
    # The reference differences fp32 weights, so it carries up to half an ulp of w
    # per element (6e-8 for a norm weight near 1). At lr 1e-2 that is < 1e-5 of an
    # update, so rtol 1e-5 tests our arithmetic rather than the reference's rounding.
    torch.manual_seed(0)
    model = tiny_lm(tied=False)
    layer_map = LayerMap.auto(model)
    opt = opt_cls(model.parameters(), lr=1e-2, weight_decay=wd, amsgrad=amsgrad)
    tracker = DriftTracker(opt, [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))])
    for step in range(4):
        ids = torch.randint(0, 128, (2, 10))
        model(input_ids=ids, labels=ids).loss.backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        drift, lr, _ = tracker.take()
        np.testing.assert_allclose(drift, _reference(before, model, layer_map), rtol=1e-5)
        assert lr == pytest.approx(1e-2)


def test_parameters_without_gradient_do_not_drift():
    torch.manual_seed(0)
    model = tiny_lm(tied=False, layers=2)
    layer_map = LayerMap.auto(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = DriftTracker(opt, [[p for _, p in layer_map.parameters(i)] for i in range(len(layer_map))])
    ids = torch.randint(0, 128, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    tracker.take()
    head = layer_map.index["lm_head"]
    for p in model.parameters():  # a second step where only the head has a gradient
        p.grad = None
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    opt.step()
    drift, _, _ = tracker.take()
    assert drift[head] > 0
    assert np.count_nonzero(drift) == 1


def test_other_optimizers_use_an_exact_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.warns(UserWarning, match="copy of the previous weights"):
        tracker = DriftTracker(opt, [list(model[0].parameters()), list(model[1].parameters())])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    drift, _, _ = tracker.take()
    ref0 = sum(float((p.detach() - before[f"0.{n}"]).abs().sum()) for n, p in model[0].named_parameters()) / \
        sum(float(p.detach().abs().sum()) for p in model[0].parameters())
    assert drift[0] == pytest.approx(ref0, rel=1e-6)


def test_sampled_drift_estimates_the_exact_value_on_large_tensors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    layers = [list(model[0].parameters()), list(model[2].parameters())]
    exact_opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    exact = DriftTracker(exact_opt, layers, sampling=1)
    sampled = DriftTracker(exact_opt, layers, sampling=16)
    for _ in range(3):
        x = torch.randn(32, 1024)
        model(x).pow(2).mean().backward()
        exact_opt.step()
        exact_opt.zero_grad()
        d_exact, _, _ = exact.take()
        d_sampled, _, _ = sampled.take()
        np.testing.assert_allclose(d_sampled, d_exact, rtol=0.02)
        assert not np.array_equal(d_sampled, d_exact)  # it really sampled
