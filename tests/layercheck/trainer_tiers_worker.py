"""A tiny Trainer run with ``LayerCheckCallback(tiers=...)``: the Trainer tiers test's worker.

    python tests/layercheck/trainer_tiers_worker.py --ckpt D --tier T --out O.json --steps 12

A two-block Llama with attention dropout (the RNGs matter) trained by the
Trainer's AdamW under a linear schedule, 5 steps an epoch over reshuffled data.
Run it again over the same directory and memory-tier folder and it resumes
through ``callback.resume_checkpoint()``. It records in ``O.json`` (rewritten
after every event) a digest of the whole training state once the restore is
done (``on_train_begin``) and after every step (``on_step_end``): parameters,
optimizer state, scheduler, every RNG the Trainer draws from, and the Trainer
state LayerCheck carries; and where each layer was restored from. The kill
comes from ``tests/layercheck/halting.py`` (``--halt-at``).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

from layercheck import LayerCheckConfig
from layercheck.snapshot import capture_rng
from layercheck.tiers import TierConfig
from layercheck.trainer import LayerCheckCallback

SAMPLES, SEQ, VOCAB = 20, 16, 64


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_state(state: Any) -> dict[str, Any]:
    """The Trainer state a resume restores (all but the log history, not carried)."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
            if f.name != "log_history"}


def digest(model: torch.nn.Module, optimizer: Any, scheduler: Any, state: Any) -> dict[str, str]:
    """sha256 of every parameter, optimizer tensor, the schedule, the RNGs and the Trainer
    state, one per part (a mismatch says which)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer  # accelerate's wrapper
    parts = {part: hashlib.sha256() for part in ("model", "optimizer", "scheduler", "rng",
                                                   "trainer_state")}
    for name, p in model.named_parameters():
        parts["model"].update(name.encode() + p.detach().contiguous().view(torch.uint8)
                              .numpy().tobytes())
        for field, value in sorted(optimizer.state.get(p, {}).items()):
            value = value if torch.is_tensor(value) else torch.tensor(float(value))
            parts["optimizer"].update(name.encode() + field.encode() + value.detach()
                                      .contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    parts["optimizer"].update(json.dumps([{k: v for k, v in g.items() if k != "params"}
                                          for g in optimizer.param_groups], default=str).encode())
    parts["scheduler"].update(json.dumps(scheduler.state_dict(), default=str,
                                         sort_keys=True).encode())
    tensors, scalars = capture_rng()
    for key in sorted(tensors):
        parts["rng"].update(key.encode() + tensors[key].contiguous().view(torch.uint8)
                            .numpy().tobytes())
    parts["rng"].update(json.dumps(scalars).encode())
    parts["trainer_state"].update(json.dumps(trainer_state(state), default=str,
                                             sort_keys=True).encode())
    return {part: h.hexdigest() for part, h in parts.items()}


class Digests(TrainerCallback):
    """Records the digests (see the module doc); after LayerCheckCallback in the list."""

    def __init__(self, layercheck: LayerCheckCallback, out: Path) -> None:
        self.layercheck, self.out = layercheck, out
        self.record: dict[str, Any] = {"digests": {}}

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       lr_scheduler=None, **kwargs):
        tiers = self.layercheck.layercheck.tiers
        self.record.update(restored_step=state.global_step,
                           restored_digest=digest(model, optimizer, lr_scheduler, state),
                           restored_state=trainer_state(state),
                           sources=tiers.last.sources if tiers.last is not None else None)
        self.write()

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None,
                    **kwargs):
        self.record["digests"][state.global_step] = digest(model, optimizer, lr_scheduler, state)
        self.record.setdefault("states", {})[state.global_step] = trainer_state(state)
        self.write()

    def write(self) -> None:
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, default=str))
        os.replace(tmp, self.out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tier", required=True, help="the memory tier's folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attention_dropout=0.1, tie_word_embeddings=True))
    # thresholds no drift reaches: storage writes the layers at the base (step 2) only
    config = LayerCheckConfig(base_threshold=10.0, embedding_threshold=10.0, warmup_steps=2,
                              smax=100)
    layercheck = LayerCheckCallback(args.ckpt, config, tiers=TierConfig(
        folder=args.tier, budget_bytes=64 << 20))
    training = TrainingArguments(
        output_dir=f"{args.ckpt}-out", max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=2e-3, weight_decay=0.01, lr_scheduler_type="linear", logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=3)
    trainer = Trainer(model, training, train_dataset=Tokens(),
                      callbacks=[layercheck, Digests(layercheck, Path(args.out))])
    trainer.train(resume_from_checkpoint=layercheck.resume_checkpoint())
    return 0


if __name__ == "__main__":
    sys.exit(main())
