"""--model: names, folders, and the objective read from a folder's config."""
from __future__ import annotations

import json

import pytest

from profiler.errors import ProfilerError
from profiler.models import resolve_model


def test_names():
    assert resolve_model("tiny").objective == "causal" and resolve_model("tiny").path is None
    minilm = resolve_model("minilm")
    assert minilm.objective == "masked" and (minilm.path / "config.json").exists()


def test_a_folder_is_classified_by_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    assert resolve_model(str(tmp_path)).objective == "causal"
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertModel"]}))
    source = resolve_model(str(tmp_path))
    assert source.objective == "masked" and source.label == tmp_path.name


@pytest.mark.parametrize("config, words", [
    ({"model_type": "t5", "is_encoder_decoder": True}, "encoder-decoder"),
    ({"model_type": "no-such-arch"}, "neither a causal LM"),
    ([1, 2], "not a JSON object"),
])
def test_unsupported_folders_say_why(tmp_path, config, words):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ProfilerError, match=words):
        resolve_model(str(tmp_path))


def test_a_folder_without_a_loadable_model_fails_cleanly(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(ProfilerError, match="cannot load it"):
        resolve_model(str(tmp_path)).build(seed=0, max_len=32)
