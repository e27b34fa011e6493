"""A plain module's layers: captured to host memory, applied back exactly."""
from __future__ import annotations

import pytest
import torch

from layercheck.contract.errors import ModelMismatch
from layercheck.backends.layermap import LayerMap
from layercheck.backends.source import ModuleSource
from tests.conftest import checkpointed_run, optimizer_for, tiny_lm, train_step


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


def test_another_dtype_is_refused_before_anything_is_copied(tmp_path):
    """An fp32 checkpoint restored into a bf16 model was cast silently, its fp32 Adam
    moments left beside bf16 weights, and the first opt.step() failed obscurely. The
    header's bytes per layer refuse it when LayerCheck opens the directory; a header
    without them (an older directory) still refuses it, tensor by tensor, before the
    first byte is copied."""
    from layercheck import LayerCheck, LayerCheckConfig
    from layercheck.storage.format import MANIFEST, decode_line, encode_record
    cfg = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1)
    checkpointed_run(tmp_path / "c", cfg, 2)
    half = tiny_lm(seed=3).to(torch.bfloat16)
    hopt, hsched = optimizer_for(half)
    with pytest.raises(ModelMismatch, match="dtype"):
        LayerCheck(half, hopt, tmp_path / "c", cfg, scheduler=hsched)
    lines = (tmp_path / "c" / MANIFEST).read_bytes().splitlines(keepends=True)
    header = decode_line(lines[0])
    for layer in header["layers"]:
        del layer["weight_bytes"]
    (tmp_path / "c" / MANIFEST).write_bytes(encode_record(header) + b"".join(lines[1:]))
    before = {n: p.detach().clone() for n, p in half.named_parameters()}
    with LayerCheck(half, hopt, tmp_path / "c", cfg, scheduler=hsched) as lc:
        with pytest.raises(ModelMismatch, match="dtype"):
            lc.restore()
    for name, p in half.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, before[name]), name


# -- moments read apart become a fresh optimizer's state as they are (issue 14) -------------
def test_apply_keeps_moments_read_apart_for_a_fresh_optimizer_and_copies_all_else():
    """``kept_apart`` asks for the optimizer state of parameters that have none; apply
    keeps exactly those tensors (``Loaded.own``) as they are, copies the weights into
    the model's storage, copies into live state where there is some, and copies
    what it was not told it owns."""
    from layercheck.recovery import Loaded
    twin = tiny_lm()
    twin_opt, twin_sched = optimizer_for(twin)
    train_step(twin, twin_opt, twin_sched)
    saved_by = ModuleSource(twin, twin_opt, LayerMap.auto(twin))
    model = tiny_lm(seed=1)
    opt, _ = optimizer_for(model)
    source = ModuleSource(model, opt, LayerMap.auto(model))
    i, j = source.layer_map.index["model.layers.1"], source.layer_map.index["model.layers.2"]
    accept = source.kept_apart()
    for name, _ in source.layer_map.parameters(i):
        assert accept(f"optim/exp_avg/{name}") and accept(f"optim/step/{name}")
        assert not accept(f"param/{name}")
    saved = Loaded(saved_by.capture(i))
    saved.own = frozenset(key for key in saved if accept(key))
    plain = saved_by.capture(j)  # a plain mapping: it owns nothing
    source.apply(i, saved)
    source.apply(j, plain)
    for name, p in source.layer_map.parameters(i):
        assert torch.equal(p, saved[f"param/{name}"])
        assert p.data_ptr() != saved[f"param/{name}"].data_ptr()
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert opt.state[p][field] is saved[f"optim/{field}/{name}"]
    for name, p in source.layer_map.parameters(j):
        assert torch.equal(opt.state[p]["exp_avg"], plain[f"optim/exp_avg/{name}"])
        assert opt.state[p]["exp_avg"].data_ptr() != plain[f"optim/exp_avg/{name}"].data_ptr()
    live = {name: opt.state[p]["exp_avg"] for name, p in source.layer_map.parameters(i)}
    again = Loaded(saved_by.capture(i))
    again.own = saved.own
    source.apply(i, again)  # state is live now: copied into it, its tensors stay the same
    for name, p in source.layer_map.parameters(i):
        assert opt.state[p]["exp_avg"] is live[name]
        assert torch.equal(live[name], again[f"optim/exp_avg/{name}"])
    fresh_elsewhere = {n for k in range(len(source.layer_map)) if k not in (i, j)
                       for n, _ in source.layer_map.parameters(k)}
    accept = source.kept_apart()
    assert all(accept(f"optim/exp_avg/{n}") for n in fresh_elsewhere)
    assert not any(accept(f"optim/exp_avg/{n}") for n, _ in source.layer_map.parameters(i))
