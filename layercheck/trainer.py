"""LayerCheckCallback: layer-wise checkpointing inside the Hugging Face Trainer.

    callback = LayerCheckCallback("ckpt/", LayerCheckConfig(warmup_steps=50, smax=500))
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.resume_checkpoint())  # None on a fresh directory

Run the same script again after a crash (SIGKILL included) and it resumes at
the newest committed step; on a fresh directory it starts at step 0.

Call order (the Trainer drives it): ``on_init_end`` remembers the model;
``resume_checkpoint()`` (before ``train()``) prepares the Trainer's resume;
``on_train_begin`` creates the ``LayerCheck`` (the Trainer creates its optimizer
and scheduler lazily, inside ``train()``: this is the first hook that sees
them) and restores the composite state; ``on_step_end`` (after
``optimizer.step()`` and ``lr_scheduler.step()``) calls ``LayerCheck.step()``;
``on_train_end`` waits for pending writes and releases the directory.

Resume design (the details: docs/trainer.md): the Trainer's own flow, pointed
at a checkpoint that layercheck assembles. Only the Trainer knows how to
continue its data stream, and it decides that from ``trainer_state.json``
before any callback runs, so ``resume_checkpoint()`` writes a Trainer
checkpoint folder ``<directory>/resume/checkpoint-<t>/`` for the newest
recoverable step t (``trainer_state.json`` from the Trainer state every
committed step carries as extra state, ``config.json``, the composite
``model.safetensors``; no pickle), and ``on_train_begin`` restores the
composite of exactly step t over everything with the same lifecycle as any
loop (``LayerCheck.restore(t, exact=True)``). The RNG states are set again
before the first resumed step when the Trainer skipped batches of a partly
trained epoch. A Trainer resumed at a step the directory cannot restore, or
started fresh over a directory that holds checkpoints, is refused with an
error that names the fix rather than silently mixed.

With ``tiers=TierConfig(...)`` (``layercheck.tiers``) every step is also kept in
the memory tier, and the resume takes the step a tiered restore takes: after a
process failure, exactly the failure step. ``resume_checkpoint()`` then builds
the folder from that step's memory copy (``tiers.inventory.memory_composite``)
and ``on_train_begin`` restores it with ``LayerCheck.restore()``, refusing if
the tiers have moved since.

What resume does not carry: the Trainer's ``log_history`` (it grows with every
log entry; each committed step would rewrite it whole), the RNG draws of
an evaluation that ran at step t (made after the state was captured), and the
FLOPs the Trainer adds to ``total_flos`` at its next log (after ``on_step_end``).
Single-process training only (no DDP, DeepSpeed or FSDP through this callback).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .checkpoint import LayerCheck
from .contract.config import LayerCheckConfig
from .contract.errors import CheckpointNotFound, LayerCheckError
from .modelfolder import composite, publish, write_model
from .backends.layermap import LayerMap
from .storage.location import local_directory
from .storage.manifest import ManifestView, read_manifest
from .recovery import read_state
from .rlstate import RL_STATE_KEY, RlState, check_arguments, generation_span, replay_epochs
from .snapshot import apply_rng, capture_rng
from .storage.localstore import LocalStore
from .tiers.config import TierConfig
from .storage.store import Store
from .storage.location import open_store

__all__ = ["LayerCheckCallback", "TRAINER_STATE_KEY"]

TRAINER_STATE_KEY = "trainer_state"
"""The key under which every committed step's extra state holds the Trainer state."""
RESUME_FOLDER = "resume"
RESUME_MARKER = ".layercheck-resume"
_NOT_CARRIED = ("log_history",)


class LayerCheckCallback(TrainerCallback):
    """Checkpoints a Trainer's model and optimizer layer by layer into ``directory``.

    ``config`` is the ``LayerCheckConfig`` (default: the paper's); ``layer_map``
    overrides the detected layers; ``storage_options`` go to fsspec for URL
    directories; ``tiers`` adds the memory tier (``layercheck.tiers``: one process,
    so no buddy). ``layercheck`` is the live ``LayerCheck`` while training runs;
    ``restored_step`` the step the last ``train()`` started from.
    """

    def __init__(self, directory: "str | os.PathLike[str] | Store",
                 config: LayerCheckConfig | None = None, *, layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 tiers: TierConfig | None = None) -> None:
        if tiers is not None and not isinstance(tiers, TierConfig):
            raise TypeError(f"tiers must be a TierConfig, got {type(tiers).__name__}: build it "
                            "with layercheck.tiers.TierConfig(...)")
        if config is not None and not isinstance(config, LayerCheckConfig):
            raise TypeError(f"config must be a LayerCheckConfig, got {type(config).__name__}: "
                            "build it with LayerCheckConfig(...)")
        if layer_map is not None and not isinstance(layer_map, LayerMap):
            raise TypeError(f"layer_map must be a LayerMap, got {type(layer_map).__name__}: "
                            "build it with LayerMap.auto(model) or LayerMap.explicit(model, {...})")
        self.directory = directory
        self.config = config or LayerCheckConfig()
        self.layer_map = layer_map
        self.storage_options = dict(storage_options or {})
        self.tiers = tiers
        self._memory_step: int | None = None
        """The step ``resume_checkpoint()`` took from the memory tier, if it did."""
        self.layercheck: LayerCheck | None = None
        self.restored_step: int | None = None
        """The step the last ``train()`` started from (0: a fresh start)."""
        self._model: torch.nn.Module | None = None
        self._trainer: Any = None
        self._rl: RlState | None = None
        self._rng_to_sync: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None

    # -- before train() --------------------------------------------------------
    def resume_checkpoint(self, into: "str | os.PathLike[str] | None" = None, *,
                          trainer: Any = None) -> str | None:
        """The folder to pass as ``trainer.train(resume_from_checkpoint=...)``, or None
        when the directory holds no recoverable step (then train from scratch).

        ``trainer``: the trainer this callback is attached to, so that what it holds
        beside the policy (a reference model, reward models and functions, TRL's
        generations: ``layercheck.rlstate``) is checked and carried; required for
        TRL's GRPOTrainer, optional otherwise.

        Writes a Trainer checkpoint of the newest recoverable step t (composite
        weights, ``config.json``, ``trainer_state.json``) to ``into`` (default:
        ``<directory>/resume``, replacing what an earlier call left there) and
        returns ``<into>/checkpoint-<t>``; ``into`` must be new, empty, or an
        earlier ``into``. Raises ``ModelMismatch`` when the directory was written
        for another model than the Trainer's."""
        if trainer is not None:
            if self not in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
                raise LayerCheckError("trainer= is not a trainer this callback is attached to: "
                                      "pass the trainer made with callbacks=[callback]")
            self._trainer = trainer
        store = self._open_existing()
        if store is None:
            return None
        store.lock()
        try:
            return self._write_resume_folder(store, into)
        finally:
            store.unlock()

    def _open_existing(self) -> Store | None:
        """The directory's store, or None for a local directory that does not exist
        (asking is no reason to create it; for a URL, an empty prefix is harmless)."""
        directory = self.directory
        local = local_directory(directory) if isinstance(directory, (str, os.PathLike)) else None
        if local is not None:  # any form of a local directory (a path, file://, local://, ...)
            if not Path(local).is_dir():
                return None
            return open_store(local, create=False)
        return open_store(directory, **self.storage_options)

    def _write_resume_folder(self, store: Store,
                             into: "str | os.PathLike[str] | None") -> str | None:
        view = read_manifest(store)
        self._memory_step = None
        if view.header is None:
            return None
        if self._model is not None:
            layer_map = self.layer_map or LayerMap.for_model(self._model, self.config.layers)
            layer_map.check_signature(view.header["layers"])
        memory = self._memory(store, view)
        if memory is not None:
            step, doc, tensors = memory
            trainer_state = self._trainer_state_of(store, step, doc)
        elif not view.states:
            return None
        else:
            plan, tensors = composite(store, view)
            step = plan.step
            trainer_state = self._trainer_state_of(store, step, read_state(store, plan.state)[1])
        root = Path(into) if into is not None else self._default_resume_root(store)
        _claim(root)

        def build(staging: Path) -> None:
            write_model(staging, store, step, self._with_aliases(tensors))
            TrainerState(**trainer_state).save_to_json(str(staging / "trainer_state.json"))

        target = root / f"checkpoint-{step}"
        publish(target, build)
        self._memory_step = step if memory is not None else None
        return str(target)

    def _memory(self, store: Store, view: ManifestView
                ) -> tuple[int, dict[str, Any], dict[str, torch.Tensor]] | None:
        """The step a tiered restore takes from the memory tier (``tiers``), its state
        document and weights; None without tiers or where the restore is storage's."""
        if self.tiers is None:
            return None
        from .tiers.inventory import memory_composite
        return memory_composite(store, view, self.tiers.folder_for(store.url))

    def _with_aliases(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The composite's weights and buffers, a tied weight also under its second
        name (the Trainer loads by name and would report the alias as missing)."""
        if self._model is not None:
            owner = {p.data_ptr(): n for n, p in self._model.named_parameters()}
            for name, value in self._model.state_dict().items():
                source = owner.get(value.data_ptr())
                if name not in tensors and source in tensors:
                    tensors[name] = tensors[source].clone()
        return tensors

    def _default_resume_root(self, store: Store) -> Path:
        if not isinstance(store, LocalStore):
            raise LayerCheckError(
                f"{store.url} is not a local directory and the Trainer resumes from local "
                "folders only: call resume_checkpoint(into='some/local/folder')")
        return store.root / RESUME_FOLDER

    def _trainer_state_of(self, store: Store, step: int, doc: Mapping[str, Any]
                          ) -> dict[str, Any]:
        """The Trainer state step ``step``'s state document ``doc`` carries."""
        saved = (doc.get("extra") or {}).get(TRAINER_STATE_KEY)
        if not isinstance(saved, dict):
            raise LayerCheckError(
                f"{store.url}: step {step} carries no Trainer state (it was not written by "
                "LayerCheckCallback); resume it with LayerCheck.restore() in your own loop, or "
                "give the callback a new directory")
        known = {f.name for f in dataclasses.fields(TrainerState)}
        return {k: v for k, v in saved.items() if k in known}

    # -- the Trainer's events ------------------------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self._model = model
        _check_supported(args)
        check_arguments(args, self.config.interval)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: torch.nn.Module | None = None,
                       optimizer: Any = None, lr_scheduler: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        _check_supported(args)
        if self.layercheck is not None:  # an earlier train() of this process ended abruptly
            self.layercheck.close()
        self._model = model
        lc = LayerCheck(model, _torch_optimizer(optimizer), self.directory, self.config,
                        scheduler=lr_scheduler, layer_map=self.layer_map,
                        storage_options=self.storage_options, tiers=self.tiers)
        try:
            self._restore(lc, state.global_step)
            self._restore_rl(lc, args, state, train_dataloader)
        except BaseException:
            lc.close()
            raise
        self.layercheck = lc
        self.restored_step = state.global_step
        self._rng_to_sync = (capture_rng() if state.global_step > 0 and _skips_batches(
            args, state, train_dataloader) else None)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        if self._rng_to_sync is not None:
            apply_rng(*self._rng_to_sync)
            self._rng_to_sync = None

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self.layercheck is None:
            raise LayerCheckError("LayerCheckCallback saw a step before train began: add it "
                                  "with Trainer(callbacks=[...]) or trainer.add_callback()")
        extra = {TRAINER_STATE_KEY: _carried_state(state)}
        if self._rl is not None:
            extra[RL_STATE_KEY] = self._rl.state()
        self.layercheck.step(extra=extra)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.layercheck is not None:
            try:
                self.layercheck.close()
            finally:
                self.layercheck = None

    # -- restore -----------------------------------------------------------------
    def _restore_rl(self, lc: LayerCheck, args: TrainingArguments, state: TrainerState,
                    train_dataloader: Any) -> None:
        """What a generating trainer holds beside the policy (``layercheck.rlstate``):
        checked and loaded back at a resume, recorded from here on."""
        self._rl = None
        if self._trainer is None:
            if generation_span(args) is not None:
                raise LayerCheckError(
                    "this trainer generates completions against a reference model and reward "
                    "functions that LayerCheckCallback must see to check and carry them: call "
                    "trainer.train(resume_from_checkpoint=callback.resume_checkpoint("
                    "trainer=trainer))")
            return
        self._rl = RlState(self._trainer)
        if state.global_step > 0:
            self._rl.restore((lc.extra or {}).get(RL_STATE_KEY), state.global_step, lc.store.url)
            replay_epochs(train_dataloader,
                          state.global_step // _updates_per_epoch(args, state, train_dataloader))

    def _restore(self, lc: LayerCheck, trainer_step: int) -> None:
        """Make LayerCheck's timeline start where the Trainer's does, or refuse."""
        view = read_manifest(lc.store)
        newest = view.latest_step()
        where = lc.store.url
        if self.tiers is not None and trainer_step > 0 and trainer_step == self._memory_step:
            restored = lc.restore()  # the tiers' newest: the step the folder was built from
            if restored != trainer_step:
                raise LayerCheckError(
                    f"the Trainer resumed at step {trainer_step}, taken from the memory tier, "
                    f"but the tiers now restore step {restored} (another run wrote to them "
                    "since): call callback.resume_checkpoint() right before trainer.train()")
            return
        if self.tiers is not None and trainer_step == 0 and view.header is not None:
            memory = self._memory(lc.store, view)
            newest = max(newest or 0, memory[0]) if memory is not None else newest
        if trainer_step == 0:
            if newest is not None:
                raise LayerCheckError(
                    f"{where} holds checkpoints up to step {newest} but the Trainer starts at "
                    "step 0: resume with trainer.train(resume_from_checkpoint="
                    "callback.resume_checkpoint()), or give the callback a new directory")
            lc.restore()
            return
        try:
            lc.restore(trainer_step, exact=True)
        except CheckpointNotFound as exc:
            raise LayerCheckError(
                f"the Trainer resumed at step {trainer_step} but {where} cannot restore that "
                f"step ({exc}): resume with trainer.train(resume_from_checkpoint="
                "callback.resume_checkpoint()), which points the Trainer at the step "
                "layercheck restores") from None


def _claim(root: Path) -> None:
    """Make ``root`` an empty folder of ours: what an earlier resume left there is
    derived data, but a folder we did not write is never deleted."""
    marker = root / RESUME_MARKER
    if root.exists() and any(root.iterdir()) and not marker.exists():
        raise LayerCheckError(f"{root} exists and was not written by resume_checkpoint(): pass "
                              "a new or empty folder as into=")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    marker.write_text("written by layercheck's LayerCheckCallback.resume_checkpoint(), which "
                      "replaces this folder at every call\n")


def _check_supported(args: TrainingArguments) -> None:
    if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
        raise LayerCheckError("LayerCheckCallback checkpoints single-process training; remove "
                              "the deepspeed/fsdp training arguments to use it")
    if args.world_size > 1:
        raise LayerCheckError(f"LayerCheckCallback checkpoints single-process training, but this "
                              f"run has {args.world_size} processes: run it as one process")


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under accelerate's wrapper: its step hooks are the ones that fire."""
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    if not isinstance(inner, torch.optim.Optimizer):
        raise LayerCheckError(f"the Trainer's optimizer is a {type(optimizer).__name__}, not a "
                              "torch optimizer: use a torch optimizer (TrainingArguments.optim)")
    return inner


def _carried_state(state: TrainerState) -> dict[str, Any]:
    """The Trainer state a resume needs, JSON-ready (see the module docstring)."""
    # field by field: asdict() would deep-copy log_history, which grows with every log entry
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
            if f.name not in _NOT_CARRIED}


def _skips_batches(args: TrainingArguments, state: TrainerState, dataloader: Any) -> bool:
    """Whether the Trainer, resuming at ``state.global_step``, skips batches of a
    partly trained epoch (its ``_init_training_state`` rule)."""
    if args.ignore_data_skip:
        return False
    per_epoch = _updates_per_epoch(args, state, dataloader)
    return per_epoch > 0 and state.global_step % per_epoch > 0


def _updates_per_epoch(args: TrainingArguments, state: TrainerState, dataloader: Any) -> int:
    """The Trainer's optimizer steps per epoch (its ``num_update_steps_per_epoch``)."""
    try:
        batches = len(dataloader)
    except TypeError:
        batches = None
    accumulation = args.gradient_accumulation_steps
    return (max(batches // accumulation + int(batches % accumulation > 0), 1)
            if batches else state.max_steps)
