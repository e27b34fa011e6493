"""LoRA adapters (PEFT): found in a live model, recorded, measured and merged. No PEFT import.

A PEFT LoRA layer wraps a frozen ``base_layer`` (weight W) with trainable
``lora_A[<adapter>]`` (A, r x in) and ``lora_B[<adapter>]`` (B, out x r) and a
``scaling[<adapter>]`` s; its effective weight is W + s·B·A (transposed where
``fan_in_fan_out``). ``lora_modules(model)`` finds them by that structure (duck
typing: PEFT need not be importable here; DoRA and several active adapters are
other arithmetic: checkpointed as any model, not merged); ``describe(model)`` gives what a
directory records of them (``format``: ``adapter_config.json`` and the header's
``lora``); ``LoraFacts`` reads that back offline, and ``merged_weights`` /
``adapter_weights`` give an export the merged model and the adapter alone in
PEFT's own layout (``PeftModel.from_pretrained`` loads it).

Drift (``AdapterDrift``, used by ``drift.DriftTracker``; the choice is argued in
docs/lora.md): for a layer whose LoRA modules train, the paper's d_l is taken
of the effective weights: per module, |s(B_t A_t - B_{t-1} A_{t-1})|_1 joins the
layer's sum of moved weight and |W + s B_t A_t|_1 its sum of weight, in place of
A's and B's own terms and of W's (frozen) size. So d_l still says how far the
layer's function moved relative to its weights, as under full fine-tuning,
and the thresholds keep their meaning. Exact (no sampling): it keeps a copy of
A and B (the adapter's own size) and forms B·A twice a step per module
(out x in x r multiply-adds each).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..contract.errors import LayerCheckError, ModelMismatch

__all__ = ["LoraModule", "LoraFacts", "lora_modules", "describe", "check_unchanged",
           "merged_weights", "adapter_weights", "AdapterDrift", "PEFT_PREFIX", "UNCOMPARED"]

PEFT_PREFIX = "base_model.model."
"""Where a PeftModel puts the wrapped model's parameter names."""


@dataclass(frozen=True)
class LoraModule:
    """One LoRA-wrapped linear module: its path in the model and its adapter's terms."""

    path: str
    adapter: str
    scaling: float
    fan_in_fan_out: bool

    @property
    def weight(self) -> str:
        return f"{self.path}.base_layer.weight"

    @property
    def a(self) -> str:
        return f"{self.path}.lora_A.{self.adapter}.weight"

    @property
    def b(self) -> str:
        return f"{self.path}.lora_B.{self.adapter}.weight"

    def delta(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """s·B·A as PEFT's ``get_delta_weight`` computes it (same operations, same order)."""
        product = b @ a
        return (product.T if self.fan_in_fan_out else product) * self.scaling


def _adapter_of(model: nn.Module) -> str | None:
    name = getattr(model, "active_adapter", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if len(name) == 1 else None
    return name if isinstance(name, str) else None


def lora_modules(model: nn.Module) -> tuple[list[LoraModule], str | None]:
    """The LoRA linear modules of ``model`` and their active adapter (none if not a LoRA
    model), and what makes a module other than W + s·B·A (several adapters active,
    DoRA), if any: such a model is checkpointed like any other, its drift taken of
    its own parameters and its export refused (``LoraFacts.unsupported``)."""
    found, problem = [], None
    for path, module in model.named_modules():
        lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
        scaling = getattr(module, "scaling", None)
        if not (isinstance(lora_a, nn.ModuleDict) and isinstance(lora_b, nn.ModuleDict)
                and isinstance(scaling, dict) and hasattr(module, "base_layer") and lora_a):
            continue
        active = [a for a in getattr(module, "active_adapters", list(lora_a)) if a in lora_a]
        magnitude = getattr(module, "lora_magnitude_vector", None)
        if len(active) != 1:
            problem = problem or f"{path} has {len(active)} LoRA adapters active"
        elif magnitude is not None and active[0] in magnitude:
            problem = problem or f"{path} is a DoRA adapter (use_dora=True)"
        else:
            found.append(LoraModule(path, active[0], float(scaling[active[0]]),
                                    bool(getattr(module, "fan_in_fan_out", False))))
    return (found, None) if problem is None else ([], problem)


def describe(model: nn.Module) -> tuple[dict[str, Any], bytes] | None:
    """(the header's ``lora`` fact, PEFT's ``adapter_config.json``) of a LoRA model;
    None for any other model."""
    modules, problem = lora_modules(model)
    if problem is not None:
        return {"adapter": "", "modules": {}, "unsupported": problem}, b""
    if not modules:
        return None
    adapter = modules[0].adapter
    configs = getattr(model, "peft_config", None)
    config = configs.get(adapter) if isinstance(configs, dict) else None
    fact = {"adapter": adapter, "modules": {m.path: {"scaling": m.scaling,
                                                     "fan_in_fan_out": m.fan_in_fan_out}
                                            for m in modules}}
    text = b"" if config is None else json.dumps(
        config.to_dict(), indent=2, sort_keys=True, default=_json_value).encode()
    return fact, text


UNCOMPARED = frozenset({
    # how training or loading runs, not what the adapter's tensors mean
    "lora_dropout", "inference_mode", "base_model_name_or_path", "revision", "peft_version",
    "auto_mapping", "runtime_config", "megatron_core",
    # the PeftModel class that wraps it (the modules_to_save it implies: the signature)
    "task_type",
    # how the adapter was initialised: the restored tensors replace what it gave
    "init_lora_weights", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
    # which modules carry it, and their rank and scaling: the header's lora fact compares
    # the outcome (each module and its scaling), the layers' signature every shape
    "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern",
    "rank_pattern", "alpha_pattern"})
"""Keys of PEFT's adapter config a resumed run may change. Every other key present in
both the recorded ``adapter_config.json`` and the live model's is compared on resume
(``check_unchanged``): lora_alpha, r, use_rslora, fan_in_fan_out, bias (which
biases the adapter holds), modules_to_save, use_dora, lora_bias, a newer PEFT's
variants."""


def check_unchanged(fact: Mapping[str, Any] | None, config: bytes | None,
                    model: nn.Module) -> None:
    """ModelMismatch, naming what differs and the fix, unless ``model``'s adapter is the
    one a directory recorded: its header's ``lora`` fact (``fact``: each module, its
    scaling s and fan_in_fan_out, the adapter's name; None where the header predates
    it) and ``adapter_config.json`` (``config``; keys but ``UNCOMPARED``). The stored
    A and B mean W + s·B·A under the recorded s: trained on under another, the run, its
    header and its exports would disagree (the merged export's logits would not be the
    live model's)."""
    if fact is None:
        return
    live = describe(model)
    problems = [_fact_change(fact, live[0] if live is not None else None)]
    if config and live is not None and live[1]:
        problems.append(_config_change(config, live[1]))
    problem = "; ".join(p for p in problems if p) or None
    if problem is not None:
        raise ModelMismatch(
            f"the LoRA adapter is not the one this checkpoint was trained with: {problem}; "
            "its stored A and B mean W + s·B·A under the recorded facts: build the LoraConfig "
            "as that run did, or to change it, export the weights (python -m layercheck export) "
            "and start a new run from them in a new directory")


def _fact_change(saved: Mapping[str, Any], live: Mapping[str, Any] | None) -> str | None:
    """What differs between two ``lora`` header facts, or None."""
    if live is None:
        return "this model has no LoRA adapter"
    if saved.get("unsupported") != live.get("unsupported"):
        return (f"it was {saved.get('unsupported') or 'plain LoRA'}, it is "
                f"{live.get('unsupported') or 'plain LoRA'}")
    if saved.get("adapter") != live.get("adapter"):
        return f"the active adapter was {saved.get('adapter')!r}, it is {live.get('adapter')!r}"
    mine, theirs = live.get("modules") or {}, saved.get("modules") or {}
    for path in sorted(set(mine) ^ set(theirs)):
        return f"{path} {'carries' if path in mine else 'carried'} LoRA only " + \
            ("here" if path in mine else "in the checkpoint")
    for path in sorted(mine):
        for key in ("scaling", "fan_in_fan_out"):
            if mine[path].get(key) != theirs[path].get(key):
                hint = " (lora_alpha / r, or / sqrt(r) under use_rslora)" if key == "scaling" else ""
                return (f"{path}: {key} {mine[path].get(key)} here, "
                        f"{theirs[path].get(key)} in the checkpoint{hint}")
    return None


def _config_change(saved: bytes, live: bytes) -> str | None:
    """The keys of two adapter configs (JSON) that differ but ``UNCOMPARED``, or None."""
    try:
        mine, theirs = json.loads(live), json.loads(saved)
    except ValueError:
        return None  # an unreadable record: the lora fact was compared
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return None
    changed = [f"{key} {theirs[key]!r} in the checkpoint, {mine[key]!r} here"
               for key in sorted(set(mine) & set(theirs) - UNCOMPARED) if mine[key] != theirs[key]]
    return "; ".join(changed) or None


def _json_value(value: Any) -> Any:
    """What PEFT's own ``save_pretrained`` writes for what JSON lacks: sets as lists,
    enums (``PeftType``, ``TaskType``) as their values."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):
        return value.value
    raise TypeError(f"{type(value).__name__} in the adapter config is not JSON-serialisable")


@dataclass(frozen=True)
class LoraFacts:
    """The header's ``lora`` fact, read back (offline, for an export)."""

    adapter: str
    modules: tuple[LoraModule, ...]

    @classmethod
    def from_header(cls, header: Mapping[str, Any] | None, url: str) -> "LoraFacts | None":
        fact = (header or {}).get("lora")
        if fact is None:
            return None
        fix = "restore into the PEFT model and use its own save_pretrained or merge_and_unload"
        if fact.get("unsupported"):
            raise LayerCheckError(f"{url} was written from a PEFT model whose adapter is not "
                                  f"plain LoRA ({fact['unsupported']}), which export does not "
                                  f"merge or write: {fix}")
        try:
            adapter = fact["adapter"]
            modules = tuple(LoraModule(path, adapter, float(m["scaling"]),
                                       bool(m["fan_in_fan_out"]))
                            for path, m in fact["modules"].items())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LayerCheckError(f"{url}: the header's lora record is damaged ({exc!r}): "
                                  f"{fix}") from None
        return cls(adapter, modules)


def merged_weights(tensors: Mapping[str, torch.Tensor], facts: LoraFacts) -> dict[str, torch.Tensor]:
    """The wrapped model's own state dict with every adapter merged (W + s·B·A), under
    the names ``from_pretrained`` of the base architecture expects."""
    out = dict(tensors)
    for m in facts.modules:
        try:
            w, a, b = out.pop(m.weight), out.pop(m.a), out.pop(m.b)
        except KeyError as exc:
            raise LayerCheckError(f"the composite has no {exc.args[0]}, which the header's lora "
                                  "record names: the checkpoint is not of this LoRA model") from None
        out[m.weight] = w + m.delta(a, b)
        lora_bias = out.pop(m.b.removesuffix(".weight") + ".bias", None)
        if lora_bias is not None:  # lora_bias: B's bias, merged as PEFT merges it
            if f"{m.path}.base_layer.bias" not in out:
                raise LayerCheckError(f"{m.path} has a LoRA bias (lora_bias) but no bias of its "
                                      "own: the merged model has nowhere to put it; export the "
                                      "adapter alone (--adapter)")
            out[f"{m.path}.base_layer.bias"] = out[f"{m.path}.base_layer.bias"] + \
                lora_bias * m.scaling
    merged = {}
    for name, tensor in out.items():
        if ".lora_" in name or ".original_module." in name:
            continue  # another adapter's terms (not active), or what modules_to_save replaced
        name = name.replace(".base_layer.", ".").replace(
            f".modules_to_save.{facts.adapter}.", ".")
        merged[name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name] = tensor
    return merged


def adapter_weights(tensors: Mapping[str, torch.Tensor], facts: LoraFacts,
                    bias: str = "none") -> dict[str, torch.Tensor]:
    """The adapter alone under the keys PEFT's own ``save_pretrained`` writes
    (``get_peft_model_state_dict``, which ``PeftModel.from_pretrained`` reads back): the
    active adapter's LoRA weights (and lora_B's bias), the biases its ``bias`` option
    saves (``"all"``: every bias; ``"lora_only"``: those of the LoRA modules), each
    with the adapter's name taken out, and each modules_to_save module's weights
    under the module's own name (``score.weight``, not ``score.modules_to_save.weight``)."""
    name = facts.adapter
    lora = {m.path for m in facts.modules}
    out = {}
    for key, tensor in tensors.items():
        if f".lora_A.{name}." in key or f".lora_B.{name}." in key or (
                bias == "all" and key.endswith(".bias")) or (
                bias == "lora_only" and key.endswith(".base_layer.bias")
                and key.removesuffix(".base_layer.bias") in lora):
            out[_without_adapter(key, name)] = tensor
    marker = f".modules_to_save.{name}."
    out.update({key.replace(marker, "."): tensor for key, tensor in tensors.items()
                if marker in key})
    if not out:
        raise LayerCheckError(f"the composite holds no weights of adapter {name!r}")
    return out


def _without_adapter(key: str, adapter: str) -> str:
    """``key`` with the adapter's name taken out where PEFT takes it out: its last part
    (a parameter) or the one before it (a module's, ``lora_A.<adapter>.weight``)."""
    parts = key.split(".")
    if parts[-1] == adapter:
        return ".".join(parts[:-1])
    if len(parts) > 1 and parts[-2] == adapter:
        return ".".join(parts[:-2] + parts[-1:])
    return key


@dataclass(frozen=True)
class _Term:
    layer: int
    module: LoraModule
    w: torch.Tensor
    a: nn.Parameter
    b: nn.Parameter


class AdapterDrift:
    """Each LoRA module's share of its layer's drift, on its effective weight (module doc).

    ``terms``: (layer index, module, W, A, B). ``params()``: the A and B whose own
    drift this replaces; ``weights()``: the W whose frozen size it replaces.
    ``sums(layers)`` after each optimizer step: per layer (sum moved, sum size);
    ``resync()`` after a restore replaced A and B."""

    def __init__(self, terms: Sequence[tuple[int, LoraModule, torch.Tensor, nn.Parameter,
                                             nn.Parameter]]) -> None:
        self._terms = [_Term(*t) for t in terms]
        self._previous: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.resync()

    def params(self) -> set[int]:
        return {id(p) for t in self._terms for p in (t.a, t.b)}

    def weights(self) -> set[int]:
        return {id(t.w) for t in self._terms}

    def resync(self) -> None:
        self._previous = [(t.a.detach().clone(), t.b.detach().clone()) for t in self._terms]

    def sums(self, layers: int) -> tuple[np.ndarray, np.ndarray]:
        moved, size = np.zeros(layers), np.zeros(layers)
        with torch.no_grad():
            for t, (a0, b0) in zip(self._terms, self._previous):
                now = t.module.delta(t.a, t.b)
                moved[t.layer] += float((now - t.module.delta(a0, b0)).abs().sum())
                size[t.layer] += float((t.w + now).abs().sum())
                a0.copy_(t.a)
                b0.copy_(t.b)
        return moved, size


def drift_terms(model: nn.Module, layer_of: Mapping[str, int]
                ) -> list[tuple[int, LoraModule, torch.Tensor, nn.Parameter, nn.Parameter]]:
    """The ``AdapterDrift`` terms of ``model``'s LoRA modules whose A and B train;
    ``layer_of``: each parameter name's layer index."""
    params = dict(model.named_parameters())
    terms = []
    for m in lora_modules(model)[0]:
        w, a, b = params.get(m.weight), params.get(m.a), params.get(m.b)
        if w is None or a is None or b is None or not (a.requires_grad and b.requires_grad):
            continue
        terms.append((layer_of[m.a], m, w, a, b))
    return terms
