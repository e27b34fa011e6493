"""The workers' side of the elastic tests (issue 30): a restore from a directory written
at another world size, and the whole tensors each rank's state gathers to.

``elastic_restore`` is a LOCAL STAND-IN for ``LayerCheck.restore()`` at another
world size until helper CORE's plumbing (layouts in the manifest, the planner,
``read`` over verified rank files) is on branch i30-core: it plans the composite
of the old directory's newest step (each layer's newest version), gives each layer
to the source's elastic reader with a ``read`` over the old rank files, puts back
the training state of rank min(r, W-1), and opens the new timeline in the new
directory, which then holds versions of the new layout only.

``gathered`` (a ZeRO engine's partitions, all-gathered and cut by the test's own
arithmetic, not ``layercheck.partitioning``'s) and ``plain_state`` (a module's)
give, per parameter, its fp32 master, Adam moments and step count as whole
tensors: what a test compares across layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from layercheck.manifest import read_manifest
from layercheck.recovery import parse_safetensors, read_state
from layercheck.snapshot import apply_state, check_state
from layercheck.store import open_store
from tests.layercheck.torchrun import newest_versions


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Stand-in for ``format.Layout`` (the interface CORE lands)."""

    id: int = 0
    world_size: int
    facts: Mapping[str, Any] = field(default_factory=dict)


def elastic_restore(lc, old: str, rank: int, apply_layer) -> tuple[int, dict[str, int]]:
    """Restore ``lc`` (on a new, empty directory) from the newest step of ``old``;
    ``apply_layer(i, written, read)`` loads layer i. (step, each layer's source step)."""
    store, view = open_store(old), read_manifest(open_store(old))
    header = view.header
    written = Layout(world_size=view.world_size,
                     facts={"zero": header["zero"]} if "zero" in header else {})
    step = view.latest_step()
    sources = newest_versions(old, step)
    files: dict[str, dict[str, torch.Tensor]] = {}
    for i, name in enumerate(lc.layer_map.names):
        version = sources[name]

        def read(r: int, key: str, start: int, stop: int, version=version) -> torch.Tensor:
            path = version.shards[r].file if version.shards else version.file
            if path not in files:
                files[path] = parse_safetensors(store.read(path), path)[0]
            return files[path][key].reshape(-1)[start:stop]
        apply_layer(i, written, read)
    state = view.states[step].per_rank()
    tensors, doc = read_state(store, state[min(rank, len(state) - 1)])
    check_state(doc, lc.source.optimizer, lc.source.group_members(), lc.scheduler)
    apply_state(tensors, doc, lc.source.optimizer, lc.scheduler)
    lc.source.after_restore(doc["engine"], step)
    lc._begin_timeline(step, read_manifest(lc.store))  # the new directory starts at `step`
    return step, {name: v.step for name, v in sources.items()}


def gathered(parts) -> dict[str, dict[str, Any]]:
    """Per optimized parameter of a ``zero.Partitions``: its whole fp32 master and Adam
    moments, all-gathered from every rank's flat partitions, and its step count;
    ``padding``: how many padding elements of this rank's partitions are nonzero. A
    collective."""
    import torch.distributed as dist
    world = dist.get_world_size()
    out: dict[str, dict[str, Any]] = {}
    nonzero = 0
    for k, flat in enumerate(parts.flats):
        state = parts.optimizer.state[flat]
        fields = {"master": flat, "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
        everyone = {}
        for what, tensor in fields.items():
            parts_of = [torch.empty_like(tensor) for _ in range(world)]
            dist.all_gather(parts_of, tensor.detach().contiguous())
            everyone[what] = parts_of
        names = [n for n, _ in parts.describe()[k]["params"]]
        numels = [p.ds_numel if parts.stage == 3 else p.numel() for p in parts.members[k]]
        valid = torch.zeros(flat.numel(), dtype=torch.bool)
        offset, me = 0, dist.get_rank()
        for name, numel in zip(names, numels):
            entry = {"step": float(state["step"])}
            for what, ranks in everyone.items():
                if parts.stage == 3:  # each rank: ceil(numel / W) of each parameter
                    part = -(-numel // world)
                    entry[what] = torch.cat([r[offset:offset + part] for r in ranks])[:numel].clone()
                else:  # each rank: a slice of the group's concatenation
                    entry[what] = torch.cat(ranks)[offset:offset + numel].clone()
            if parts.stage == 3:
                valid[offset:offset + max(0, min(part, numel - me * part))] = True
                offset += part
            else:
                low = me * flat.numel()
                a, b = max(offset, low), min(offset + numel, low + flat.numel())
                valid[max(0, a - low):max(0, b - low)] = True if a < b else False
                offset += numel
            out[name] = entry
        nonzero += sum(int((t.detach()[~valid] != 0).sum()) for t in fields.values())
    out["padding"] = {"nonzero": nonzero}
    return out


def plain_state(lc) -> dict[str, dict[str, Any]]:
    """The same for a single process: each optimized parameter, its moments and step."""
    out = {}
    for i in range(len(lc.layer_map)):
        for name, p in lc.layer_map.parameters(i):
            state = lc.optimizer.state.get(p)
            if state:
                out[name] = {"master": p.detach().clone().float().reshape(-1),
                             "exp_avg": state["exp_avg"].clone().reshape(-1),
                             "exp_avg_sq": state["exp_avg_sq"].clone().reshape(-1),
                             "step": float(state["step"])}
    out["padding"] = {"nonzero": 0}
    out["module"] = {n: p.detach().clone().double() for n, p in lc.model.named_parameters()}
    return out
