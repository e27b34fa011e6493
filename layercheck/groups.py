"""Layer-aligned optimizer parameter groups.

DeepSpeed ZeRO flattens each optimizer parameter group into one partitioned
tensor per rank, with one Adam state per flat tensor. For a layer's slice of
the optimizer state to be found (on write and on recovery), no group may mix
layers. ``layer_aligned_param_groups`` splits a model's parameters into two
groups per layer, one with weight decay and one without, keeping the usual
policy (no decay for biases, norms and embeddings-free 1-D tensors) or a
rule of your own. The LLMTailor tool does the same surgery.

    groups = layer_aligned_param_groups(model, weight_decay=0.01)
    optimizer = torch.optim.AdamW(groups, lr=2e-5)

Every group carries ``layercheck_layer`` (the layer's name), which torch and
DeepSpeed ignore and layercheck uses to check the alignment.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .backends.layermap import LayerMap

__all__ = ["layer_aligned_param_groups", "default_no_decay"]


def default_no_decay(name: str, param: nn.Parameter) -> bool:
    """The common rule (HF Trainer, nanoGPT): biases and 1-D tensors (norm
    weights) get no weight decay; matrices, embeddings included, do."""
    return name.endswith("bias") or len(getattr(param, "ds_shape", param.shape)) < 2


def layer_aligned_param_groups(model: nn.Module, *, weight_decay: float,
                               layer_map: LayerMap | None = None,
                               no_decay: Callable[[str, nn.Parameter], bool] = default_no_decay,
                               **hyper: Any) -> list[dict[str, Any]]:
    """Two groups per layer (decayed, not decayed), in layer order; empty groups
    are left out. ``hyper`` (lr, betas, ...) goes into every group."""
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay}: use 0 or more")
    layer_map = layer_map or LayerMap.auto(model)
    groups = []
    for i, layer in enumerate(layer_map.layers):
        params = [(n, p) for n, p in layer_map.parameters(i) if p.requires_grad]
        decayed = [p for n, p in params if not no_decay(n, p)]
        plain = [p for n, p in params if no_decay(n, p)]
        for members, wd in ((decayed, weight_decay), (plain, 0.0)):
            if members:
                groups.append({"params": members, "weight_decay": wd,
                               "layercheck_layer": layer.name, **hyper})
    return groups
