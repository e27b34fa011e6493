"""Fine-tune with the Trainer and LayerCheck: kill it at any moment, run it again, it resumes.

    python examples/finetune_trainer.py --ckpt runs/trainer-ckpt --steps 100

The model is a small Qwen2 causal LM built from a config (runs offline in
seconds on a CPU); the data is a fixed set of token sequences, each an
arithmetic progression modulo the vocabulary, which the Trainer shuffles
every epoch. The first run starts at step 0; a run over a directory that
holds checkpoints resumes at its newest committed step through the Trainer's
own ``resume_from_checkpoint``, and continues the same data stream and LR
schedule. The last line printed is a JSON summary (resumed step, final loss,
held-out loss).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainerCallback, TrainingArguments

from layercheck import LayerCheckConfig
from layercheck.trainer import LayerCheckCallback

VOCAB, SEQ = 96, 24


class Progressions(torch.utils.data.Dataset):
    """``size`` sequences ``(start + stride * i) % VOCAB``, fixed by ``seed``."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (size, 1), generator=g)
        stride = torch.randint(1, 6, (size, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=True))


class LossLog(TrainerCallback):
    """Appends one JSON line per logged step: {"step", "loss"}."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="the layercheck directory")
    ap.add_argument("--out", help="the Trainer's output_dir (default: <ckpt>-out)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threshold", type=float, default=1e-2,
                    help="drift threshold of the blocks and the norm (a tiny model drifts fast)")
    ap.add_argument("--embedding-threshold", type=float, default=2e-2,
                    help="drift threshold of the (tied) embedding")
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--smax", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--losses", help="append one JSON line per step here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    layercheck = LayerCheckCallback(args.ckpt, LayerCheckConfig(
        base_threshold=args.threshold,
        embedding_threshold=args.embedding_threshold,
        warmup_steps=args.warmup_steps, smax=args.smax))
    training = TrainingArguments(
        output_dir=args.out or f"{os.fspath(args.ckpt).rstrip('/')}-out", max_steps=args.steps,
        per_device_train_batch_size=8, learning_rate=args.lr,
        lr_scheduler_type="linear", warmup_steps=max(1, args.steps // 10), logging_steps=1,
        save_strategy="no",  # LayerCheck is the checkpointing
        report_to="none", use_cpu=True, disable_tqdm=True, seed=args.seed)
    callbacks = [layercheck] + ([LossLog(args.losses)] if args.losses else [])
    trainer = Trainer(build_model(args.seed), training, train_dataset=Progressions(256, args.seed),
                      eval_dataset=Progressions(64, args.seed + 1), callbacks=callbacks)

    resume = layercheck.resume_checkpoint()  # None on a fresh directory
    result = trainer.train(resume_from_checkpoint=resume)
    final = next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None)
    print(json.dumps({"resumed_at": layercheck.restored_step,
                      "global_step": result.global_step, "final_loss": final,
                      "eval_loss": trainer.evaluate()["eval_loss"]}))


if __name__ == "__main__":
    main()
