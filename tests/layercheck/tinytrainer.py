"""The tiny Trainer job the Trainer tests share, in-process and in their worker scripts.

A Llama of 32-wide blocks with attention dropout on (a resumed run matches only if
the RNGs are restored), trained by the Trainer's AdamW under a linear schedule on
20 fixed random sequences, 4 a batch: 5 steps an epoch over reshuffled data.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

SAMPLES, SEQ, VOCAB = 20, 16, 64


class Tokens(torch.utils.data.Dataset):
    """SAMPLES sequences of SEQ token ids, the same on every call (seeded)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama(seed: int = 0, *, layers: int = 2) -> LlamaForCausalLM:
    """Attention dropout on: the resumed run matches only if the RNGs are restored."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attention_dropout=0.1, tie_word_embeddings=True))


def arguments(out: Path | str, *, steps: int, accumulation: int = 1) -> TrainingArguments:
    """The job's TrainingArguments: ``steps`` optimizer steps, no saves of the Trainer's own."""
    return TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=4 // accumulation,
        gradient_accumulation_steps=accumulation, learning_rate=2e-3, weight_decay=0.01,
        lr_scheduler_type="linear", logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, seed=3)
