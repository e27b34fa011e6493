"""Supervised fine-tuning with TRL's SFTTrainer and LayerCheck: kill it, run it again, it resumes.

    python examples/trl_sft.py --ckpt runs/sft-ckpt              # every weight trains
    python examples/trl_sft.py --ckpt runs/sft-lora-ckpt --lora 4  # a PEFT LoRA adapter

A small Qwen2 built from a config learns to count (``examples/tinychat.py``:
the tokenizer, the model and the data are built in code; runs offline in
seconds on a CPU). The first run starts at step 0; a run over a directory that
holds checkpoints resumes at its newest committed step through the Trainer's
own ``resume_from_checkpoint``. The last line printed is a JSON summary.
"""
from __future__ import annotations

import os
from typing import Any

from trl import SFTConfig, SFTTrainer

import tinychat

LR, LORA_LR = 5e-3, 2e-2
"""The default learning rates of full fine-tuning and of a LoRA adapter."""
THRESHOLD = 1e-2
"""The default drift threshold of every layer (a tiny model drifts fast)."""


def build_trainer(base: str | os.PathLike[str], out: str, *, steps: int, lr: float,
                  lora: int = 0, seed: int = 0, callbacks: list[Any] = ()) -> SFTTrainer:
    """The SFTTrainer of this example, post-training the model in ``base``; ``lora`` > 0
    trains an adapter of that rank instead of every weight."""
    config = SFTConfig(**tinychat.training_arguments(out, steps=steps, lr=lr, seed=seed),
                       max_length=32)
    model, tokenizer = tinychat.load(base)
    return SFTTrainer(model=model, args=config, processing_class=tokenizer,
                      train_dataset=tinychat.sft_dataset(128, seed),
                      eval_dataset=tinychat.sft_dataset(32, seed + 1),
                      peft_config=tinychat.lora(lora) if lora else None,
                      callbacks=list(callbacks))


if __name__ == "__main__":
    tinychat.main(build_trainer, __doc__.splitlines()[0], lr=LR, lora_lr=LORA_LR,
                  threshold=THRESHOLD)
