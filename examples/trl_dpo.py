"""Preference optimisation with TRL's DPOTrainer and LayerCheck: kill it, run it again, it resumes.

    python examples/trl_dpo.py --ckpt runs/dpo-ckpt              # every weight trains
    python examples/trl_dpo.py --ckpt runs/dpo-lora-ckpt --lora 4  # a PEFT LoRA adapter

A small Qwen2 built from a config learns to prefer counting by the asked
stride (``examples/tinychat.py``: the tokenizer, the model and the preference
pairs are built in code; runs offline in seconds on a CPU). The reference
model is the starting model: without LoRA TRL loads it again from the base
folder (frozen, so nothing of it needs checkpointing); with LoRA it is the
policy with its adapter switched off. The
first run starts at step 0; a run over a directory that holds checkpoints
resumes at its newest committed step through the Trainer's own
``resume_from_checkpoint``. The last line printed is a JSON summary.
"""
from __future__ import annotations

import os
from typing import Any

from trl import DPOConfig, DPOTrainer

import tinychat

LR, LORA_LR = 2e-3, 1e-2
"""The default learning rates of full fine-tuning and of a LoRA adapter."""
THRESHOLD = 3e-3
"""The default drift threshold of every layer (DPO amplifies staleness: docs/trainer.md, "TRL")."""


def build_trainer(base: str | os.PathLike[str], out: str, *, steps: int, lr: float,
                  lora: int = 0, seed: int = 0, callbacks: list[Any] = ()) -> DPOTrainer:
    """The DPOTrainer of this example, post-training the model in ``base``; ``lora`` > 0
    trains an adapter of that rank instead of every weight."""
    config = DPOConfig(**tinychat.training_arguments(out, steps=steps, lr=lr, seed=seed),
                       max_length=32)
    model, tokenizer = tinychat.load(base)
    # no ref_model: TRL loads the reference from the folder the model came from (with
    # LoRA it needs none: the reference is the model with its adapter switched off)
    return DPOTrainer(model=model, args=config, processing_class=tokenizer,
                      train_dataset=tinychat.dpo_dataset(128, seed),
                      eval_dataset=tinychat.dpo_dataset(32, seed + 1),
                      peft_config=tinychat.lora(lora) if lora else None,
                      callbacks=list(callbacks))


if __name__ == "__main__":
    tinychat.main(build_trainer, __doc__.splitlines()[0], lr=LR, lora_lr=LORA_LR,
                  threshold=THRESHOLD)
