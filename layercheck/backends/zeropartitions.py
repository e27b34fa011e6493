"""Where a ZeRO layer's tensors live: this rank's partitions of a DeepSpeed engine (stages 1, 2, 3).

``Partitions`` is the layer source of ``layercheck.zero.ZeroLayerCheck``: a layer
version holds this rank's fp32 masters, Adam moments and step counts of the layer's
flat partitions, one shard per rank, no gather (``Stage3Partitions``,
``Stage12Partitions``; ``partitions_for`` picks by stage). On restore it refreshes
the module weights from the masters (DeepSpeed's own ``safe_set_full_fp32_param``
would leave them stale), and a version of another world size, ZeRO stage or one
process is resharded on read (``Partitions.apply_elastic``; docs/elastic.md). The
optimizer's parameter groups must be layer-aligned (``groups.layer_aligned_param_groups``)
so that a layer's optimizer state is whole flat partitions.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import torch

from ..contract.errors import LayerCheckError, ModelMismatch
from ..storage.format import (Layout, group_members, kept_key, kept_range, optimizer_fields,
                              sub_group, tensor_key)
from .layermap import LayerMap
from .partitioning import PLAIN, Partitioning
from .reshard import Read, gather, moment_fields, read_buffers, step_of
from .source import LayerSource, capture_optimizer_state, host, owned, take

__all__ = ["Partitions", "Stage3Partitions", "Stage12Partitions",
           "partitions_for"]

Master = tuple[int, torch.Tensor, Mapping[str, torch.Tensor]]  # sub-group, master, its state
Pair = tuple[torch.Tensor, torch.Tensor]  # a live tensor, the saved value copied into it


class Partitions(LayerSource):
    """This rank's flat fp32 partitions ("sub-groups"), which layer each belongs
    to, their Adam state, and how the module weights are refreshed from them.
    A layer version holds ``master/sg<k>`` and ``optim/<field>/sg<k>`` for each
    of its sub-groups k, and its persistent buffers.

    Subclasses bind DeepSpeed's stage-specific attributes: ``flats`` (fp32
    master partitions, one per sub-group), ``members`` (the module parameters
    flattened into each), ``group_ids`` (the inner optimizer's param group of
    each) and ``low`` (the module-dtype partition each one feeds)."""

    flats: list[torch.Tensor]
    members: list[list[torch.nn.Parameter]]
    group_ids: list[int]
    stage: int

    def __init__(self, engine: Any, layer_map: LayerMap) -> None:
        self.engine, self.model, self.layer_map = engine, engine.module, layer_map
        self.ds = engine.optimizer
        self.optimizer: torch.optim.Optimizer = self.ds.optimizer
        self._bind()
        layer_of = {id(p): i for i in range(len(layer_map)) for _, p in layer_map.parameters(i)}
        self.layer_of: list[int] = []
        for k, params in enumerate(self.members):
            layers = sorted({layer_of[id(p)] for p in params if id(p) in layer_of})
            if len(layers) != 1:
                names = ", ".join(layer_map.names[i] for i in layers) or "no layer"
                raise ModelMismatch(
                    f"optimizer parameter group {self.group_ids[k]} holds parameters of {names}: "
                    "layercheck needs one layer per group; build the optimizer with "
                    "layercheck.groups.layer_aligned_param_groups(model, weight_decay=...)")
            self.layer_of.append(layers[0])
        self.of_layer = [[k for k, i in enumerate(self.layer_of) if i == layer]
                         for layer in range(len(layer_map))]
        held = {id(p) for params in self.members for p in params}
        self.frozen_params = [[(name, p) for name, p in layer_map.parameters(i)
                               if id(p) not in held] for i in range(len(layer_map))]
        """Per layer, its parameters in no sub-group (frozen: ZeRO's optimizer does not
        hold them), which no ZeRO version holds (``kept``)."""

    # -- the stage's hooks ----------------------------------------------------------
    def _bind(self) -> None:
        raise NotImplementedError

    def low(self, k: int) -> torch.Tensor:
        """The module-dtype partition that sub-group ``k``'s fp32 master feeds."""
        raise NotImplementedError

    def refresh_module(self) -> None:
        """Make the module weights (and gathered copies) reflect the low partitions.
        A collective: every rank calls it."""
        raise NotImplementedError

    def _rank(self, k: int) -> int:
        """This rank's partition of sub-group ``k``."""
        raise NotImplementedError

    def _local(self, name: str, p: torch.Tensor) -> tuple[str, torch.Tensor]:
        """(``format.kept_key``, the elements this rank holds) of frozen parameter ``p``."""
        raise NotImplementedError

    def _world(self) -> int:
        """The ranks the sub-groups are partitioned over."""
        raise NotImplementedError

    # -- the LayerSource ------------------------------------------------------------
    def drift_layers(self) -> list[list[torch.Tensor]]:
        return [[self.flats[k] for k in ks] for ks in self.of_layer]

    def drift_groups(self) -> dict[int, dict]:
        # ZeRO-3 puts a flat partition into its param group only while stepping it
        return {id(f): self.optimizer.param_groups[self.group_ids[k]]
                for k, f in enumerate(self.flats)}

    def capture(self, i: int) -> dict[str, torch.Tensor]:
        """Host copies of layer ``i``'s shard on this rank."""
        out: dict[str, torch.Tensor] = {}
        for k in self.of_layer[i]:
            out[tensor_key("master", sub_group(k))] = host(self.flats[k])
            out.update(capture_optimizer_state(self.optimizer.state.get(self.flats[k], {}),
                                               sub_group(k)))
        return {**out, **self._capture_buffers(i)}

    kept_advice = ("make it trainable (in a layer-aligned parameter group, with lr 0 if it must "
                   "not move by its gradient: ZeRO then partitions it and every version holds "
                   "it) or keep it outside engine.module and checkpoint it yourself")

    def kept(self) -> dict[str, torch.Tensor]:
        """The frozen parameters, as this rank holds them (``_local``): in no version, so a
        restore leaves them as they are (``LayerSource.kept``)."""
        return dict(self._local(name, p) for params in self.frozen_params for name, p in params)

    def live(self, key: str) -> torch.Tensor | None:
        name = kept_range(key)[0]
        for params in self.frozen_params:
            for frozen, p in params:
                if frozen == name:
                    local_key, tensor = self._local(name, p)
                    return tensor if local_key == key else None
        return None

    def check(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        self._placed(i, tensors)

    def apply(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy a loaded shard of layer ``i`` into the fp32 masters, the Adam state
        and the module-dtype partitions (``after_restore`` finishes the job)."""
        masters, buffers = self._placed(i, tensors)
        self._put([(k, saved, optimizer_fields(tensors, sub_group(k))) for k, saved in masters],
                  buffers)

    def _put(self, masters: list[Master], buffers: list[Pair]) -> None:
        """Copy each (sub-group, master, optimizer state) and (live, saved) buffer in."""
        with torch.no_grad():
            for k, saved, state in masters:
                flat = self.flats[k]
                flat.copy_(saved)
                self.optimizer.state[flat] = {
                    field: owned(value, "cpu" if field == "step" else flat.device)
                    for field, value in state.items()}
                self.low(k).copy_(flat)
            for live, saved in buffers:
                live.copy_(saved)

    def elastic_ranks(self, i: int, written: Layout) -> list[int]:
        """The old ranks whose files hold pieces of this rank's partitions of layer ``i``
        (and rank 0, for the buffers); every rank where the layout cannot be read
        (``check_elastic`` then says why)."""
        try:
            source, target = Partitioning.from_facts(written.facts, written.world_size), \
                self._target()
            ranks = {0}
            for k in self.of_layer[i]:
                ranks |= {piece.rank for piece in source.pieces(target, self._rank(k), k)}
                ranks |= {rank for rank, _ in source.owners(
                    [name for name, _ in target.groups[k].params])}
        except LayerCheckError:
            return list(range(written.world_size))
        return sorted(ranks)

    def check_elastic(self, i: int, written: Layout, read: Read) -> None:
        self._elastic(i, written, read)  # reads and checks everything, changes nothing

    def apply_elastic(self, i: int, written: Layout, read: Read) -> None:
        """Load layer ``i`` from a version written in another layout (``written``: ZeRO
        1-3 at any world size, or one process): each of this rank's partitions of the
        layer reads just its pieces (``partitioning``: from the facts recorded with
        the version and this engine's own) of the masters, Adam's moments and step
        counts through ``read`` (``LayerSource.apply_elastic``), padding zero, and the
        layer's buffers; all of the layer is read and checked before any of it is
        copied in. A stage change is read as any other layout; what cannot be
        (round-robin gradients, parameter alignment, model parallelism, another
        optimizer) is refused with the reason. ``after_restore`` refreshes the module
        weights, as after a same-size restore."""
        self._put(*self._elastic(i, written, read))

    def _elastic(self, i: int, written: Layout, read: Read) -> tuple[list[Master], list[Pair]]:
        """Layer ``i``'s (sub-group, master, optimizer state) and (live, saved) buffers,
        read from a version of ``written``: new tensors, nothing live changed."""
        source = Partitioning.from_facts(written.facts, written.world_size)
        target = self._target()
        layer, masters = self.layer_map.names[i], []
        for k in self.of_layer[i]:
            flat, pieces = self.flats[k], source.pieces(target, self._rank(k), k)
            group = self.optimizer.param_groups[self.group_ids[k]]
            state = {field: gather(read, source, pieces, "optim", field, flat.numel(),
                                   flat.dtype, layer)
                     for field in moment_fields(self.optimizer, group)}
            step = step_of(read, source, [n for n, _ in target.groups[k].params], layer)
            if step is not None:
                state = {"step": step, **state}
            masters.append((k, gather(read, source, pieces, "master", None, flat.numel(),
                                      flat.dtype, layer), state))
        pairs = read_buffers(read, self.layer_map.buffers(i), layer)
        if source.kind == PLAIN:  # one process's version holds the frozen parameters too
            pairs += self._frozen_read(i, read)
        return masters, pairs

    def _frozen_read(self, i: int, read: Read) -> list[Pair]:
        """(live, saved) of this rank's elements of layer ``i``'s frozen parameters, from a
        one-process version (which holds each whole), cast to the live dtype: a restore
        brings them back, as that process's own restore would."""
        pairs = []
        for name, p in self.frozen_params[i]:
            key, live = self._local(name, p)
            start, stop = kept_range(key)[1] or (0, live.numel())
            saved = read(0, tensor_key("param", name), start, stop)
            pairs.append((live, saved.to(live.dtype).view(live.shape)))
        return pairs

    def _target(self) -> Partitioning:
        """This engine's own layout, described as its header would record it."""
        if getattr(self, "_partitioning", None) is None:
            try:
                self._partitioning = Partitioning.from_facts(self.header_facts(), self._world())
            except ModelMismatch as exc:
                raise ModelMismatch(f"this engine cannot take resharded partitions: {exc}") \
                    from None
        return self._partitioning

    def _placed(self, i: int, tensors: Mapping[str, torch.Tensor]
                ) -> tuple[list[tuple[int, torch.Tensor]], list[Pair]]:
        """(sub-group, saved master) of layer ``i``'s shard and (live, saved) buffers,
        each checked; ModelMismatch if a sub-group has no optimizer state."""
        layer = self.layer_map.names[i]
        masters = []
        for k in self.of_layer[i]:
            masters.append((k, take(tensors, tensor_key("master", sub_group(k)), self.flats[k],
                                    layer)))
            if not optimizer_fields(tensors, sub_group(k)):
                raise ModelMismatch(f"layer {layer}: the saved shard has no optimizer state "
                                    f"for sub-group {k}")
        return masters, self._buffers(i, tensors)

    def group_members(self) -> list[str]:
        # ZeRO-3 holds a group's flat partitions in it only while stepping: by sub-group
        names = {id(p): n for i in range(len(self.layer_map))
                 for n, p in self.layer_map.parameters(i)}
        return [group_members([names.get(id(p), "?") for k, g in enumerate(self.group_ids)
                               if g == group for p in self.members[k]])
                for group in range(len(self.optimizer.param_groups))]

    def header_facts(self) -> dict[str, Any]:
        engine = self.engine
        return {"zero": _jsonable({
            "stage": self.stage, "sub_groups": self.describe(),
            "param_groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in self.optimizer.param_groups],
            "module_keys": list(self.model.state_dict().keys()),
            "ds_config": getattr(engine, "config", None),
            "checkpoint": _checkpoint_facts(engine, self)})}

    def engine_state(self) -> dict[str, Any]:
        e = self.engine
        return {"global_steps": int(e.global_steps), "global_samples": int(e.global_samples),
                "skipped_steps": int(e.skipped_steps)}

    def after_restore(self, engine: Mapping[str, Any] | None, step: int) -> None:
        saved, e = engine or {}, self.engine
        e.global_steps = int(saved.get("global_steps", step))
        e.global_samples = int(saved.get("global_samples", step * e.train_batch_size()))
        e.skipped_steps = int(saved.get("skipped_steps", 0))
        self.refresh_module()

    def describe(self) -> list[dict[str, Any]]:
        """Per sub-group: layer, param group, hyper-parameters-free shape facts
        (what an export needs to rebuild DeepSpeed's own files)."""
        names = {id(p): n for i in range(len(self.layer_map))
                 for n, p in self.layer_map.parameters(i)}
        return [{"sub_group": k, "group": self.group_ids[k],
                 "layer": self.layer_map.names[self.layer_of[k]],
                 "params": [[names.get(id(p), "?"), list(getattr(p, "ds_shape", p.shape))]
                            for p in self.members[k]],
                 "partition_numel": int(self.flats[k].numel())}
                for k in range(len(self.flats))]


class Stage3Partitions(Partitions):
    """ZeRO-3: ``fp32_partitioned_groups_flat`` and the ``ds_tensor`` partitions."""

    stage = 3

    def _bind(self) -> None:
        self.flats = list(self.ds.fp32_partitioned_groups_flat)
        self.members = [list(g) for g in self.ds.fp16_groups]
        self.group_ids = [int(self.ds.sub_group_to_group_id[k]) for k in range(len(self.flats))]
        if any(f.numel() == 0 for f in self.flats) and getattr(self.ds, "swap_optimizer", False):
            raise LayerCheckError("ZeRO-3 with the optimizer state offloaded to NVMe is not "
                                  "supported: use offload_optimizer device 'cpu' or none")

    def low(self, k: int) -> torch.Tensor:
        return self.ds.fp16_partitioned_groups_flat[k]

    def _rank(self, k: int) -> int:
        import torch.distributed as dist
        return dist.get_rank(group=self.ds.dp_process_group)

    def _world(self) -> int:
        return int(self.ds.partition_count)

    def _local(self, name: str, p: torch.Tensor) -> tuple[str, torch.Tensor]:
        """Its ``ds_tensor``, padding cut: flat elements [r·n, r·n + n) of the whole, n
        the partition's size, r this rank in the parameter's process group."""
        import torch.distributed as dist
        part = p.ds_tensor.reshape(-1)
        rank = dist.get_rank(group=getattr(p, "ds_process_group", self.ds.dp_process_group))
        start = rank * part.numel()
        stop = max(start, min(int(p.ds_numel), start + part.numel()))
        return kept_key(name, start, stop), part[:stop - start]

    def refresh_module(self) -> None:
        ds = self.ds
        for k in range(len(self.flats)):
            views = ds.unflatten(ds.fp16_partitioned_groups_flat[k], ds.fp16_partitioned_groups[k])
            for partitioned, view in zip(ds.fp16_partitioned_groups[k], views):
                partitioned.data = view.data
        if getattr(ds, "persistent_parameters", None):
            # persistent (small) parameters stay gathered between steps: gather them anew
            ds.persistent_parameters[0].all_gather(ds.persistent_parameters)
        if hasattr(ds, "invalidate_secondary_tensor"):
            ds.invalidate_secondary_tensor()


class Stage12Partitions(Partitions):
    """ZeRO-1/2: ``single_partition_of_fp32_groups`` and the bit16 partitions."""

    stage = 2

    def _bind(self) -> None:
        import torch.distributed as dist
        self.flats = list(self.ds.single_partition_of_fp32_groups)
        self.members = [list(g) for g in self.ds.bit16_groups]
        self.group_ids = list(range(len(self.flats)))
        self._partition = [dist.get_rank(group=self.ds.real_dp_process_group[k])
                           for k in range(len(self.flats))]

    def low(self, k: int) -> torch.Tensor:
        return self.ds.parallel_partitioned_bit16_groups[k][self._partition[k]]

    def _rank(self, k: int) -> int:
        return self._partition[k]

    def _world(self) -> int:
        counts = set(self.ds.partition_count)
        if len(counts) != 1:  # expert groups of a MoE model
            raise ModelMismatch(f"the ZeRO groups are partitioned over {sorted(counts)} ranks: "
                                "resuming at another world size needs one data-parallel size")
        return int(counts.pop())

    def refresh_module(self) -> None:
        self.ds.update_lp_params()  # copies fp32 -> bit16 partitions, then all-gathers

    def _local(self, name: str, p: torch.Tensor) -> tuple[str, torch.Tensor]:
        return kept_key(name), p  # whole on every rank


def partitions_for(engine: Any, layer_map: LayerMap) -> Partitions:
    """The ``Partitions`` of ``engine``'s ZeRO optimizer, by stage."""
    stage = int(engine.zero_optimization_stage()) if hasattr(engine, "zero_optimization_stage") else 0
    if stage == 3:
        return Stage3Partitions(engine, layer_map)
    if stage in (1, 2):
        parts = Stage12Partitions(engine, layer_map)
        parts.stage = stage
        return parts
    raise LayerCheckError(f"the DeepSpeed engine runs ZeRO stage {stage}: ZeroLayerCheck needs "
                          "stage 1, 2 or 3 (for no ZeRO, use LayerCheck(engine.module, "
                          "engine.optimizer, ...))")


def _checkpoint_facts(engine: Any, parts: Partitions) -> dict[str, Any]:
    """What ``engine.save_checkpoint`` records besides the partitions and the
    per-step state, for ``python -m layercheck export --format deepspeed``.
    Computed on rank 0 (the header's writer), where DeepSpeed computes
    ``shared_params`` too. ``layout``: the ZeRO-1/2 options that change the
    flat partitions' layout or the file format (the export refuses them)."""
    ds = parts.ds
    layout = {} if parts.stage == 3 else {
        "round_robin_gradients": bool(getattr(ds, "round_robin_gradients", False)),
        "elastic_checkpoint": bool(getattr(ds, "elastic_checkpoint", False)),
        "parameter_alignment": any(any(p) for p in getattr(ds, "round_robin_bit16_padding", []))}
    # per-module versions, as pairs: the manifest sorts an object's keys
    metadata = getattr(engine.module.state_dict(), "_metadata", {})
    return {"module_dtype": str(parts.low(0).dtype).removeprefix("torch."),
            "module_metadata": [[prefix, dict(meta)] for prefix, meta in metadata.items()],
            "buffer_names": list(engine._get_buffer_names()),
            "shared_params": dict(engine._get_shared_params()),
            "loss_scale": {"dynamic": bool(ds.dynamic_loss_scale),
                           "scale": float(ds.loss_scaler.cur_scale)},
            "clip_grad": ds.clip_grad,
            "dp_world_size": int(getattr(engine, "seq_dp_world_size", engine.dp_world_size)),
            "mp_world_size": int(engine.mp_world_size),
            "layout": layout}


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON: tuples and sizes as lists, numpy/torch scalars as
    numbers, anything else JSON lacks as its str."""
    def plain(v: Any) -> Any:
        return v.item() if isinstance(v, np.generic) or (torch.is_tensor(v) and v.numel() == 1) \
            else str(v)
    return json.loads(json.dumps(value, default=plain))
