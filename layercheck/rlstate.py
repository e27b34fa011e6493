"""What an RL trainer holds beside its policy, for ``LayerCheckCallback``: TRL's GRPOTrainer.

A GRPO run trains a policy on completions it samples from that policy,
scored by reward functions, against a frozen reference model. Beside what
every Trainer resume restores (the composite weights with their Adam
moments, the optimizer, the LR scheduler, the RNGs, the Trainer state), an
exact resume needs four things, each handled here:

- **Generations.** TRL samples completions for ``steps_per_generation x
  num_iterations`` micro-batches at once and trains on that buffer over
  ``generation_span`` optimizer steps. The buffer is not checkpointed (it is
  the policy's own samples, as large as a generation batch); a step committed
  inside a span could only be resumed by sampling new completions from
  another policy than the one the uninterrupted run sampled. So every
  committed step must end a span: ``check_arguments`` refuses an
  ``interval`` that is not a multiple of it. At a span's end TRL's
  micro-step counter, which a new trainer starts at 0, is a multiple of the
  span, so the resumed trainer generates exactly where the uninterrupted one
  did.
- **The prompt order.** TRL's ``RepeatSampler`` draws each epoch's order from
  one ``torch.Generator`` it keeps for the whole run (it has no
  ``set_epoch``); a resumed trainer makes a new one, seeded alike, so
  ``replay_epochs`` runs it through the epochs before the resumed one.
- **Frozen models.** The reference model (``beta > 0`` without PEFT: TRL loads
  it again from the folder the policy was loaded from) and reward models are
  not checkpointed; ``RlState`` records a checksum of each with every
  committed step, and a resume refuses a trainer whose frozen models differ
  (the folder changed). ``sync_ref_model=True`` moves the reference during
  training, so it is refused.
- **Reward functions.** A plain function has no state. An object with
  ``state_dict()`` (JSON-ready) and ``load_state_dict()`` is carried with
  every committed step and loaded back.

The sampling itself draws from torch's global RNG, which LayerCheck restores
with every step. Not restored: TRL's logging buffers (completions tables,
metrics), environments of tool-calling runs, and a vLLM server's state.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch

from .storage.checksums import Checksummer
from .contract.errors import LayerCheckError

__all__ = ["RL_STATE_KEY", "RlState", "check_arguments", "generation_span", "replay_epochs"]

RL_STATE_KEY = "rl"
"""The key of the extra state under which a committed step carries ``RlState.state()``."""


def generation_span(args: Any) -> int | None:
    """The optimizer steps one generation of completions is trained on (its buffer
    spans them), or None when ``args`` configure no generating trainer (GRPOConfig
    and TRL's other generating configs carry ``num_generations``)."""
    if not hasattr(args, "num_generations"):
        return None
    accumulation = args.gradient_accumulation_steps
    micro = (getattr(args, "steps_per_generation", None) or accumulation) * \
        (getattr(args, "num_iterations", None) or 1)
    return math.lcm(micro, accumulation) // accumulation


def check_arguments(args: Any, interval: int) -> None:
    """Refuse a generating trainer that LayerCheck cannot resume exactly (see the
    module doc), naming the fix."""
    span = generation_span(args)
    if span is None:
        return
    if getattr(args, "sync_ref_model", False):
        raise LayerCheckError(
            "sync_ref_model=True moves the reference model during training, and LayerCheck "
            "checkpoints the policy only: set sync_ref_model=False")
    if interval % span:
        raise LayerCheckError(
            f"this trainer trains each generation of completions over {span} optimizer steps "
            f"(steps_per_generation={getattr(args, 'steps_per_generation', None)} x "
            f"num_iterations={getattr(args, 'num_iterations', None)} micro-batches, "
            f"{args.gradient_accumulation_steps} per step), "
            "and a step committed inside one could not be resumed exactly (the completions are "
            f"not checkpointed): use LayerCheckConfig(interval={span}) or a multiple of it")


def replay_epochs(dataloader: Any, epochs: int) -> None:
    """Run the sampler of ``dataloader`` through ``epochs`` epochs when it draws each
    epoch's order from a generator of its own that nothing resets per epoch (TRL's
    ``RepeatSampler``): a resumed trainer's new sampler then draws the resumed
    epoch's order as the uninterrupted run did. Samplers with ``set_epoch`` (the
    Trainer's own) are left alone: the Trainer sets their epoch."""
    sampler = _stateful_sampler(dataloader)
    if sampler is None:
        return
    for _ in range(epochs):
        for _ in sampler:
            pass


def _stateful_sampler(dataloader: Any) -> Any:
    todo, seen = [dataloader], set()
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if (isinstance(obj, torch.utils.data.Sampler) and not hasattr(obj, "set_epoch")
                and isinstance(getattr(obj, "generator", None), torch.Generator)):
            return obj
        todo += [getattr(obj, "batch_sampler", None), getattr(obj, "sampler", None)]
    return None


class RlState:
    """What ``trainer`` holds beside its policy (see the module doc): the checksums
    of its frozen models, taken now, and its stateful reward functions."""

    def __init__(self, trainer: Any) -> None:
        frozen = {"ref_model": getattr(trainer, "ref_model", None)}
        self._rewards: dict[str, Any] = {}
        for i, reward in enumerate(getattr(trainer, "reward_funcs", None) or ()):
            if isinstance(reward, torch.nn.Module):
                frozen[f"reward_funcs[{i}]"] = reward
            elif hasattr(reward, "state_dict") and hasattr(reward, "load_state_dict"):
                self._rewards[str(i)] = reward
        self.frozen = {name: fingerprint(module) for name, module in frozen.items()
                       if module is not None}
        """Per frozen model, the checksum of its tensors when this object was made."""

    def state(self) -> dict[str, Any]:
        """What a committed step carries (JSON-ready)."""
        return {"frozen": dict(self.frozen),
                "reward_functions": {k: f.state_dict() for k, f in self._rewards.items()}}

    def restore(self, saved: Mapping[str, Any] | None, step: int, where: str) -> None:
        """Check the frozen models against those step ``step`` of ``where`` trained
        against, and load the reward functions' state; LayerCheckError naming the fix
        if a frozen model differs or a stateful reward function has no saved state.
        ``saved`` None: the step recorded nothing of the kind (it was committed without
        ``resume_checkpoint(trainer=)``), so there is nothing to check the models against."""
        recorded = saved is not None
        saved = saved or {}
        before = saved.get("frozen") or {}
        changed = sorted(name for name in before.keys() | self.frozen.keys()
                         if recorded and before.get(name) != self.frozen.get(name))
        if changed:
            said = "; ".join(f"{name}: {before.get(name, 'none')} at step {step}, "
                             f"{self.frozen.get(name, 'none')} now" for name in changed)
            raise LayerCheckError(
                f"the frozen models of this trainer are not those step {step} of {where} "
                f"trained against ({said}): give the trainer the same reference and reward "
                "models (the folder the reference is loaded from must be unchanged), or "
                "start a new directory")
        rewards = saved.get("reward_functions") or {}
        missing = sorted(set(self._rewards) - set(rewards))
        if missing:
            raise LayerCheckError(
                f"step {step} of {where} carries no state of the reward functions "
                f"{', '.join(f'reward_funcs[{k}]' for k in missing)}, which have one now: "
                "resume with the reward functions the run was started with, or start a new "
                "directory")
        for key, reward in self._rewards.items():
            reward.load_state_dict(rewards[key])


def fingerprint(module: torch.nn.Module) -> str:
    """A checksum of every tensor of ``module`` (names, dtypes, shapes and bytes, in
    name order): equal for equal weights, on any device."""
    summer = Checksummer()
    for name, tensor in sorted(module.state_dict().items()):
        summer.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)};".encode())
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        summer.update(np.ascontiguousarray(flat.view(torch.uint8).numpy()).data)
    return summer.value
