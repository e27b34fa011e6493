"""PEFT LoRA end to end (issue 29): only the adapter is written after the base
checkpoint, a restore continues bit for bit, drift is the effective weight's,
and both exports (merged model, adapter alone) load where they should.

Real PEFT (r=4 on the attention projections) on a tiny Qwen2 built from a
config; nothing from a hub. Needs the ``lora`` extra (peft).
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.cli import main
from layercheck.tools.export import export
from layercheck.tools.inspection import format_inspection, inspect_directory
from layercheck.storage.manifest import read_manifest
from layercheck.storage.localstore import LocalStore
from tests.conftest import tiny_lm, train_step
from tests.layercheck.test_checkpoint import _assert_equal_states, _state

peft = pytest.importorskip("peft")

EVERY_STEP = LayerCheckConfig(base_threshold=0, embedding_threshold=0, warmup_steps=1)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lora_lm(seed: int = 0):
    """The tiny Qwen2 (base weights from ``seed``) with a fresh LoRA adapter, AdamW on
    the adapter's parameters, a constant schedule."""
    model = peft.get_peft_model(tiny_lm(seed=seed, layers=2),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=PROJECTIONS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def run(directory, steps, built=None, *, restore=0, config=EVERY_STEP):
    model, opt, sched = built or lora_lm()
    reports = []
    with LayerCheck(model, opt, directory, config, scheduler=sched) as lc:
        assert lc.restore() == restore
        for _ in range(steps):
            train_step(model, opt, sched)
            reports.append(lc.step())
    return model, opt, reports


def test_after_the_base_a_lora_version_holds_the_adapter_and_its_adam_state_only(tmp_path):
    root = tmp_path / "c"
    model, opt, _ = run(root, 3)
    view = read_manifest(LocalStore(root))
    full, *partial = view.versions["base_model.model.model.layers.0"]
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad and ".layers.0." in n}
    assert len(lora) == 8 and all(".lora_" in n for n in lora)
    adam = sum(3 * p.numel() * 4 + 4 for p in lora.values())  # w, exp_avg, exp_avg_sq; step
    for version in partial:
        assert version.base == full.step == 1
        with safe_open(root / version.file, "pt") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
        assert {k.split("/")[-1] for k in saved} == set(lora)
        assert sum(t.numel() * t.element_size() for t in saved.values()) == adam
    assert partial[-1].bytes < full.bytes / 3  # the rest: the header's 32 tensor entries
    header = view.header["lora"]
    assert header["adapter"] == "default" and len(header["modules"]) == 8
    assert header["modules"]["base_model.model.model.layers.0.self_attn.q_proj"] == {
        "scaling": 2.0, "fan_in_fan_out": False}
    assert json.loads((root / "adapter_config.json").read_text())["r"] == 4


def test_a_restored_lora_run_continues_bit_for_bit(tmp_path):
    torch.manual_seed(1)
    ref_model, ref_opt, _ = run(tmp_path / "ref", 6)
    torch.manual_seed(1)
    run(tmp_path / "c", 3)
    torch.manual_seed(42)  # other RNG, other base weights, another adapter init
    model, opt, _ = run(tmp_path / "c", 3, lora_lm(seed=9), restore=3)
    _assert_equal_states(_state(model, opt), _state(ref_model, ref_opt))  # frozen ones too


def test_drift_of_an_adapter_layer_is_the_effective_weights(tmp_path):
    """d_l = sum |s(B_t A_t - B_{t-1} A_{t-1})| over the layer's LoRA modules (nothing
    else in it trains), over the sum of |w| of its effective weights: W + s B_t A_t
    of each module and every other parameter of the layer as it is (frozen: the MLP,
    the norms, the biases). A layer with nothing training drifts 0."""
    model, opt, sched = lora_lm()
    layer = model.base_model.model.model.layers[1]
    mods = [getattr(layer.self_attn, name) for name in PROJECTIONS]
    others = [p for n, p in layer.named_parameters()
              if ".lora_" not in n and not n.endswith(".base_layer.weight")]
    assert len(others) == 8  # q, k, v biases; gate, up, down; two norms
    with LayerCheck(model, opt, tmp_path / "c", EVERY_STEP, scheduler=sched) as lc:
        lc.restore()
        index = lc.layer_map.index["base_model.model.model.layers.1"]
        for _ in range(3):
            before = [m.get_delta_weight("default").clone() for m in mods]
            train_step(model, opt, sched)
            report = lc.step()
            after = [m.get_delta_weight("default") for m in mods]
            moved = sum(float((a - b).abs().sum()) for a, b in zip(after, before))
            size = sum(float((m.base_layer.weight + a).abs().sum()) for m, a in zip(mods, after))
            size += sum(float(p.abs().sum()) for p in others)
            assert report.drift[index] == pytest.approx(moved / size, rel=1e-5)
            assert report.drift[lc.layer_map.index["base_model.model.model.norm"]] == 0.0
    assert moved > 0


def test_export_merges_the_adapter_into_the_model(tmp_path):
    from transformers import Qwen2ForCausalLM
    model, _, _ = run(tmp_path / "c", 3)
    export(LocalStore(tmp_path / "c"), tmp_path / "merged")
    merged = model.merge_and_unload()
    loaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "merged")
    expected = merged.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    ids = torch.randint(0, 128, (2, 8))
    assert torch.equal(loaded(input_ids=ids).logits, merged(input_ids=ids).logits)


def test_a_lora_bias_is_merged_as_peft_merges_it(tmp_path):
    """lora_bias=True: B carries a bias, which the merged model adds, scaled, to the
    layer's own (q, k and v have one in Qwen2)."""
    model = peft.get_peft_model(tiny_lm(seed=0, layers=2), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=PROJECTIONS[:3], lora_bias=True))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    run(tmp_path / "c", 2, (model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)))
    export(LocalStore(tmp_path / "c"), tmp_path / "merged")
    from safetensors.torch import load_file
    merged, expected = load_file(tmp_path / "merged" / "model.safetensors"), \
        model.merge_and_unload().state_dict()
    assert sorted(merged) == sorted(k for k in expected if k != "lm_head.weight")  # tied
    assert all(torch.equal(merged[k], expected[k]) for k in merged)


def test_export_of_the_adapter_alone_loads_with_peft(tmp_path, capsys):
    model, _, _ = run(tmp_path / "c", 3)
    assert main(["export", str(tmp_path / "c"), "--adapter", "--out",
                 str(tmp_path / "adapter")]) == 0
    assert "the adapter alone" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "layercheck_plan.json"]
    loaded = peft.PeftModel.from_pretrained(tiny_lm(seed=0, layers=2), tmp_path / "adapter")
    trained = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    mine = dict(loaded.named_parameters())
    for name, p in trained.items():
        assert torch.equal(mine[name], p), name
    ids = torch.randint(0, 128, (2, 8))
    model.eval()
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_adapter_export_of_a_full_fine_tuning_directory_says_what_to_do(tmp_path, capsys):
    from tests.conftest import checkpointed_run
    checkpointed_run(tmp_path / "c", EVERY_STEP, 2)
    assert main(["export", str(tmp_path / "c"), "--adapter", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not written from a PEFT LoRA model" in err and "without --adapter" in err
    assert not (tmp_path / "o").exists()


def test_inspect_and_plan_show_where_the_frozen_parameters_are(tmp_path, capsys):
    run(tmp_path / "c", 3)
    info = inspect_directory(LocalStore(tmp_path / "c"))
    block = next(l for l in info["layers"] if l["name"].endswith("layers.0"))
    assert (block["partial_versions"], block["frozen_params"], block["frozen_from_step"]) == (
        2, 12, 1)
    assert info["problems"] == []
    assert "12@1" in format_inspection(info)
    assert main(["plan", str(tmp_path / "c"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layers"]
    assert {r["frozen_from_step"] for r in rows} == {1}


def test_a_dora_run_is_checkpointed_and_restored_but_not_merged(tmp_path, capsys):
    """DoRA is not W + s·B·A: layercheck writes and restores it like any model (only what
    trains), and export says it cannot merge it and what to do instead."""
    def dora(seed):
        model = peft.get_peft_model(tiny_lm(seed=seed, layers=2), peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=PROJECTIONS, use_dora=True))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model, _, _ = run(tmp_path / "c", 3, dora(0))
    restored, _, _ = run(tmp_path / "c", 0, dora(5), restore=3)
    for (name, p), q in zip(model.named_parameters(), restored.parameters()):
        assert torch.equal(p, q), name
    assert read_manifest(LocalStore(tmp_path / "c")).versions[
        "base_model.model.model.layers.0"][-1].base == 1
    assert main(["export", str(tmp_path / "c"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "DoRA" in err and "merge_and_unload" in err


def test_frozen_weights_of_a_pretrained_model_are_recorded_by_reference(tmp_path):
    """pretrained=: the base checkpoint writes the adapter only; the frozen weights are
    named by file, key and checksum, read back and verified at restore (and export),
    and a pretrained file that changed is refused; inspect says what changed."""
    from safetensors.torch import save_file

    from layercheck.contract.errors import CheckpointNotFound
    base = tiny_lm(seed=0, layers=2)
    base.save_pretrained(tmp_path / "pretrained")
    root = tmp_path / "c"
    model, opt, sched = lora_lm(seed=0)
    with LayerCheck(model, opt, root, EVERY_STEP, scheduler=sched,
                    pretrained=tmp_path / "pretrained") as lc:
        lc.restore()
        for _ in range(2):
            train_step(model, opt, sched)
            lc.step()
    view = read_manifest(LocalStore(root))
    full = view.versions["base_model.model.model.layers.0"][0]
    assert full.base is None and {r[0] for r in full.refs} == set(full.frozen)
    assert full.bytes < 20_000  # the adapter and its moments: no frozen weight written
    assert view.versions["base_model.model.model.embed_tokens"][0].bytes < 200
    other, opt2, sched2 = lora_lm(seed=9)  # other base weights: the restore brings them back
    with LayerCheck(other, opt2, root, EVERY_STEP, scheduler=sched2) as lc:
        assert lc.restore() == 2
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(p, q), name
    export(LocalStore(root), tmp_path / "merged")  # the merged model reads them too
    merged = model.merge_and_unload().state_dict()
    from transformers import Qwen2ForCausalLM
    for name, tensor in Qwen2ForCausalLM.from_pretrained(tmp_path / "merged").state_dict().items():
        assert torch.equal(tensor, merged[name]), name
    changed = {k: v + 1 for k, v in base.state_dict().items() if "lm_head" not in k}
    save_file(changed, tmp_path / "pretrained" / "model.safetensors")
    other, opt2, sched2 = lora_lm(seed=9)
    with LayerCheck(other, opt2, root, EVERY_STEP, scheduler=sched2) as lc:
        with pytest.raises(CheckpointNotFound, match="no committed version intact"):
            lc.restore()
    problems = inspect_directory(LocalStore(root))["problems"]
    assert problems and all("differs from the one recorded" in p for p in problems)


@pytest.mark.parametrize("change", [
    {"lora_alpha": 32},                     # scaling 8, not 2: same shapes
    {"use_rslora": True},                   # scaling 8 / sqrt(4) = 4
    {"bias": "all"},                        # the biases train too: the adapter holds them
], ids=["lora_alpha", "use_rslora", "bias"])
def test_an_adapter_changed_on_resume_is_refused_with_the_fix(tmp_path, change):
    """Trained with lora_alpha 8, resumed with another adapter of the same shapes: the
    stored A and B would be merged under the old scaling (the export's logits off by up
    to 0.39 against the live model's): refused, naming what differs and the fix,
    with the directory as it was. A change that does not (dropout) is taken."""
    from layercheck.contract.errors import ModelMismatch
    root = tmp_path / "c"
    run(root, 2)
    manifest = (root / "manifest.jsonl").read_bytes()
    model = peft.get_peft_model(tiny_lm(seed=0, layers=2), peft.LoraConfig(
        **{"r": 4, "lora_alpha": 8, "target_modules": PROJECTIONS, **change}))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with pytest.raises(ModelMismatch, match=f"{next(iter(change))}|scaling") as refused:
        LayerCheck(model, opt, root, EVERY_STEP)
    assert "build the LoraConfig as that run did" in str(refused.value)
    assert (root / "manifest.jsonl").read_bytes() == manifest
    dropout = peft.get_peft_model(tiny_lm(seed=0, layers=2), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=PROJECTIONS, lora_dropout=0.1))
    opt = torch.optim.AdamW([p for p in dropout.parameters() if p.requires_grad], lr=1e-2)
    run(root, 1, (dropout, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)),
        restore=2)


def classifier_base(seed: int = 0):
    """A tiny Qwen2 sequence classifier (3 labels), its weights from ``seed``."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_labels=3, pad_token_id=0))


def classifier(**lora):
    """``classifier_base()`` with a LoRA adapter: PEFT's SEQ_CLS task adds its head
    ``score`` to modules_to_save (trained whole, saved beside the adapter)."""
    return peft.get_peft_model(classifier_base(), peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=PROJECTIONS, **lora))


@pytest.mark.parametrize("lora", [{}, {"bias": "all"}, {"bias": "lora_only"}],
                         ids=["modules_to_save", "bias-all", "bias-lora_only"])
def test_the_adapter_export_is_what_peft_saves_and_loads(tmp_path, lora):
    """`export --adapter` writes the keys and tensors of PEFT's own save_pretrained
    (modules_to_save as ``score.weight``, the biases its ``bias`` option saves), and
    PeftModel.from_pretrained on a freshly built base gives the live model's logits."""
    from safetensors.torch import load_file
    model = classifier(**lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with LayerCheck(model, opt, tmp_path / "c", EVERY_STEP, scheduler=sched) as lc:
        lc.restore()
        for _ in range(3):
            ids = torch.randint(1, 128, (4, 12))
            model(input_ids=ids, labels=torch.randint(0, 3, (4,))).loss.backward()
            opt.step()
            opt.zero_grad()
            lc.step()
    assert main(["export", str(tmp_path / "c"), "--adapter", "--out", str(tmp_path / "a")]) == 0
    model.save_pretrained(tmp_path / "peft")
    exported = load_file(tmp_path / "a" / "adapter_model.safetensors")
    saved = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert sorted(exported) == sorted(saved)
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    loaded = peft.PeftModel.from_pretrained(classifier_base(), tmp_path / "a")  # built afresh
    ids = torch.randint(1, 128, (2, 8))
    model.eval()
    loaded.eval()
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
