"""The layer map: which parameters (and persistent buffers) form each layer.

A layer is the unit of persistence. Auto-detection finds the model's block
container (its largest ``nn.ModuleList``): each block is a layer, and every
other parameter joins the layer named by its module path one level below
what it shares with the container. That one rule gives, for example:

- Qwen2 / Llama causal LMs: ``model.embed_tokens``, ``model.layers.0`` ...,
  ``model.norm``, ``lm_head`` (a tied ``lm_head`` is the embedding: one layer);
- BERT encoders: ``bert.embeddings`` (or ``embeddings``), ``bert.encoder.layer.0``
  ..., ``bert.pooler``, ``classifier``;
- a generic model with a ModuleList of blocks: one layer per block, the rest
  grouped by their top-level module.

Or give it explicitly: ``{"layer name": ["parameter.prefix", ...]}``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch
from torch import nn

from ..contract.errors import ModelMismatch
from ..storage.format import LAYER_STEM_MAX, layer_stem

__all__ = ["Layer", "LayerMap", "numel"]

KINDS = ("embedding", "block", "norm", "head")


@dataclass(frozen=True)
class Layer:
    """One layer: its parameters and persistent buffers, by their names in the model."""

    name: str
    kind: str
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    numel: int
    nbytes: int
    """Bytes of the parameters alone (the optimizer state comes on top)."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "params": self.numel,
                "weight_bytes": self.nbytes, "tensors": len(self.params) + len(self.buffers)}


class LayerMap:
    """An ordered partition of a model's parameters into layers."""

    def __init__(self, model: nn.Module, layers: Sequence[Layer]) -> None:
        self.layers = tuple(layers)
        self._params = dict(_named_params(model))
        self._buffers = dict(_persistent_buffers(model))
        self.index = {layer.name: i for i, layer in enumerate(self.layers)}
        self._check_partition()
        self._check_file_names()

    # -- construction ------------------------------------------------------
    @classmethod
    def for_model(cls, model: nn.Module,
                  layers: Mapping[str, Sequence[str]] | None = None) -> "LayerMap":
        """``explicit(model, layers)`` when layers are given, else ``auto(model)``."""
        return cls.explicit(model, layers) if layers else cls.auto(model)

    @classmethod
    def auto(cls, model: nn.Module) -> "LayerMap":
        """Detect the layers of ``model`` (see the module docstring)."""
        container = _block_container(model)
        groups: dict[str, list[str]] = {}
        for name in [*_named_params(model).keys(), *_persistent_buffers(model).keys()]:
            groups.setdefault(_group_of(name, container), []).append(name)
        return cls._from_groups(model, groups)

    @classmethod
    def explicit(cls, model: nn.Module, mapping: Mapping[str, Sequence[str]]) -> "LayerMap":
        """Layers from ``{layer name: [parameter-name prefixes]}``; each tensor goes
        to the layer with the longest matching prefix, and every parameter must
        find one."""
        groups: dict[str, list[str]] = {name: [] for name in mapping}
        orphans = []
        for name in [*_named_params(model).keys(), *_persistent_buffers(model).keys()]:
            best = max(((len(p), layer) for layer, prefixes in mapping.items() for p in prefixes
                        if name == p or name.startswith(p + ".")), default=None)
            if best is None:
                orphans.append(name)
            else:
                groups[best[1]].append(name)
        if orphans:
            raise ModelMismatch(f"explicit layer map leaves {len(orphans)} tensors without a layer "
                                f"(first: {orphans[:3]}); add prefixes that cover them")
        empty = [name for name, members in groups.items() if not members]
        if empty:
            raise ModelMismatch(f"explicit layers {empty} match no parameter of the model; "
                                "check the prefixes against model.named_parameters()")
        return cls._from_groups(model, groups)

    @classmethod
    def _from_groups(cls, model: nn.Module, groups: Mapping[str, list[str]]) -> "LayerMap":
        params, buffers = _named_params(model), _persistent_buffers(model)
        modules = dict(model.named_modules())
        layers = []
        for name, members in groups.items():
            p_names = tuple(m for m in members if m in params)
            b_names = tuple(m for m in members if m in buffers)
            if not p_names:
                continue  # buffers alone (e.g. a rotary cache) do not make a layer
            layers.append(Layer(
                name=name, kind=_kind(name, p_names, modules),
                params=p_names, buffers=b_names,
                numel=sum(numel(params[p]) for p in p_names),
                nbytes=sum(numel(params[p]) * params[p].element_size() for p in p_names)))
        return cls(model, _attach_buffer_only(layers, groups, params))

    # -- queries -----------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    @property
    def kinds(self) -> list[str]:
        return [layer.kind for layer in self.layers]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    def parameters(self, i: int) -> list[tuple[str, nn.Parameter]]:
        return [(n, self._params[n]) for n in self.layers[i].params]

    def buffers(self, i: int) -> list[tuple[str, torch.Tensor]]:
        return [(n, self._buffers[n]) for n in self.layers[i].buffers]

    def describe(self) -> list[dict[str, object]]:
        """Per layer: name, kind, parameter count, weight bytes, tensor count."""
        return [layer.describe() for layer in self.layers]

    def signature(self) -> list[dict[str, object]]:
        """What a checkpoint records to recognise the model: names, kinds, sizes."""
        return [{"name": l.name, "kind": l.kind, "params": l.numel, "weight_bytes": l.nbytes}
                for l in self.layers]

    def check_signature(self, recorded: Sequence[Mapping[str, object]]) -> None:
        """ModelMismatch unless ``recorded`` (from a checkpoint) describes this model's
        layers: names, sizes and (where recorded) bytes, i.e. the dtype."""
        mine = {(l["name"], l["params"]) for l in self.signature()}
        theirs = {(str(l["name"]), int(l["params"])) for l in recorded}  # type: ignore[arg-type]
        if mine != theirs:
            missing = sorted(n for n, _ in theirs - mine)[:4]
            extra = sorted(n for n, _ in mine - theirs)[:4]
            raise ModelMismatch(
                "the checkpoint was written for a different model: layers or sizes differ "
                f"(in checkpoint only: {missing}; in this model only: {extra}); "
                "load the same architecture, or use another checkpoint directory")
        nbytes = {l.name: l.nbytes for l in self.layers}
        for layer in recorded:
            saved = layer.get("weight_bytes")
            if saved is not None and int(saved) != nbytes[str(layer["name"])]:  # type: ignore[call-overload]
                raise ModelMismatch(
                    f"layer {layer['name']} has {nbytes[str(layer['name'])]} bytes of weights "
                    f"here but {saved} in the checkpoint: another dtype (bf16 against fp32?); "
                    "load the model in the dtype it was trained in")

    def _check_partition(self) -> None:
        if not self.layers:  # a header must list the model's layers (format.RECORD_SCHEMAS)
            raise ModelMismatch("the model has no parameters or persistent buffers: there is "
                                "nothing to checkpoint; pass the model that training updates")
        seen: dict[str, str] = {}
        for layer in self.layers:
            for member in (*layer.params, *layer.buffers):
                if member in seen:
                    raise ModelMismatch(f"{member} is in layers {seen[member]} and {layer.name}; "
                                        "each tensor must belong to exactly one layer")
                seen[member] = layer.name
        missing = sorted(set(self._params) - seen.keys())
        if missing:
            raise ModelMismatch(f"parameters without a layer: {missing[:3]}")

    def _check_file_names(self) -> None:
        """Every layer's files get a name of their own (``format.layer_stem``), checked
        now rather than at the base checkpoint, hundreds of steps in."""
        fix = ("name the layers yourself: LayerCheckConfig(layers={'short_name': "
               "['parameter.prefix', ...], ...})")
        seen: dict[str, str] = {}
        for name in self.names:
            stem = layer_stem(name)
            if len(stem) > LAYER_STEM_MAX:
                raise ModelMismatch(f"layer {name[:60]!r}... is too long a name for a file "
                                    f"({len(stem)} characters, at most {LAYER_STEM_MAX}): {fix}")
            other = seen.setdefault(stem.lower(), name)  # lower: case-insensitive filesystems
            if other != name:
                raise ModelMismatch(f"layers {other!r} and {name!r} would share the file name "
                                    f"{layer_stem(other)!r} (files keep ASCII letters, digits "
                                    f"and '._-' and may ignore case): {fix}")


def numel(p: torch.Tensor) -> int:
    """Elements of a parameter, also when DeepSpeed ZeRO-3 has partitioned it
    away (its local tensor is then empty and ``ds_numel`` holds the count)."""
    return int(getattr(p, "ds_numel", p.numel()))


def _named_params(model: nn.Module) -> dict[str, nn.Parameter]:
    # named_parameters() de-duplicates tied weights: a tied lm_head appears once.
    return dict(model.named_parameters())


def _persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    keys = set(model.state_dict(keep_vars=True).keys())
    return {n: b for n, b in model.named_buffers() if n in keys}


def _block_container(model: nn.Module) -> str | None:
    """The path of the ModuleList holding the most parameters (None if there is none)."""
    best, best_size = None, 0
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 2:
            size = sum(numel(p) for p in module.parameters())
            if size > best_size:
                best, best_size = path, size
    return best


def _group_of(tensor_name: str, container: str | None) -> str:
    parts = tensor_name.split(".")
    if container is not None:
        cparts = container.split(".") if container else []
        if parts[:len(cparts)] == cparts and len(parts) > len(cparts) + 1:
            return ".".join(parts[:len(cparts) + 1])  # container.<i>
        common = 0
        while common < min(len(cparts), len(parts) - 1) and parts[common] == cparts[common]:
            common += 1
        return ".".join(parts[:common + 1]) if common + 1 < len(parts) else tensor_name
    return parts[0] if len(parts) > 1 else tensor_name


def _kind(name: str, params: Sequence[str], modules: Mapping[str, nn.Module]) -> str:
    owners = [modules.get(p.rsplit(".", 1)[0] if "." in p else "") for p in params]
    if any(isinstance(m, nn.Embedding) for m in owners):
        return "embedding"
    module = modules.get(name)
    if isinstance(module, nn.ModuleList) or (module is not None and _is_block(name, modules)):
        return "block"
    if owners and all(m is not None and "norm" in type(m).__name__.lower() for m in owners):
        return "norm"
    return "head"


def _is_block(name: str, modules: Mapping[str, nn.Module]) -> bool:
    parent, _, index = name.rpartition(".")
    return index.isdigit() and isinstance(modules.get(parent), nn.ModuleList)


def _attach_buffer_only(layers: list[Layer], groups: Mapping[str, list[str]],
                        params: Mapping[str, nn.Parameter]) -> list[Layer]:
    """Buffers whose group has no parameters join the first layer, so that
    every persistent buffer is saved somewhere."""
    orphans = tuple(m for name, members in groups.items()
                    if not any(x in params for x in members) for m in members)
    if not orphans or not layers:
        return layers
    first = layers[0]
    layers[0] = Layer(name=first.name, kind=first.kind, params=first.params,
                      buffers=first.buffers + orphans, numel=first.numel, nbytes=first.nbytes)
    return layers
