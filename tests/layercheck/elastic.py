"""The workers' side of the elastic tests (issue 30): the whole tensors each rank's state
gathers to, whatever its layout.

``gathered`` (a ZeRO engine's partitions, all-gathered and cut by the test's own
arithmetic, not ``layercheck.backends.partitioning``'s) and ``plain_state`` (a module's)
give, per parameter, its fp32 master, Adam moments and step count as whole
tensors: what a test compares across layouts.
"""
from __future__ import annotations

from typing import Any

import torch


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
