"""Export the composite state of a step as a model folder for evaluation.

``export_model`` writes ``config.json`` (the Hugging Face config recorded when
the checkpoint was created, if the model had one) and ``model.safetensors``
(every parameter and persistent buffer under its name in the model), so
``AutoModel*.from_pretrained(out)`` loads it. The folder appears whole or not
at all (built beside it, then renamed).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from safetensors.torch import save_file

from .checkpoint import MODEL_CONFIG
from .errors import LayerCheckError
from .manifest import read_manifest
from .recovery import Plan, iter_layers, make_plan, parse_safetensors
from .store import Store

__all__ = ["export_model"]


def export_model(store: Store, out: str | os.PathLike[str], *, step: int | None = None) -> Plan:
    """Write the composite model of ``step`` (default newest) to folder ``out``."""
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise LayerCheckError(f"{target} exists and is not empty; choose a new --out folder")
    view = read_manifest(store)
    plan = make_plan(store, view, step, verify=False)
    tensors = {}
    for loaded in iter_layers(store, view, plan, view.layer_names):
        for key, tensor in loaded.tensors.items():
            kind, _, name = key.partition("/")
            if kind in ("param", "buffer"):
                tensors[name] = tensor
    staging = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir(parents=True)
    try:
        save_file(tensors, staging / "model.safetensors",
                  metadata={"format": "pt", "layercheck_step": str(plan.step)})
        if store.exists(MODEL_CONFIG):
            config = json.loads(store.read(MODEL_CONFIG))
            (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "layercheck_plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return plan
