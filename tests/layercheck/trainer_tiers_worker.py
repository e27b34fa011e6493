"""A tiny Trainer run with ``LayerCheckCallback(tiers=...)``: the Trainer tiers test's worker.

    python tests/layercheck/trainer_tiers_worker.py --ckpt D --tier T --out O.json --steps 12

The tiny Trainer job of ``tinytrainer.py`` (a two-block Llama with attention
dropout on, the Trainer's AdamW under a linear schedule, 5 steps an epoch).
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
from transformers import Trainer, TrainerCallback

from layercheck import LayerCheckConfig
from layercheck.snapshot import capture_rng
from layercheck.tiers import TierConfig
from layercheck.trainer import LayerCheckCallback
from tests.layercheck.tinytrainer import Tokens, arguments, tiny_llama

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
    model = tiny_llama()
    # thresholds no drift reaches: storage writes the layers at the base (step 2) only
    config = LayerCheckConfig(base_threshold=10.0, embedding_threshold=10.0, warmup_steps=2,
                              smax=100)
    layercheck = LayerCheckCallback(args.ckpt, config, tiers=TierConfig(
        folder=args.tier, budget_bytes=64 << 20))
    training = arguments(f"{args.ckpt}-out", steps=args.steps)
    trainer = Trainer(model, training, train_dataset=Tokens(),
                      callbacks=[layercheck, Digests(layercheck, Path(args.out))])
    trainer.train(resume_from_checkpoint=layercheck.resume_checkpoint())
    return 0


if __name__ == "__main__":
    sys.exit(main())
