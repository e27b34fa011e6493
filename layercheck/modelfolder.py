"""A checkpoint's step as a model folder ``from_pretrained`` loads: the composite, its files.

``composite`` reads the plan of a step of an unsharded directory and the module's
weights and buffers of that composite; ``write_model`` writes them as
``model.safetensors`` beside the recorded ``config.json``, ``write_adapter`` a LoRA
model's adapter alone as PEFT writes it; ``publish`` makes a folder appear whole or
not at all (built beside it, then renamed). The Trainer callback saves its model
folders with them, and ``python -m layercheck export`` its ``--format hf`` export.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from .contract.errors import LayerCheckError
from .recovery import Plan, Planner
from .storage.format import ADAPTER_CONFIG, MODEL_CONFIG, module_tensors, parse_model_config
from .storage.manifest import ManifestView
from .storage.store import Store

__all__ = ["composite", "write_model", "write_adapter", "model_config", "publish"]


def write_adapter(folder: Path, store: Store, step: int, tensors: dict[str, torch.Tensor]) -> None:
    """``adapter_model.safetensors`` and ``adapter_config.json`` as PEFT's
    ``save_pretrained`` writes them (the config the directory recorded, for inference)."""
    if not store.exists(ADAPTER_CONFIG):
        raise LayerCheckError(f"{store.url} holds no {ADAPTER_CONFIG} (the model had no "
                              "peft_config): export the merged model without --adapter")
    config = parse_model_config(store.read(ADAPTER_CONFIG), ADAPTER_CONFIG)
    config["inference_mode"] = True  # as PeftModel.save_pretrained writes it
    _save(tensors, folder / "adapter_model.safetensors", step)
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_model(folder: Path, store: Store, step: int, tensors: dict[str, torch.Tensor]) -> None:
    """``model.safetensors`` (``tensors``, the composite of ``step``) and the model's
    ``config.json`` (if the directory recorded one), for ``from_pretrained``."""
    _save(tensors, folder / "model.safetensors", step)
    config = model_config(store)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _save(tensors: dict[str, torch.Tensor], path: Path, step: int) -> None:
    """``save_file`` of ``tensors`` (the composite of ``step``) to ``path``, a new file,
    left with the mode of any new file (0666 less the umask, as ``config.json`` beside
    it gets): safetensors writes a private temporary file (0600) and renames it."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = stat.S_IMODE(os.stat(path).st_mode)
    save_file(tensors, path, metadata={"format": "pt", "layercheck_step": str(step)})
    os.chmod(path, mode)


def model_config(store: Store) -> dict[str, Any] | None:
    """The Hugging Face config the directory recorded (``MODEL_CONFIG``), or None if it
    recorded none; CorruptVersion saying the fix if it is damaged."""
    return parse_model_config(store.read(MODEL_CONFIG)) if store.exists(MODEL_CONFIG) else None


def composite(store: Store, view: ManifestView,
              step: int | None = None) -> tuple[Plan, dict[str, torch.Tensor]]:
    """The plan of ``step`` (default: the newest) of an unsharded directory, and
    the module's weights and buffers of that composite by their names (each
    layer read once, verified, falling back past a damaged version)."""
    tensors: dict[str, torch.Tensor] = {}
    plan = Planner(store, view).plan(step, use=lambda _, t: tensors.update(  # copies: a
        {name: tensor.clone() for name, tensor in module_tensors(t).items()}))  # layer at a time
    return plan, tensors


def publish(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build`` in a staging folder beside ``target``, then rename it into place."""
    staging = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir(parents=True)
    try:
        build(staging)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
