"""Composite recovery: plan which version of each layer to use, then load it.

The plan for step T: the newest committed training state at or before T (the
resume point t), and for every layer the newest committed version at or
before t whose checksum verifies. A corrupt version is passed over with a
warning in favour of the one before it, down to the base checkpoint; a layer
with no good version at all makes step t unrecoverable (CheckpointNotFound).
"""
from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from safetensors.torch import load as st_load

from .errors import CheckpointNotFound, CorruptVersion
from .manifest import ManifestView, Version, read_verified
from .store import Store

__all__ = ["Plan", "make_plan", "parse_safetensors", "LoadedLayer", "iter_layers"]


@dataclass
class Plan:
    """Where each piece of the composite state of ``step`` comes from."""

    step: int
    state: Version
    sources: dict[str, Version]
    warnings: list[str] = field(default_factory=list)

    def staleness(self) -> dict[str, int]:
        return {name: self.step - v.step for name, v in self.sources.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step,
                "layers": [{"layer": n, "source_step": v.step, "staleness": self.step - v.step,
                            "file": v.file, "bytes": v.bytes, "reason": v.reason}
                           for n, v in self.sources.items()],
                "bytes": sum(v.bytes for v in self.sources.values()),
                "warnings": list(self.warnings)}


def parse_safetensors(data: bytes, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors blob (no pickle); CorruptVersion if malformed."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        metadata = header.get("__metadata__", {}) or {}
        return st_load(data), metadata
    except Exception as exc:  # a damaged file can fail in many ways; all mean 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None


def _newest_good(store: Store, versions: list[Version], verify: bool,
                 warnings: list[str], what: str) -> tuple[Version, bytes | None]:
    for version in sorted(versions, key=lambda v: v.step, reverse=True):
        if not verify:
            return version, None
        try:
            return version, read_verified(store, version)
        except CorruptVersion as exc:
            warnings.append(f"{what}: skipping the version of step {version.step}: {exc}")
    raise CheckpointNotFound(f"{what}: no intact committed version"
                             + (f" ({len(versions)} tried, all damaged)" if versions else ""))


def make_plan(store: Store, view: ManifestView, step: int | None = None, *,
              verify: bool = True) -> Plan:
    """The composite plan for ``step`` (default: the newest committed step).

    The training state is always verified (it is small); ``verify`` says
    whether the layer versions are read and verified too."""
    if view.header is None:
        raise CheckpointNotFound(f"{store.url}: not a layercheck checkpoint (no manifest header)")
    if not view.states:
        raise CheckpointNotFound(f"{store.url}: no recoverable step yet (training stopped before "
                                 "the base checkpoint)")
    target = view.latest_step() if step is None else step
    eligible = [v for s, v in view.states.items() if s <= target]
    if not eligible:
        raise CheckpointNotFound(f"no recoverable step at or before {target}; the oldest is "
                                 f"{min(view.states)}")
    warnings: list[str] = []
    state, _ = _newest_good(store, eligible, True, warnings, "training state")
    sources = {}
    for name in view.layer_names:
        versions = [v for v in view.versions.get(name, []) if v.step <= state.step]
        if not versions:
            raise CheckpointNotFound(f"layer {name} has no committed version at or before step "
                                     f"{state.step}")
        sources[name], _ = _newest_good(store, versions, verify, warnings, f"layer {name}")
    return Plan(step=state.step, state=state, sources=sources, warnings=warnings)


@dataclass
class LoadedLayer:
    name: str
    version: Version
    tensors: dict[str, torch.Tensor]
    load_s: float


def iter_layers(store: Store, view: ManifestView, plan: Plan,
                layer_names: list[str]) -> Iterator[LoadedLayer]:
    """Load each planned layer once, verified; a layer whose planned version
    turns out corrupt now falls back to its next older intact version (and
    the fallback is noted in ``plan.warnings``)."""
    for name in layer_names:
        start = time.perf_counter()
        version = plan.sources[name]
        candidates = [v for v in view.versions.get(name, []) if v.step <= version.step]
        version, data = _newest_good(store, candidates, True, plan.warnings, f"layer {name}")
        plan.sources[name] = version
        tensors, _ = parse_safetensors(data, version.file)  # type: ignore[arg-type]
        yield LoadedLayer(name, version, tensors, time.perf_counter() - start)
