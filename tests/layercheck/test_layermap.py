"""Layer maps detected from real Hugging Face architectures and generic modules."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layercheck.contract.errors import ModelMismatch
from layercheck.backends.layermap import LayerMap
from tests.conftest import tiny_lm


def test_causal_lm_tied_embedding_is_one_layer():
    lm = LayerMap.auto(tiny_lm(tied=True, layers=3))
    assert lm.names == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                        "model.layers.2", "model.norm"]
    assert lm.kinds == ["embedding", "block", "block", "block", "norm"]


def test_causal_lm_untied_head_is_its_own_layer():
    model = tiny_lm(tied=False, layers=2)
    lm = LayerMap.auto(model)
    assert lm.names[-1] == "lm_head" and lm.kinds[-1] == "head"
    assert sum(l.numel for l in lm) == sum(p.numel() for p in model.parameters())
    head = lm.layers[-1]
    assert head.nbytes == model.lm_head.weight.numel() * 4


def test_llama_naming():
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, tie_word_embeddings=False))
    assert LayerMap.auto(model).names == ["model.embed_tokens", "model.layers.0",
                                          "model.layers.1", "model.norm", "lm_head"]


def test_bert_encoder_with_head():
    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3))
    lm = LayerMap.auto(model)
    assert lm.names == ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1",
                        "bert.pooler", "classifier"]
    assert lm.kinds == ["embedding", "block", "block", "head", "head"]


def test_generic_module_list_and_rest():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(4, 8)
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
            self.bn = nn.BatchNorm1d(8)
            self.out = nn.Linear(8, 2)

    lm = LayerMap.auto(Net())
    assert lm.names == ["stem", "blocks.0", "blocks.1", "blocks.2", "bn", "out"]
    bn = lm.layers[lm.index["bn"]]
    assert set(bn.buffers) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}


def test_explicit_map_longest_prefix_wins_and_gaps_are_errors():
    model = tiny_lm(tied=False, layers=2)
    lm = LayerMap.explicit(model, {"body": ["model"], "head": ["lm_head"],
                                   "first": ["model.layers.0"]})
    assert lm.layers[lm.index["first"]].params[0].startswith("model.layers.0.")
    with pytest.raises(ModelMismatch, match="without a layer"):
        LayerMap.explicit(model, {"body": ["model"]})
    with pytest.raises(ModelMismatch, match="match no parameter"):
        LayerMap.explicit(model, {"all": ["model", "lm_head"], "ghost": ["nothing"]})


# -- every layer has a file name of its own (issue 13, items 2 and 9) ----------------------
def _dict_model(*names: str) -> nn.Module:
    return nn.ModuleDict({name: nn.Linear(4, 4) for name in names})


@pytest.mark.parametrize("a,b", [("enc 0", "enc_0"), ("Enc", "enc"), ("schicht_ü", "schicht_ö")])
def test_layer_names_that_share_a_file_name_are_refused_when_the_map_is_built(a, b):
    """'enc 0' and 'enc_0' were both written to layers/enc_0@N: one overwrote the other,
    restore found 'all damaged' and a drop of one deleted the other. Names that differ
    only in case share a file on a case-insensitive filesystem."""
    with pytest.raises(ModelMismatch) as info:
        LayerMap.auto(_dict_model(a, b))
    message = str(info.value)
    assert repr(a) in message and repr(b) in message and "layers=" in message
    with pytest.raises(ModelMismatch, match="share the file name"):
        LayerMap.explicit(_dict_model("x", "y"), {a: ["x"], b: ["y"]})


def test_a_name_too_long_for_a_file_is_refused_when_the_map_is_built():
    long = "block_" + "x" * 300
    with pytest.raises(ModelMismatch, match="too long") as info:
        LayerMap.auto(_dict_model(long, "other"))
    assert long[:40] in str(info.value)


def test_a_non_ascii_module_name_is_checkpointed_from_the_base_checkpoint_on(tmp_path):
    """'schicht_ü' passed every check until the base checkpoint, 200 steps in, where the
    store refused its file name: under 'raise' the error said to fix the storage, under
    'warn' nothing was ever committed. Its file name is ASCII."""
    from layercheck import LayerCheck, LayerCheckConfig
    from layercheck.storage.format import layer_path

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.schicht_ü = nn.Linear(4, 4)
            self.kopf = nn.Linear(4, 2)

        def forward(self, x):
            return self.kopf(self.schicht_ü(x))

    assert layer_path("schicht_ü", 3).isascii()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = LayerCheckConfig(warmup_steps=2, base_threshold=0, embedding_threshold=0)
    with LayerCheck(model, opt, tmp_path / "c", cfg) as lc:
        assert lc.layer_map.names == ["schicht_ü", "kopf"]
        lc.restore()
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            lc.step()
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(1)
    again = Net()
    with LayerCheck(again, torch.optim.AdamW(again.parameters(), lr=1e-2), tmp_path / "c",
                    cfg) as lc:
        assert lc.restore() == 3
    for name, value in again.named_parameters():
        assert torch.equal(value, expected[name]), name


def test_a_model_without_parameters_or_buffers_is_refused_when_the_map_is_built(tmp_path):
    """Its header would list no layers, which every reader refuses (the record schema,
    issue 27 item 9): refused here, before anything is written."""
    from layercheck import LayerCheck
    model = nn.Sequential(nn.ReLU())
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ModelMismatch, match="no parameters or persistent buffers"):
        LayerCheck(model, opt, tmp_path / "c")
    assert not (tmp_path / "c" / "manifest.jsonl").exists()
