"""Reinforcement learning with TRL's GRPOTrainer and LayerCheck: kill it, run it again, it resumes.

    python examples/trl_grpo.py --ckpt runs/grpo-ckpt              # every weight trains
    python examples/trl_grpo.py --ckpt runs/grpo-lora-ckpt --lora 4  # a PEFT LoRA adapter

A small Qwen2 built from a config (``examples/tinychat.py``: the tokenizer,
the model and the prompts are built in code; runs offline in seconds on a
CPU) samples 4 answers to each ``count from 7 by 3``; a rule-based reward
scores how close each number is to the right one, and GRPO moves the policy
towards the better answers of each group, held near a frozen reference model
by a KL penalty (``beta`` > 0: without LoRA TRL loads the reference again
from the base folder, and LayerCheck checks at a resume that it is
unchanged; with LoRA it is the policy with its adapter switched off). The
first run starts at step 0; a run over a directory that holds checkpoints
resumes at its newest committed step through the Trainer's own
``resume_from_checkpoint``. The last line printed is a JSON summary, with the
held-out loss of the right answers (``eval_loss``).
"""
from __future__ import annotations

import os
from typing import Any

from trl import GRPOConfig, GRPOTrainer

import tinychat

LR, LORA_LR = 1e-3, 5e-3
"""The default learning rates of full fine-tuning and of a LoRA adapter."""
THRESHOLD = 3e-3
"""The default drift threshold of every layer (docs/trainer.md, "GRPO")."""
BETA = 0.04
"""The KL penalty's weight: above 0, so the reference model is used."""
GENERATIONS = 4
"""Completions sampled per prompt (a group)."""


def build_trainer(base: str | os.PathLike[str], out: str, *, steps: int, lr: float,
                  lora: int = 0, seed: int = 0, callbacks: list[Any] = ()) -> GRPOTrainer:
    """The GRPOTrainer of this example, post-training the model in ``base``; ``lora`` > 0
    trains an adapter of that rank instead of every weight."""
    shared = tinychat.training_arguments(out, steps=steps, lr=lr, seed=seed)
    del shared["dataset_num_proc"]  # GRPO tokenizes prompts as it samples: no preparation pass
    shared["per_device_train_batch_size"] = 4 * GENERATIONS  # 4 prompts a step
    config = GRPOConfig(**shared, num_generations=GENERATIONS, beta=BETA,
                        max_completion_length=tinychat.TERMS)
    model, tokenizer = tinychat.load(base)
    # no ref_model argument: with beta > 0 TRL loads the reference from the folder the
    # policy came from (with LoRA it needs none: the policy with its adapter switched off)
    return GRPOTrainer(model=model, args=config, processing_class=tokenizer,
                       reward_funcs=tinychat.count_reward,
                       train_dataset=tinychat.grpo_dataset(64, seed),
                       peft_config=tinychat.lora(lora) if lora else None,
                       callbacks=list(callbacks))


def held_out(trainer: GRPOTrainer, seed: int = 0) -> dict[str, float]:
    """The summary's held-out figures: the loss of the right answers to 32 prompts the
    run never trained on (teacher-forced, so it does not depend on sampling), and the
    mean reward of the last 10 logged steps."""
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e][-10:]
    return {"eval_loss": tinychat.answer_loss(trainer.model, trainer.processing_class,
                                              tinychat.grpo_dataset(32, seed + 1)),
            "reward_last10": sum(rewards) / len(rewards) if rewards else None}


if __name__ == "__main__":
    tinychat.main(build_trainer, __doc__.splitlines()[0], lr=LR, lora_lr=LORA_LR,
                  threshold=THRESHOLD, evaluate=held_out)
