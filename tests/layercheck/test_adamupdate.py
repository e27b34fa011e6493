"""Adam's update recomputed (layercheck.drift.adamupdate): the terms against torch's own steps."""
from __future__ import annotations

import pytest
import torch

from layercheck.drift.adamupdate import NOT_STEPPED, AdamTerms, adam_terms


def _moved_by_terms(opt, w: torch.Tensor, step: int) -> float:
    group, state = opt.param_groups[0], opt.state[w]
    t = adam_terms(group, step, adamw=isinstance(opt, torch.optim.AdamW))
    q = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + t.eps_c) + t.alpha * w.detach()
    return t.moved(float(q.abs().sum()))


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1),
    lambda p: torch.optim.AdamW([p], lr=1e-2, weight_decay=0.0, betas=(0.8, 0.95)),
    lambda p: torch.optim.Adam([p], lr=1e-2, weight_decay=0.1),            # L2: in the gradient
    lambda p: torch.optim.Adam([p], lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
], ids=["adamw", "adamw-no-decay", "adam-l2", "adam-decoupled"])
def test_the_terms_give_what_each_step_moved(make):
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(512, generator=gen, dtype=torch.float64))
    opt = make(w)
    for step in range(1, 5):
        w.grad = torch.randn(512, generator=gen, dtype=torch.float64)
        before = w.detach().clone()
        opt.step()
        moved = float((w.detach() - before).abs().sum())
        assert _moved_by_terms(opt, w, step) == pytest.approx(moved, rel=1e-9)


def test_a_zero_learning_rate_and_an_unstepped_entry_move_nothing():
    group = {"lr": 0.0, "eps": 1e-8, "betas": (0.9, 0.999), "weight_decay": 0.01}
    terms = adam_terms(group, 1, adamw=True)
    assert terms.moved(123.0) == 0.0 and terms.alpha == 0.0
    assert NOT_STEPPED.moved(5.0) == 0.0 and (NOT_STEPPED.eps_c, NOT_STEPPED.alpha) == (0.0, 0.0)
    assert AdamTerms(0.0, 0.0, 2.0, 0.5).moved(3.0) == 12.0


def test_a_group_without_the_decoupled_flag_decays_as_its_optimizer_does():
    """torch before 2.x's Adam/AdamW merge: no ``decoupled_weight_decay`` key in the group;
    AdamW's decay is then decoupled (in the terms), Adam's folded into the gradient."""
    group = {"lr": 1e-2, "eps": 1e-8, "betas": (0.9, 0.999), "weight_decay": 0.1}
    adamw, adam = adam_terms(group, 3, adamw=True), adam_terms(group, 3, adamw=False)
    assert adamw.alpha == pytest.approx(1e-2 * 0.1 / adamw.scale) and adamw.shrink == 1 - 1e-3
    assert adam.alpha == 0.0 and adam.shrink == 1.0 and adam.scale == adamw.scale
