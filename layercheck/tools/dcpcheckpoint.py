"""The composite of an FSDP2 directory as whole tensors, and as a DCP checkpoint.

A directory written by ``FsdpLayerCheck`` holds one shard per rank of each
layer version: the local slices of every parameter and of its Adam moments
(``param/<name>``, ``optim/<field>/<name>``), Adam's step, the layer's
buffers (``layercheck.storage.format``). The header's ``fsdp`` record
(``FsdpFacts``) says how they tile: each parameter's global shape, the dim
it is sharded along, its dtype; the optimizer's groups by parameter name;
the state-dict keys that alias a parameter (a tied head).

``assemble`` joins every rank's slices of each planned layer version, in
rank order along the shard dim (FSDP2's ``Shard(d)``: rank r holds chunk r
of ``torch.chunk(w, world_size, d)``), into whole tensors (``Composite``).
``dcp_state`` lays them out as ``torch.distributed.checkpoint.state_dict``'s
``get_state_dict(model, optimizer)`` does (keys are canonical FQNs: wrapper
prefixes such as ``_checkpoint_wrapped_module.`` removed), plus the LR
scheduler's state and the step:

    {"model": {fqn: weight or buffer, tied keys included},
     "optim": {"state": {fqn: {"step", "exp_avg", "exp_avg_sq"}},
               "param_groups": [{hyper-parameters of step T, "params": [fqn, ...]}]},
     "scheduler": the scheduler's state_dict at T (when there was one),
     "layercheck": {"step": T, "extra": the JSON of T's extra}}

so that ``dcp.load`` reads it into a fresh FSDP2 model and optimizer at any
world size (DCP reshards whole tensors into each rank's shards). Each Adam
step count is the layer's own, saved with its moments, as ``restore()``
gives: training on from the export is training on from a restore.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from ..contract.errors import CorruptVersion, LayerCheckError
from ..backends.elastic import ElasticRead
from ..storage.format import Layout, Version
from ..storage.manifest import ManifestView
from ..recovery import Plan, Planner
from ..storage.store import Store

__all__ = ["FsdpFacts", "Composite", "assemble", "layout_facts", "dcp_state", "save_dcp", "fqn"]

WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Module-path segments that wrappers add and state-dict FQNs leave out
(activation checkpointing, torch.compile, FSDP1), as torch's ``_get_fqns`` does."""


def fqn(name: str) -> str:
    """``name`` (a parameter's name in the live model) as a state-dict FQN."""
    for wrapper in WRAPPERS:
        name = name.replace(wrapper, "")
    return name


@dataclass(frozen=True)
class FsdpFacts:
    """What the header says about the FSDP2 job that wrote a directory."""

    world_size: int
    shapes: dict[str, tuple[int, ...]]
    dims: dict[str, int]
    param_groups: tuple[tuple[str, ...], ...]
    aliases: dict[str, str]

    @classmethod
    def from_header(cls, header: Mapping[str, Any] | None, url: str) -> "FsdpFacts":
        facts = (header or {}).get("fsdp")
        if not isinstance(facts, dict):
            raise LayerCheckError(f"{url} was not written by FsdpLayerCheck: --format dcp exports "
                                  "FSDP2 directories (--format hf exports any directory)")
        try:
            params = facts["params"]
            return cls(world_size=int(facts["world_size"]),
                       shapes={n: tuple(int(x) for x in p["shape"]) for n, p in params.items()},
                       dims={n: int(p["dim"]) for n, p in params.items()},
                       param_groups=tuple(tuple(g) for g in facts["param_groups"]),
                       aliases=dict(facts.get("aliases", {})))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # int(inf)
            raise CorruptVersion(f"{url}: the header's fsdp record is malformed "
                                 f"({exc!r})") from None

    def whole(self, name: str, slices: list[torch.Tensor]) -> torch.Tensor:
        """Every rank's slice of parameter ``name`` (or of a tensor shaped like it),
        joined in rank order; LayerCheckError unless they tile its shape."""
        if name not in self.shapes:
            raise LayerCheckError(f"{name} is in a layer file but not in the header's fsdp "
                                  "record: the directory mixes two models")
        joined = torch.cat(slices, self.dims[name])
        if tuple(joined.shape) != self.shapes[name]:
            raise CorruptVersion(f"{name}: the ranks' shards join to {tuple(joined.shape)}, "
                                 f"the header says {self.shapes[name]}")
        return joined


@dataclass
class Composite:
    """Whole tensors of a composite state, by the parameters' names in the live model."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Per parameter, its optimizer state (empty where it never stepped)."""
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def assemble(store: Store, view: ManifestView, plan: Plan, facts: FsdpFacts | None, *,
             moments: bool = True) -> Composite:
    """The whole tensors of ``plan``'s layer versions (every rank's shard read and
    verified, one layer at a time, a partial version completed by its frozen parameters
    as a restore completes it); ``moments=False`` leaves out the optimizer state. Each
    version is joined by its own layout's facts (``view.layouts``), a plain module's
    taken whole (``format``: layouts); a version of no recorded layout by ``facts``."""
    out = Composite()
    planner = Planner(store, view)
    for version in plan.sources.values():
        layout = view.layouts.get(version.layout)
        facts_of = facts if layout is None else layout_facts(layout, store.url)
        _join(version, planner.reader(version), facts_of, out, moments)
    return out


def layout_facts(layout: Layout, url: str) -> FsdpFacts | None:
    """The facts that join a version of ``layout``: FSDP2's, or None for a plain module's
    (one whole file); LayerCheckError for another backend's, which cannot be joined."""
    if layout.backend is None:
        return None
    if layout.backend != "fsdp":
        raise LayerCheckError(f"{url}: a version of layout {layout.id} was written by "
                              f"{layout.describe()}, whose flat partitions an FSDP2 export "
                              "cannot join: restore it under FsdpLayerCheck and let its layers "
                              "be written again, or export --format hf")
    return FsdpFacts.from_header(layout.header(), url)


def _join(version: Version, read: ElasticRead, facts: FsdpFacts | None, out: Composite,
          moments: bool) -> None:
    """Add ``version``'s whole tensors (each rank's file through ``read``) to ``out``: its
    shards joined by ``facts``, or (None) a plain module's one file, which holds them
    whole. Copies: nothing keeps a file's bytes alive."""
    if facts is not None and len(version.shards) != facts.world_size:
        raise LayerCheckError(f"{version.file}: {len(version.shards)} shards, but its layout "
                              f"says {facts.world_size} ranks")
    join = facts.whole if facts is not None else lambda _, slices: slices[0].clone()
    shards = [read.tensors(rank) for rank in range(len(version.per_rank()))]
    for key in shards[0]:
        kind, _, rest = key.partition("/")
        slices = _slices(shards, key, version.file)
        if kind == "param":
            out.weights[rest] = join(rest, slices)
            out.optimizer.setdefault(rest, {})
        elif kind == "buffer":
            out.buffers[rest] = slices[0].clone()  # FSDP2 keeps buffers whole on every rank
        elif kind == "optim" and moments:
            name_field, _, name = rest.partition("/")
            out.optimizer.setdefault(name, {})[name_field] = (
                slices[0].clone() if slices[0].dim() == 0 else join(name, slices))


def _slices(shards: list[dict[str, torch.Tensor]], key: str, file: str) -> list[torch.Tensor]:
    missing = [r for r, s in enumerate(shards) if key not in s]
    if missing:
        raise CorruptVersion(f"{file}: rank {missing[0]}'s shard has no {key}")
    return [s[key] for s in shards]


def dcp_state(composite: Composite, facts: FsdpFacts, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The state dict the module doc describes, for step ``doc["step"]`` (``doc``:
    the training state document of that step)."""
    model = {fqn(n): w for n, w in composite.weights.items()}
    model.update({fqn(n): b for n, b in composite.buffers.items()})
    for key, target in facts.aliases.items():
        model[fqn(key)] = model[fqn(target)]
    saved = doc["param_groups"]
    if len(saved) != len(facts.param_groups):
        raise CorruptVersion(f"the training state of step {doc['step']} has {len(saved)} "
                             f"parameter groups, the header {len(facts.param_groups)}")
    groups = [{**{k: tuple(v) if k == "betas" else v for k, v in hyper.items()},
               "params": [fqn(n) for n in names]}
              for hyper, names in zip(saved, facts.param_groups)]
    state: dict[str, Any] = {
        "model": model,
        "optim": {"state": {fqn(n): s for n, s in composite.optimizer.items() if s},
                  "param_groups": groups},
        "layercheck": {"step": int(doc["step"]), "extra": json.dumps(doc.get("extra"))}}
    if doc.get("scheduler") is not None:
        state["scheduler"] = doc["scheduler"]
    return state


def save_dcp(state: dict[str, Any], folder: Path) -> None:
    """``state`` as a DCP checkpoint in ``folder``, written by this one process."""
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():  # that it saves in one process is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
