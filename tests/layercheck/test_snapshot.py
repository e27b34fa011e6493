"""A step's training state: optimizer hyper-parameters go back to their own groups."""
from __future__ import annotations

import pytest
import torch

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.contract.errors import ModelMismatch
from tests.conftest import tiny_lm, train_step

EVERY = dict(base_threshold=0, embedding_threshold=0, warmup_steps=1)


def _groups(model, *, order: str, split: str = "bias"):
    """AdamW with two groups, decayed weights (lr 1e-3, wd 0.1) and undecayed ``split``
    parameters (lr 3e-3, wd 0), listed in ``order``."""
    named = list(model.named_parameters())
    plain = [p for n, p in named if n.endswith(split) or p.dim() < 2]
    decayed = [p for n, p in named if not (n.endswith(split) or p.dim() < 2)]
    groups = {"decay": {"params": decayed, "lr": 1e-3, "weight_decay": 0.1},
              "plain": {"params": plain, "lr": 3e-3, "weight_decay": 0.0}}
    return torch.optim.AdamW([groups[g] for g in order.split(",")])


def _train(path, steps: int = 3):
    torch.manual_seed(0)
    model = tiny_lm()
    opt = _groups(model, order="decay,plain")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    with LayerCheck(model, opt, path, LayerCheckConfig(**EVERY), scheduler=sched) as lc:
        lc.restore()
        for _ in range(steps):
            train_step(model, opt, sched)
            lc.step()
    return [dict(lr=g["lr"], weight_decay=g["weight_decay"]) for g in opt.param_groups]


@pytest.mark.parametrize("order,split", [("plain,decay", "bias"),
                                         ("decay,plain", "q_proj.weight")],
                         ids=["reordered", "regrouped"])
def test_groups_that_hold_other_parameters_are_refused_before_anything_changes(tmp_path, order,
                                                                              split):
    """The saved group settings were copied by position: resumed with the undecayed
    group listed first, the biases got the weights' decay and learning rate (torch's own
    load_state_dict refuses that). Every committed step records which parameters each
    group holds; a group that holds others (reordered, or split another way) is refused,
    with the fix, before the model changes. (Matching them instead would also have to
    reorder the LR scheduler's per-group state, which torch keeps by position.)"""
    _train(tmp_path / "c")
    model = tiny_lm(seed=5)
    opt = _groups(model, order=order, split=split)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with LayerCheck(model, opt, tmp_path / "c", LayerCheckConfig(**EVERY)) as lc:
        with pytest.raises(ModelMismatch, match="parameter group 0") as info:
            lc.restore()
    assert "as before" in str(info.value)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert not opt.state


def test_the_same_groups_get_their_hyperparameters_back(tmp_path):
    saved = _train(tmp_path / "c")
    model = tiny_lm(seed=5)
    opt = _groups(model, order="decay,plain")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    with LayerCheck(model, opt, tmp_path / "c", LayerCheckConfig(**EVERY), scheduler=sched) as lc:
        assert lc.restore() == 3
    assert [dict(lr=g["lr"], weight_decay=g["weight_decay"]) for g in opt.param_groups] == saved
