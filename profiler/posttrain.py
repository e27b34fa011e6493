"""The post-training model (``--model posttrain``): a small Qwen2 causal LM with a
word-level tokenizer, built here, pretrained on one corpus before the job fine-tunes
it on another.

- The tokenizer: ``tokenizers``' WordLevel over lower-cased words and punctuation
  runs (the ``Whitespace`` pre-tokenizer), the ``WORDS`` most frequent in both parts
  of the corpus (``profiler.jobs.corpus``; ties by the word), the rest ``<unk>``.
- The model: ``CONFIG`` (untied head, like Qwen2.5-7B), weights fixed by the seed.
- Pretraining (``PRETRAIN``): next-token prediction on the Python Language
  Reference (``pydoc_data.topics``), AdamW with its own linear warm-up and decay,
  batches drawn by a generator seeded from the seed. A few seconds on a CPU.
- The job (what a capture or a staleness study trains): the fine-tuning, on the
  standard library's docstrings (their held-out documents evaluate it), with the
  capture's schedule: warm-up over ``lr_warmup_fraction`` of the steps, linear decay
  to zero. That is the shape of post-training: a trained model, a new corpus, a
  short schedule.

Nothing is fetched: both corpora ship with Python.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["CONFIG", "PRETRAIN", "WORDS", "SPECIAL", "FINETUNE_CORPUS", "build", "tokenizer",
           "describe"]

WORDS = 2000
"""Words in the vocabulary besides the special tokens."""
SPECIAL = ["<pad>", "<unk>", "<eos>"]
CONFIG = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}
"""The Qwen2 config besides the vocabulary and the positions."""
PRETRAIN = {"corpus": "reference", "steps": 300, "batch_size": 16, "lr": 2e-3, "warmup": 30}
"""The pretraining: corpus part, AdamW steps, sequences per step, peak LR, warm-up steps
(then linear decay to a tenth of the peak)."""
FINETUNE_CORPUS = "docstrings"
"""The corpus part the job fine-tunes on."""
_WORD = re.compile(r"\w+|[^\w\s]+")
"""What ``tokenizers.pre_tokenizers.Whitespace`` splits a text into."""


def tokenizer() -> Any:
    """The word-level tokenizer (module doc), with pad, unk and eos set."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from .jobs.corpus import load_corpus
    counts: Counter[str] = Counter()
    for doc in load_corpus("all").train:  # the Whitespace pre-tokenizer's split, in Python
        counts.update(_WORD.findall(doc.lower()))
    words = sorted(counts, key=lambda w: (-counts[w], w))[:WORDS]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + words)},
                                      unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")


def build(*, seed: int, max_len: int) -> tuple[Any, Any]:
    """(the pretrained model in train mode, its tokenizer): ``CONFIG`` drawn from
    ``seed``, then ``PRETRAIN``'s steps on the pretraining corpus."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from .jobs.corpus import load_corpus
    from .jobs.dataset import Dataset
    words = tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(
        **CONFIG, vocab_size=len(words), max_position_embeddings=max(max_len, 64),
        pad_token_id=words.pad_token_id, bos_token_id=None, eos_token_id=words.eos_token_id))
    data = Dataset.build(load_corpus(PRETRAIN["corpus"]), words, objective="causal",
                         seq_len=max_len, batch_size=PRETRAIN["batch_size"], seed=seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN["lr"])
    steps, warm = PRETRAIN["steps"], PRETRAIN["warmup"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: (
        (done + 1) / warm if done < warm else 1 - 0.9 * (done - warm) / max(1, steps - warm)))
    model.train()
    for step in range(steps):
        batch = data.batch_at(step * PRETRAIN["batch_size"])
        model(**batch).loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    return model, words


def describe() -> dict[str, Any]:
    """What a trace records of the model: the recipe, not weights."""
    return {"class": "Qwen2ForCausalLM", "config": dict(CONFIG), "tokenizer": (
        f"tokenizers WordLevel, the {WORDS} most frequent lower-cased words of the "
        "python-docs corpus"), "pretrained": {**PRETRAIN, "objective": "causal"},
        "finetuned_on": FINETUNE_CORPUS, "defined_in": "profiler.posttrain"}
