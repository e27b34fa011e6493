"""Where an FSDP2 layer's tensors live: this rank's DTensor shards (``fully_shard``).

``DTensorShards`` is the layer source of ``layercheck.fsdp.FsdpLayerCheck``: a layer
version holds the local tensor of each parameter and of its Adam moments, no gather.
Layers are the layer map's, not the ``fully_shard`` units: FSDP2 shards every
parameter on its own (dim 0, or the dim its ``shard_placement_fn`` chose), so a
layer's shard is its parameters' local tensors whatever unit holds them; ``units()``
lists which layers each unit holds (the directory's header records it). At another
world size (or from one process's plain versions) a restore reshards on read
(``apply_elastic``, docs/elastic.md): each rank reads the old slices that hold its
new rows of each parameter (dim 0 only). Supported: a 1-D device mesh over all
ranks (FSDP, not HSDP or tensor parallelism), every parameter managed by ``fully_shard``.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .source import local
from .elastic import chunk_rows, needed_ranks, resharded
from ..contract.errors import LayerCheckError, ModelMismatch
from ..storage.format import Layout, optimizer_fields, optimizer_state, tensor_key
from .layermap import LayerMap
from .source import (ModuleSource, capture_optimizer_state, check_state_fields, host,
                     owned, take)

__all__ = ["DTensorShards", "units"]


class DTensorShards(ModuleSource):
    """This rank's shards of an FSDP2 model: a layer version holds, under the
    keys of a plain module's (``param/<name>``, ``optim/<field>/<name>``,
    ``buffer/<name>``), the local tensor of each parameter and of each of its
    optimizer-state tensors, its scalar state (Adam's step) and the layer's
    buffers (which FSDP2 leaves whole on every rank)."""

    resize_advice = ("export it (python -m layercheck export --format dcp) and dcp.load the "
                     "export at the new world size: DCP reshards")

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 layer_map: LayerMap, world_size: int) -> None:
        super().__init__(model, optimizer, layer_map)
        self.world_size = world_size
        self.shard_dims = {name: _shard_dim(name, p, world_size)
                           for i in range(len(layer_map)) for name, p in layer_map.parameters(i)}
        params = {id(p) for i in range(len(layer_map)) for _, p in layer_map.parameters(i)}
        if any(id(p) not in params for g in optimizer.param_groups for p in g["params"]):
            raise LayerCheckError("the optimizer steps tensors that are not the model's "
                                  "parameters: fully_shard replaces every parameter with a "
                                  "DTensor, so create the optimizer after fully_shard")

    def frozen(self, i: int) -> list[str]:
        return []  # every rank's shard holds all of its layer: no partial versions here

    def drift_adapters(self) -> Any:
        return None  # DTensor shards: every tensor counts as itself

    def live(self, key: str) -> torch.Tensor | None:
        return None  # a DTensor holds a shard: no whole parameter here to compare

    def capture(self, i: int) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, p in self.layer_map.parameters(i):
            out[tensor_key("param", name)] = host(local(p))
            state = self.optimizer.state.get(p, {})
            out.update(capture_optimizer_state({k: local(v) for k, v in state.items()}, name))
        return {**out, **self._capture_buffers(i)}

    def check(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Refuse what ``apply`` would, before anything is touched: each parameter's
        saved slice against its local shard (not the whole DTensor), its saved
        optimizer state against the fields its live state holds, and the buffers."""
        layer = self.layer_map.names[i]
        saved = optimizer_state(tensors)
        for name, p in self.layer_map.parameters(i):
            take(tensors, tensor_key("param", name), local(p), layer)
            check_state_fields(layer, name, saved.get(name, {}), self.optimizer.state.get(p, {}))
        self._buffers(i, tensors)

    def apply(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy a loaded shard of layer ``i`` into the local tensors of its parameters
        and make each one's optimizer state: the loaded tensors, adopted as the
        local shards of DTensors placed as the parameter is."""
        layer = self.layer_map.names[i]
        groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        with torch.no_grad():
            for name, p in self.layer_map.parameters(i):
                shard = local(p)
                shard.copy_(take(tensors, tensor_key("param", name), shard, layer))
                if id(p) in groups:
                    self.optimizer.state[p] = self._state(p, name, tensors, groups[id(p)], layer)
            for live, saved in self._buffers(i, tensors):
                live.copy_(saved)

    @staticmethod
    def _state(p: torch.Tensor, name: str, tensors: Mapping[str, torch.Tensor],
               group: Mapping[str, Any], layer: str) -> dict[str, torch.Tensor]:
        from torch.distributed.tensor import DTensor
        shard = local(p)
        on_device = group.get("capturable") or group.get("fused")
        state = {}
        for field, value in optimizer_fields(tensors, name).items():
            if value.dim() == 0:  # Adam's step: a plain tensor, on the host unless capturable
                state[field] = owned(value, shard.device if on_device else "cpu")
                continue
            value = take(tensors, tensor_key("optim", name, field), shard, layer)
            # a copy of the saved tensor (a view of the file) becomes the local shard
            state[field] = DTensor.from_local(owned(value, shard.device), p.device_mesh,
                                              p.placements, shape=p.shape, stride=p.stride())
        return state

    # -- another layout (format: layouts) ------------------------------------------------
    def elastic_ranks(self, i: int, written: Layout) -> list[int]:
        """The old ranks whose slices hold rows of this rank's new ones."""
        return needed_ranks(written, self.layer_map.parameters(i), self._rows)

    def _resharded(self, i: int, written: Layout, read: Any) -> dict[str, torch.Tensor]:
        """Layer ``i`` from a version of FSDP2 at another world size (or of one plain
        process): this rank's rows of every weight and moment, read from the old
        slices that hold them; checked and applied as a same-size shard is
        (``ModuleSource.check_elastic``, ``apply_elastic``)."""
        if written.backend not in (None, "fsdp"):
            raise ModelMismatch(self.cannot_reshard(written))
        return resharded(read, self.layer_map.parameters(i), self.layer_map.buffers(i),
                         self._rows)

    def _rows(self, name: str, p: torch.Tensor) -> tuple[int, int]:
        """The rows of dim 0 of ``name``'s whole tensor that this rank's shard holds."""
        import torch.distributed as dist
        if self.shard_dims[name] != 0:
            raise ModelMismatch(f"this job shards {name} along dim {self.shard_dims[name]} (a "
                                "shard_placement_fn): resharding reads rows of dim 0 only")
        rank = dist.get_rank() if dist.is_initialized() else 0
        start, stop = chunk_rows(p.shape[0], self.world_size)[rank]
        if local(p).shape[0] != stop - start:
            raise ModelMismatch(f"{name}: this rank holds {local(p).shape[0]} rows, FSDP2's "
                                f"chunks give it {stop - start}: an FSDP2 this does not know")
        return start, stop

    def header_facts(self) -> dict[str, Any]:
        """What an offline export needs to rebuild whole tensors and a DCP
        checkpoint: each parameter's global shape, shard dim and dtype, the
        optimizer's groups by parameter name, the model's state-dict keys that
        alias a parameter (tied weights), and the units."""
        names = {id(p): n for i in range(len(self.layer_map))
                 for n, p in self.layer_map.parameters(i)}
        known = {**{id(b): n for i in range(len(self.layer_map))
                    for n, b in self.layer_map.buffers(i)}, **names}
        aliases = {key: known[id(v)] for key, v in self.model.state_dict(keep_vars=True).items()
                   if id(v) in known and known[id(v)] != key}
        params = {name: {"shape": list(p.shape), "dim": self.shard_dims[name],
                         "dtype": str(p.dtype).removeprefix("torch.")}
                  for i in range(len(self.layer_map)) for name, p in self.layer_map.parameters(i)}
        return {"fsdp": {"world_size": self.world_size, "params": params,
                         "param_groups": [[names[id(p)] for p in g["params"]]
                                          for g in self.optimizer.param_groups],
                         "aliases": aliases, "units": units(self.model, self.layer_map)}}


def units(model: torch.nn.Module, layer_map: LayerMap) -> list[dict[str, Any]]:
    """Per ``fully_shard`` unit (module path, ``""`` for the root): the layers
    whose parameters it holds (a parameter belongs to its innermost unit)."""
    from torch.distributed.fsdp import FSDPModule
    paths = [path for path, m in model.named_modules() if isinstance(m, FSDPModule)]
    held: dict[str, list[str]] = {path: [] for path in paths}
    for i, layer in enumerate(layer_map.names):
        for name, _ in layer_map.parameters(i):
            owners = [p for p in paths if p == "" or name.startswith(p + ".")]
            if owners:
                unit = max(owners, key=len)
                if layer not in held[unit]:
                    held[unit].append(layer)
    return [{"unit": path, "layers": layers} for path, layers in held.items()]


def _shard_dim(name: str, p: torch.Tensor, world_size: int) -> int:
    """The dim along which ``p`` is sharded over all ranks, or LayerCheckError
    saying what FsdpLayerCheck needs."""
    from torch.distributed.tensor import DTensor, Shard
    if not isinstance(p, DTensor):
        raise LayerCheckError(f"parameter {name} is not sharded (a plain tensor): FsdpLayerCheck "
                              "needs every parameter managed by fully_shard; call "
                              "fully_shard(model, mesh=mesh) on the root module after its blocks")
    mesh = p.device_mesh
    if mesh.ndim != 1 or mesh.mesh.flatten().tolist() != list(range(world_size)):
        raise LayerCheckError(f"parameter {name} lives on the device mesh {mesh}: FsdpLayerCheck "
                              f"supports a 1-D mesh over all {world_size} ranks in rank order "
                              "(init_device_mesh(device, (world_size,))), not HSDP or tensor "
                              "parallelism")
    (placement,) = p.placements
    if not isinstance(placement, Shard):
        raise LayerCheckError(f"parameter {name} is placed {placement}: FsdpLayerCheck needs "
                              "Shard placements (fully_shard's)")
    return int(placement.dim)
