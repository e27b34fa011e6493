"""LayerCheck end to end on a real (tiny) Qwen2 model: save, crash, restore, resume."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.conftest import checkpointed_run, optimizer_for, tiny_lm, train_step


def _state(model, opt):
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    optim = {(names[id(p)], k): v.clone() for p, s in opt.state.items() for k, v in s.items()}
    return params, optim


def _assert_equal_states(a, b):
    pa, oa = a
    pb, ob = b
    assert pa.keys() == pb.keys() and oa.keys() == ob.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    for k in oa:
        assert torch.equal(oa[k], ob[k]), k


def test_threshold_zero_resume_is_bit_for_bit(tmp_path):
    n = 6
    torch.manual_seed(1)
    ref = tiny_lm(seed=0)
    opt, sched = optimizer_for(ref, total=2 * n)
    for _ in range(2 * n):
        train_step(ref, opt, sched)
    expected = _state(ref, opt)

    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=0)
    torch.manual_seed(1)
    model = tiny_lm(seed=0)
    opt, sched = optimizer_for(model, total=2 * n)
    lc = LayerCheck(model, opt, tmp_path / "ckpt", cfg, scheduler=sched)
    assert lc.restore() == 0
    for _ in range(n):
        train_step(model, opt, sched)
        lc.step()
    lc.close()  # "crash" after step n: the process state is thrown away below

    torch.manual_seed(123)  # a different RNG state and different weights
    model = tiny_lm(seed=7)
    opt, sched = optimizer_for(model, total=2 * n)
    with LayerCheck(model, opt, tmp_path / "ckpt", cfg, scheduler=sched) as lc:
        assert lc.restore() == n
        for _ in range(n):
            train_step(model, opt, sched)
            lc.step()
    _assert_equal_states(_state(model, opt), expected)


MIXED = LayerCheckConfig(base_threshold=2e-2, embedding_threshold=5e-2, warmup_steps=3, smax=9)
"""Layers of several ages after 25 steps (``_mixed_run``)."""


def _mixed_run(directory, total: int) -> None:
    """25 steps of the tiny model under ``MIXED`` into ``directory`` (of a ``total``-step schedule)."""
    torch.manual_seed(0)
    model = tiny_lm(seed=0)
    opt, sched = optimizer_for(model, lr=3e-3, total=total)
    with LayerCheck(model, opt, directory, MIXED, scheduler=sched) as lc:
        lc.restore()
        for _ in range(25):
            train_step(model, opt, sched)
            lc.step()


def test_mixed_staleness_restores_each_layer_exactly(tmp_path):
    cfg = MIXED
    _mixed_run(tmp_path / "c", total=40)
    store = LocalStore(tmp_path / "c")
    view = read_manifest(store)
    sources = {name: versions[-1] for name, versions in view.versions.items()}
    assert len({v.step for v in sources.values()}) > 1, "expected layers saved at different steps"

    model2 = tiny_lm(seed=5)
    opt2, sched2 = optimizer_for(model2, lr=3e-3, total=40)
    with LayerCheck(model2, opt2, tmp_path / "c", cfg, scheduler=sched2) as lc2:
        assert lc2.restore() == 25
    params = dict(model2.named_parameters())
    for name, version in sources.items():
        saved = load_file(tmp_path / "c" / version.file)
        for key, tensor in saved.items():
            kind, _, rest = key.partition("/")
            if kind == "param":
                assert torch.equal(params[rest], tensor), key
            elif kind == "optim":
                field, _, pname = rest.partition("/")
                assert torch.equal(opt2.state[params[pname]][field], tensor), key
    assert sched2.last_epoch == 25


def test_fresh_directory_restores_zero_and_warmup_writes_nothing(tmp_path):
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    with LayerCheck(model, opt, tmp_path / "c", LayerCheckConfig(warmup_steps=5)) as lc:
        assert lc.restore() == 0
        for _ in range(4):
            train_step(model, opt, sched)
            assert lc.step().decision.layers.size == 0
        train_step(model, opt, sched)
        assert lc.step().decision.is_full
    view = read_manifest(LocalStore(tmp_path / "c"))
    assert sorted(view.states) == [5]


def test_memory_store_round_trip():
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    cfg = LayerCheckConfig(warmup_steps=0, base_threshold=0, embedding_threshold=0)
    with LayerCheck(model, opt, "memory://lc-test-round-trip", cfg, scheduler=sched) as lc:
        lc.restore()
        for _ in range(3):
            train_step(model, opt, sched)
            lc.step(extra={"position": 3 * 4})
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    model2 = tiny_lm(seed=3)
    opt2, sched2 = optimizer_for(model2)
    with LayerCheck(model2, opt2, "memory://lc-test-round-trip", cfg, scheduler=sched2) as lc2:
        assert lc2.restore() == 3
        assert lc2.extra == {"position": 12}
    for n, p in model2.named_parameters():
        assert torch.equal(p, expected[n])


def test_step_without_restore_on_a_used_directory_is_refused(tmp_path):
    from layercheck.contract.errors import LayerCheckError
    cfg = LayerCheckConfig(warmup_steps=0)
    model = tiny_lm()
    opt, sched = optimizer_for(model)
    with LayerCheck(model, opt, tmp_path / "c", cfg, scheduler=sched) as lc:
        train_step(model, opt, sched)
        first = lc.step()  # empty directory: no restore() needed
        assert (first.drift > 0).all()  # and the first step's drift counts
    with LayerCheck(model, opt, tmp_path / "c", cfg, scheduler=sched) as lc:
        train_step(model, opt, sched)
        with pytest.raises(LayerCheckError, match="call restore"):
            lc.step()
    assert read_manifest(LocalStore(tmp_path / "c")).latest_step() == 1  # nothing abandoned


def test_restore_refuses_layer_versions_without_any_state(tmp_path):
    """Layer versions but no committed training state (one layer fails under 'warn'
    from the base checkpoint on, while later steps commit the others): restore() must
    not silently start over at step 0, which would abandon every version; it says
    what is there and what to do. So must a step() without restore()."""
    from layercheck.contract.errors import CheckpointNotFound
    from tests.layercheck.test_retention import versions_without_any_state
    root = tmp_path / "c"
    model, opt, sched, cfg = versions_without_any_state(root)
    before = (root / "manifest.jsonl").read_bytes()
    view = read_manifest(LocalStore(root))
    assert view.versions["model.layers.0"] and not view.states
    for start in ("restore", "step"):
        with LayerCheck(model, opt, root, cfg, scheduler=sched) as lc:
            with pytest.raises(CheckpointNotFound, match="no committed training state") as info:
                lc.restore() if start == "restore" else lc.step()
        assert "python -m layercheck inspect" in str(info.value)
    assert (root / "manifest.jsonl").read_bytes() == before  # no resume 0 appended


def test_a_write_budget_sizes_its_layers_at_the_base_and_after_a_restore(tmp_path):
    """The budget charges each layer's tensor bytes: taken from the base checkpoint's
    snapshots on a fresh run, from the loaded versions after a restore (whose step
    the account then starts at), so a resumed run stays in budget mode."""
    cfg = LayerCheckConfig(warmup_steps=2, smax=20, write_budget=1e5)
    lc, reports = checkpointed_run(tmp_path / "ckpt", cfg, 8)
    scales = [r.k_scale for r in reports]
    fresh = lc.policy.sizes.copy()
    expected = [sum(p.numel() * 4 * 3 + 4 for _, p in lc.layer_map.parameters(i))
                for i in range(len(lc.layer_map))]   # fp32 weight + two Adam moments + step
    np.testing.assert_array_equal(fresh, expected)
    assert scales[:3] == [1.0, 1.0, 1.0] and scales[-1] != 1.0   # moves after the base (step 2)
    model = tiny_lm(seed=0)
    opt, sched = optimizer_for(model, total=20)
    with LayerCheck(model, opt, tmp_path / "ckpt", cfg, scheduler=sched) as lc:
        assert lc.policy.sizes is None
        step = lc.restore()
        np.testing.assert_array_equal(lc.policy.sizes, fresh)
        assert lc.state.base_step == step and lc.state.level == 0
        train_step(model, opt, sched)
        assert lc.step().k_scale == 1.0
        train_step(model, opt, sched)
        lc.step()
        assert lc.state.spent >= 0 and lc.state.level != 0


def test_after_a_restore_the_library_writes_what_next_writes_follows_from_there(tmp_path):
    """The simulator prices a second recovery with ``layercheck.contract.resumed``: the
    real library restored at step 25 (layers of several ages) and trained on writes,
    step by step, the chain that table gives from 25 on the drift it measured."""
    from layercheck.contract.resumed import next_writes
    from layercheck.contract.policy import lr_ratio
    _mixed_run(tmp_path / "c", total=60)
    model = tiny_lm(seed=5)
    opt, sched = optimizer_for(model, lr=3e-3, total=60)
    reports = []
    with LayerCheck(model, opt, tmp_path / "c", MIXED, scheduler=sched) as lc:
        assert lc.restore() == 25
        assert (lc.state.last_written == 25).all() and not lc.state.accumulators.any()
        for _ in range(30):
            train_step(model, opt, sched)
            reports.append(lc.step())
        policy, peak = lc.policy, lc.lr_peak
    # the table over the 55 steps, the resumed run's own drift from step 26 on
    drift = np.zeros((55, policy.num_layers))
    ratio = np.ones(55)
    for r in reports:
        drift[r.step - 1], ratio[r.step - 1] = r.drift, lr_ratio(r.lr, peak)
    table = next_writes(policy, drift, ratio)
    for layer in range(policy.num_layers):
        written = [r.step for r in reports if layer in r.decision.layers]
        chain, s = [], 25
        while table[s, layer] <= 55:
            s = int(table[s, layer])
            chain.append(s)
        assert written == chain, layer
    assert sum(len(r.decision.layers) for r in reports) > policy.num_layers  # not only smax
