"""What the memory tiers hold, read offline: for ``python -m layercheck inspect`` and ``plan``.

A node's folder holds ``rank<r>/`` (rank r's own slots) and ``ward<w>/`` (the
slots it keeps for rank w, as that rank's buddy). ``tier_plan`` reads every
folder given (one per node; default: the folders under this machine's default
location for the directory), verifies every item, and says which tier each
layer of each rank would come from at the next restore (``choice.choose``, as
a live restore chooses it, in the layout of the job that wrote last: copies of
another layout left out, a sharded layer of one step on every rank; copies
off the directory's lineage, of a timeline a restore abandoned, listed as
"abandoned" and left out; storage's training state counted where its newest
one verifies). ``memory_composite`` reads the step such a restore takes from
memory as a model folder needs it (the Trainer callback's resume folder).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..contract.errors import CorruptVersion
from ..storage.format import module_tensors, read_state_document
from ..storage.layerread import read_verified_file
from ..storage.layout import Layout
from ..storage.manifest import ManifestView
from ..storage.store import Store
from .choice import STORAGE, Choice, Copy, choose
from .config import TierConfig
from .shards import sharded, tier_layout, usable
from .slots import Slot, off_lineage, tensors_from

__all__ = ["default_folders", "copies_in", "abandoned", "tier_plan", "memory_composite",
           "format_tier_plan"]


def default_folders(url: str) -> list[str]:
    """The node folders under the default location for the directory ``url``."""
    parent = Path(TierConfig(node="x").folder_for(url)).parent
    return sorted(str(p) for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []


def copies_in(folder: str, job: str, num_layers: int, holder_base: int) -> list[Copy]:
    """Every committed slot of run ``job`` in one node's ``folder``, items verified.
    A ward's copy is held by a rank other than its own (``holder_base``, negative,
    stands for it: offline, who holds it does not matter, only that it is not
    the rank itself)."""
    out = []
    for where in sorted(Path(folder).glob("*")):
        kind = "rank" if where.name.startswith("rank") else "ward"
        number = where.name[len(kind):]
        if not where.is_dir() or not number.isdigit():
            continue
        of = int(number)
        for k in (0, 1):
            slot = Slot(where, k)
            marker = slot.marker()
            if marker is None or marker.get("document", {}).get("job") != job:
                continue
            ok = {}
            for name, item in marker["items"].items():
                try:
                    slot.read(name, item)
                    ok[name] = True
                except CorruptVersion:
                    ok[name] = False
            out.append(Copy(of, of if kind == "rank" else holder_base - of, kind, k,
                            int(marker["step"]), ok.get("state", False),
                            tuple(ok.get(f"L{i}", False) for i in range(num_layers)), marker))
    return out


def abandoned(view: ManifestView, copy: Copy) -> str | None:
    """Why ``copy`` is off the directory's lineage (``storage.lineage``: a timeline a
    restore abandoned), in words starting with "abandoned"; None where it is on it."""
    return off_lineage(view.lineage, copy.marker)


def _choice(store: Store, view: ManifestView, folders: Sequence[str]
            ) -> tuple[list[Copy], Choice | None]:
    """Every copy in ``folders`` and the choice a restore of the newest step makes."""
    from .tiered import job_of
    names = view.layer_names
    copies = [c for n, folder in enumerate(folders)
              for c in copies_in(folder, job_of(view), len(names), -1000 * (n + 1))]
    live = [c for c in copies if abandoned(view, c) is None]
    durable = None
    for step in sorted(view.states, reverse=True):
        try:
            for shard in view.states[step].per_rank():
                read_verified_file(store, shard)
        except CorruptVersion:
            continue
        durable = step
        break
    newest = view.layouts[max(view.layouts)] if view.layouts else Layout.of_header(view.header)
    own = tier_layout(newest.world_size, newest.facts, newest.id)  # the last job's layout
    chosen = [c for c in live if usable(c.marker.get("document", {}).get("layout"), own)]
    return copies, choose(chosen, newest.world_size, len(names), durable,
                          [[v.step for v in view.versions.get(name, [])] for name in names],
                          aligned=sharded(own))


def memory_composite(store: Store, view: ManifestView, folder: str
                     ) -> tuple[int, dict[str, Any], dict[str, torch.Tensor]] | None:
    """For an unsharded directory whose next restore takes its step from the memory
    tier in ``folder``: (that step, its training state's document, the module's
    weights and buffers by name, each layer from the copy the restore takes: a
    memory slot, or storage's version). None where the restore is storage's."""
    from .tiered import durable_layer
    if view.world_size != 1:
        return None
    _, choice = _choice(store, view, [folder])
    if choice is None or choice.state[0] is None:
        return None
    tensors: dict[str, torch.Tensor] = {}
    for i, (name, c) in enumerate(zip(view.layer_names, choice.layers[0])):
        if c is None:
            layer = durable_layer(store, view, name, choice.step)
        else:
            item = c.marker["items"][f"L{i}"]
            slot = Slot(Path(folder) / f"{c.kind}{c.of}", c.k)
            layer = tensors_from(slot.read(f"L{i}", item), item["tensors"])
        tensors.update({key: t.clone() for key, t in module_tensors(layer).items()})
    return choice.step, read_state_document(choice.state[0].marker["document"]), tensors


def tier_plan(store: Store, view: ManifestView, folders: Sequence[str]) -> dict[str, Any]:
    """Per rank, per layer: the tier and step the next restore of the newest step
    would take (see the module doc); JSON-ready."""
    names = view.layer_names
    copies, choice = _choice(store, view, folders)
    info: dict[str, Any] = {"folders": list(folders), "copies": [
        {"rank": c.of, "tier": c.tier(), "step": c.step, "state": c.state,
         "layers_intact": sum(c.layers), "layers": len(c.layers),
         "abandoned": abandoned(view, c)} for c in copies]}
    if choice is None:
        return {**info, "step": None, "ranks": []}
    ranks = []
    for r in range(len(choice.state)):
        layers = []
        for name, (tier, step) in zip(names, choice.sources(r)):
            if step is None:
                older = [v.step for v in view.versions.get(name, []) if v.step <= choice.step]
                step = max(older) if older else None
            layers.append({"layer": name, "tier": tier, "step": step,
                           "staleness": None if step is None else choice.step - step})
        state = choice.state[r]
        ranks.append({"rank": r, "state": state.tier() if state is not None else STORAGE,
                      "layers": layers})
    return {**info, "step": choice.step, "ranks": ranks}


def format_tier_plan(info: dict[str, Any]) -> str:
    lines = [f"memory tiers: {', '.join(info['folders']) or 'none found'}"]
    for c in info["copies"]:
        what = f"  rank {c['rank']}'s copy of step {c['step']} ({c['tier']}): "
        if c.get("abandoned"):
            lines.append(f"{what}{c['abandoned']}: not used")
            continue
        lines.append(f"{what}{c['layers_intact']}/{c['layers']} layers intact, state "
                     f"{'intact' if c['state'] else 'damaged'}")
    if info["step"] is None:
        lines.append("no tier holds a step every rank can restore")
        return "\n".join(lines)
    lines.append(f"a restore now takes step {info['step']}:")
    lines.append(f"{'rank':>4} {'layer':<32} {'tier':<8} {'step':>6} {'stale':>6}")
    for rank in info["ranks"]:
        lines.append(f"{rank['rank']:>4} {'(training state)':<32} {rank['state']:<8} "
                     f"{info['step']:>6} {0:>6}")
        for layer in rank["layers"]:
            step = "-" if layer["step"] is None else layer["step"]
            stale = "-" if layer["staleness"] is None else layer["staleness"]
            lines.append(f"{rank['rank']:>4} {layer['layer']:<32} {layer['tier']:<8} "
                         f"{step:>6} {stale:>6}")
    return "\n".join(lines)
