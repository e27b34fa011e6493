"""What a layer version and a step's training state hold, captured and applied.

Layer version (one safetensors file): for every parameter ``n`` of the layer
``param/n`` (the weights), ``master/n`` (fp32 master weights, if any),
``optim/<key>/n`` for every tensor of the optimizer state (Adam: exp_avg,
exp_avg_sq, step; max_exp_avg_sq with amsgrad), and ``buffer/n`` for the
layer's persistent buffers.

Training state (one safetensors file): RNG states as tensors, and in the
metadata a JSON document with the step, the optimizer's hyper-parameters, the
LR scheduler's state, the numpy/python RNG scalars and the user's extra state.

Capture copies to host memory (the only work on the training thread);
apply copies back into the live objects. No pickle anywhere.
"""
from __future__ import annotations

import json
import random
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from .errors import CorruptVersion, ModelMismatch
from .layermap import LayerMap

__all__ = ["capture_layer", "apply_layer", "capture_state", "apply_state", "tensors_nbytes"]


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)


def tensors_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def capture_layer(layer_map: LayerMap, optimizer: torch.optim.Optimizer, index: int,
                  masters: Mapping[int, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Host copies of layer ``index``'s weights, master weights, optimizer state and buffers."""
    out: dict[str, torch.Tensor] = {}
    for name, p in layer_map.parameters(index):
        out[f"param/{name}"] = _host(p)
        if masters and id(p) in masters:
            out[f"master/{name}"] = _host(masters[id(p)])
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"optim/{key}/{name}"] = _host(value)
            elif isinstance(value, (int, float)):
                out[f"optim/{key}/{name}"] = torch.tensor(float(value), dtype=torch.float64)
    for name, b in layer_map.buffers(index):
        out[f"buffer/{name}"] = _host(b)
    return out


def apply_layer(layer_map: LayerMap, optimizer: torch.optim.Optimizer, index: int,
                tensors: Mapping[str, torch.Tensor],
                masters: Mapping[int, torch.Tensor] | None = None) -> None:
    """Copy a loaded layer version into the live model and optimizer state."""
    layer = layer_map.layers[index]
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    with torch.no_grad():
        for name, p in layer_map.parameters(index):
            _copy_into(p, tensors, f"param/{name}", layer.name)
            if masters and id(p) in masters and f"master/{name}" in tensors:
                _copy_into(masters[id(p)], tensors, f"master/{name}", layer.name)
            if id(p) in groups:
                optimizer.state[p] = _optimizer_state(p, groups[id(p)], tensors, name)
        for name, b in layer_map.buffers(index):
            _copy_into(b, tensors, f"buffer/{name}", layer.name)


def _copy_into(target: torch.Tensor, tensors: Mapping[str, torch.Tensor], key: str,
               layer: str) -> None:
    if key not in tensors:
        raise ModelMismatch(f"layer {layer}: the saved version has no {key}; "
                            "the checkpoint was written for a different model")
    source = tensors[key]
    if source.shape != target.shape:
        raise ModelMismatch(f"layer {layer}: {key} has shape {tuple(source.shape)} in the "
                            f"checkpoint but {tuple(target.shape)} in the model")
    target.copy_(source)


def _optimizer_state(p: nn.Parameter, group: Mapping[str, Any],
                     tensors: Mapping[str, torch.Tensor], name: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    on_device = bool(group.get("capturable") or group.get("fused"))
    for key, value in tensors.items():
        kind, _, rest = key.partition("/")
        field, _, owner = rest.partition("/")
        if kind != "optim" or owner != name:
            continue
        # the loaded tensors are fresh and ours: adopt them rather than copy
        state[field] = value if field == "step" and not on_device else value.to(p.device)
    return state


# -- training state -----------------------------------------------------------
def capture_state(step: int, optimizer: torch.optim.Optimizer, scheduler: Any,
                  extra: Mapping[str, Any] | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of the small per-step training state."""
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors["rng/numpy"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    py_version, py_internal, py_gauss = random.getstate()
    tensors["rng/python"] = torch.tensor(py_internal, dtype=torch.int64)
    doc = {
        "step": step,
        "param_groups": [{k: v for k, v in g.items() if k != "params"}
                         for g in optimizer.param_groups],
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "extra": dict(extra) if extra is not None else None,
        "rng": {"numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)],
                "python": [py_version, py_gauss]},
    }
    try:
        text = json.dumps(doc, default=_json_default)
    except TypeError as exc:
        raise TypeError(f"layercheck: the training state of step {step} is not JSON-serialisable "
                        f"({exc}); keep extra state to numbers, strings, lists and dicts") from None
    return tensors, {"format": "layercheck-state/1", "state": text}


def _json_default(value: Any) -> Any:
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def apply_state(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str],
                optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore RNG, optimizer hyper-parameters and scheduler; return the state document."""
    try:
        doc = json.loads(metadata["state"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise CorruptVersion(f"training state metadata is unreadable ({exc})") from None
    groups = doc["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ModelMismatch(f"the checkpoint's optimizer has {len(groups)} parameter groups, "
                            f"this one {len(optimizer.param_groups)}; build the optimizer as before")
    for live, saved in zip(optimizer.param_groups, groups):
        for key, value in saved.items():
            live[key] = tuple(value) if isinstance(live.get(key), tuple) else value
    if scheduler is not None and doc["scheduler"] is not None:
        scheduler.load_state_dict(doc["scheduler"])
    torch.set_rng_state(tensors["rng/torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    np_name, np_pos, np_has_gauss, np_gauss = doc["rng"]["numpy"]
    np.random.set_state((np_name, tensors["rng/numpy"].numpy().astype(np.uint32), np_pos,
                         np_has_gauss, np_gauss))
    py_version, py_gauss = doc["rng"]["python"]
    random.setstate((py_version, tuple(int(x) for x in tensors["rng/python"].tolist()), py_gauss))
    return doc
