"""Layer maps detected from real Hugging Face architectures and generic modules."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from layercheck.errors import ModelMismatch
from layercheck.layermap import LayerMap
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
