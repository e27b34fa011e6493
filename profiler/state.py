"""A plain job's training state as named tensors: what a full checkpoint holds.

Each parameter once (tied weights once: MiniLM's decoder is its word
embedding), its AdamW first and second moments and step count, and the
model's persistent buffers, keyed ``param/<name>``, ``exp_avg/<name>``,
``exp_avg_sq/<name>``, ``step/<name>``, ``buffer/<name>``; plus the small
non-tensor part (step, data position, LR scheduler). These are the live
tensors: loading into them (``dcp.load``, ``copy_``) restores the job.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TrainingState", "MOMENTS", "fsync_path"]

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(eq=False)
class TrainingState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live tensors of the state (the optimizer's state is created, zero,
        where no step has made it yet, so that a fresh job can be loaded into)."""
        self._ensure_optimizer_state()
        out: dict[str, torch.Tensor] = {}
        for name, p in self.model.named_parameters():  # named_parameters lists a tied weight once
            if not p.requires_grad:
                continue
            out[f"param/{name}"] = p.data
            state = self.optimizer.state[p]
            for key in MOMENTS:
                out[f"{key}/{name}"] = state[key]
            out[f"step/{name}"] = state["step"]
        for name, b in self.model.named_buffers():
            if _persistent(self.model, name):
                out[f"buffer/{name}"] = b
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def meta(self, step: int, position: int) -> dict[str, Any]:
        """The non-tensor part: step, data position, the scheduler's state."""
        return {"step": step, "position": position,
                "scheduler": json.dumps(_jsonable(self.scheduler.state_dict()))}

    def apply_meta(self, meta: dict[str, Any]) -> tuple[int, int]:
        """Restore the scheduler (and the optimizer's LRs from it); (step, position)."""
        self.scheduler.load_state_dict(json.loads(meta["scheduler"]))
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        return int(meta["step"]), int(meta["position"])

    def gradients(self) -> list[tuple[str, torch.Tensor]]:
        """(name, gradient) of every trainable parameter that has one."""
        return [(name, p.grad) for name, p in self.model.named_parameters()
                if p.requires_grad and p.grad is not None]

    def _ensure_optimizer_state(self) -> None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    for key in MOMENTS:
                        state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)


def fsync_path(path: "os.PathLike[str] | str") -> None:
    """fsync a file or folder (the four lines of layercheck.storage.store's own, which is
    private to the store and takes the store's paths)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _persistent(model: torch.nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    return leaf not in getattr(module, "_non_persistent_buffers_set", set())


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if torch.is_tensor(value):
        return value.tolist()
    if callable(value):
        return None  # LambdaLR keeps plain functions out of its state; a stray one is rebuilt
    return value
