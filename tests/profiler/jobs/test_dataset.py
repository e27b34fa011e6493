"""The corpus and the batches: real text, deterministic positions, BERT-style masks."""
from __future__ import annotations

import zlib

import pytest
import torch

from profiler.jobs.corpus import EVAL_EVERY, load_corpus
from profiler.jobs.dataset import MASK_PROB, Dataset


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_corpus_is_real_english_and_split(corpus):
    assert corpus.chars > 500_000
    assert any("assignment statement" in d.lower() for d in corpus.train + corpus.heldout)
    assert len(corpus.heldout) == (len(corpus.train) + len(corpus.heldout)) // EVAL_EVERY
    assert not set(corpus.heldout) & set(corpus.train[:50])
    assert load_corpus().fingerprint == corpus.fingerprint


class _WordTokenizer:
    """A stand-in with BERT's special tokens: one id per word, 0..4 special."""
    pad_token_id, cls_token_id, sep_token_id, mask_token_id, unk_token_id = 0, 1, 2, 3, 4
    all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return 1000

    def __call__(self, docs, **_):
        # crc32, not hash(): Python salts str hashes per process, and the ids must not vary
        return {"input_ids": [[5 + zlib.crc32(w.encode()) % 995 for w in d.split()] for d in docs]}


def test_batches_are_a_function_of_the_position(corpus):
    ds = Dataset.build(corpus, None, objective="causal", seq_len=32, batch_size=4, seed=3)
    a, b = ds.batch_at(40), ds.batch_at(40)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], ds.batch_at(44)["input_ids"])
    n = len(ds.train)  # every epoch visits every block once, each epoch in another order
    assert sorted(ds._order(0).tolist()) == list(range(n))
    assert not (ds._order(1) == ds._order(0)).all()
    wrap = ds.batch_at(n - 2)["input_ids"]  # two samples of epoch 0, two of epoch 1
    expected = ds.train[torch.as_tensor([*ds._order(0)[-2:], *ds._order(1)[:2]])]
    assert torch.equal(wrap, expected)


def test_masks_follow_the_bert_recipe(corpus):
    ds = Dataset.build(corpus, _WordTokenizer(), objective="masked", seq_len=64, batch_size=64,
                       seed=0)
    batch = ds.batch_at(0)
    original = ds.train[torch.as_tensor(ds._order(0)[:64])]
    chosen = batch["labels"] != -100
    assert torch.equal(batch["labels"][chosen], original[chosen])
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # [CLS] and [SEP] never
    share = chosen.float().mean().item()
    assert abs(share - MASK_PROB * 62 / 64) < 0.02
    masked = (batch["input_ids"] == 3) & chosen
    assert 0.7 < masked.sum().item() / chosen.sum().item() < 0.9
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])
    again = list(ds.heldout_batches(8))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(again, ds.heldout_batches(8)))


def test_the_corpus_comes_in_two_parts_the_whole_is_their_union(corpus):
    reference, docstrings = load_corpus("reference"), load_corpus("docstrings")
    both = set(reference.train + reference.heldout) | set(docstrings.train + docstrings.heldout)
    assert both == set(corpus.train + corpus.heldout)
    assert not set(reference.train + reference.heldout) & set(docstrings.train + docstrings.heldout)
    assert any("assignment statement" in d.lower() for d in reference.train)
    assert docstrings.describe()["name"] == "python-docs-docstrings"
    assert corpus.describe()["name"] == "python-docs"
    with pytest.raises(ValueError, match="corpus part"):
        load_corpus("novels")
