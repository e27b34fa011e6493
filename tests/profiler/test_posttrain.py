"""The post-training model (profiler.posttrain): a word-level tokenizer, a small Qwen2
pretrained on one part of the corpus, a job that fine-tunes it on the other."""
from __future__ import annotations

import pytest
import torch

from profiler import posttrain
from profiler.models import resolve_model


@pytest.fixture(scope="module")
def words():
    return posttrain.tokenizer()


def test_the_tokenizer_is_a_word_level_vocabulary_of_the_corpus(words):
    assert len(words) == posttrain.WORDS + len(posttrain.SPECIAL)
    ids = words("The Assignment statement, x = 1", add_special_tokens=False)["input_ids"]
    # lower-cased words and punctuation runs, each one token; a word it does not hold is unk
    assert words.convert_ids_to_tokens(ids) == ["the", "assignment", "statement", ",", "x", "=", "1"]
    assert words("zyzzyvaqq")["input_ids"] == [words.unk_token_id]
    assert posttrain.tokenizer().get_vocab() == words.get_vocab()  # the same every time


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: threads only contend on a loaded machine
    yield
    torch.set_num_threads(before)


def test_pretraining_fixes_the_weights_by_the_seed_and_teaches_the_model(monkeypatch, one_thread):
    monkeypatch.setitem(posttrain.PRETRAIN, "steps", 0)
    raw, words = posttrain.build(seed=0, max_len=32)
    again, _ = posttrain.build(seed=0, max_len=32)
    for a, b in zip(raw.parameters(), again.parameters()):
        assert torch.equal(a, b)
    monkeypatch.setitem(posttrain.PRETRAIN, "steps", 12)
    monkeypatch.setitem(posttrain.PRETRAIN, "warmup", 2)
    trained, _ = posttrain.build(seed=0, max_len=32)
    assert trained.config.tie_word_embeddings is False and trained.config.vocab_size == len(words)
    text = "the assignment statement binds a name to the object the expression yields . " * 3
    ids = torch.tensor([words(text, add_special_tokens=False)["input_ids"][:32]])
    with torch.no_grad():
        assert trained(input_ids=ids, labels=ids).loss < raw(input_ids=ids, labels=ids).loss - 0.5


def test_the_job_fine_tunes_on_the_other_part():
    source = resolve_model("posttrain")
    assert (source.objective, source.corpus, source.path) == ("causal", "docstrings", None)
    assert source.corpus != posttrain.PRETRAIN["corpus"]
    assert source.describe()["built_from"]["defined_in"] == "profiler.posttrain"
