"""DeepSpeed's own checkpoint files, rebuilt from a sharded composite state.

``engine.save_checkpoint(dir)`` under ZeRO writes, in ``dir/global_step{T}/``:

    {bf16_}zero_pp_rank_{r}_mp_rank_00_optim_states.pt   every stage, one per rank
    zero_pp_rank_{r}_mp_rank_00_model_states.pt          ZeRO-3, one per rank (placeholders)
    mp_rank_00_model_states.pt                           ZeRO-1/2, the whole module

``ZeroLayout`` rebuilds those objects (for ``torch.save``) from what a
directory written by ``ZeroLayerCheck`` holds: every rank's shard of each
planned layer version (fp32 master partitions ``master/sg<k>``, optimizer
state ``optim/<field>/sg<k>``, buffers: ``layercheck.storage.format``), step T's
training state (optimizer hyper-parameters, LR scheduler, DeepSpeed's
counters in ``engine``) and the header's
``zero`` facts (stage, sub-groups with their parameters and shapes, module
keys, DeepSpeed config, and ``checkpoint``: module dtype and state_dict
metadata, buffer names, tied parameters, loss scale, gradient clipping,
parallel sizes, layout options).

``global_steps``, the scheduler and the learning rates are T's. Every Adam
step count is T too (``adam_step="global"``, the default): the folder is one
consistent DeepSpeed checkpoint of step T, as DeepSpeed itself would write,
where all groups step together. ``adam_step="own"`` keeps each layer's own
count, saved with its moments (a layer last written at step s < T counts s):
exactly what ``ZeroLayerCheck.restore`` puts back, so training on from the
export is bit for bit training on from a restore. The two differ only in
Adam's bias correction of stale layers, 1 - beta^s against 1 - beta^T, which
vanishes once s and T are past a few thousand steps.

Contract of a layout: ``rank_files(r, shards)`` once per rank in rank order
(one rank's shards in memory at a time), then ``final_files()``. Each
returns {file name in the tag folder: object}. Shards come from
``RankShards``; nothing here reads or writes a file.

Supported: ZeRO-1/2/3, pure data parallelism, fp32/bf16 or fp16 with a static
loss scale, every parameter trainable, DeepSpeed's default ZeRO-1/2 layout
(no round-robin gradients, parameter alignment or elastic checkpoints).
Everything else is refused with the reason (``ZeroFacts.from_header``; a
frozen parameter, when the module's state is built).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

from ..contract.errors import LayerCheckError, ModelMismatch
from ..storage.format import ADAM_STEPS, module_tensors, optimizer_fields, sub_group, tensor_key
from ..backends.partitioning import ZERO3, ZERO12, FlatGroup, Partitioning

__all__ = ["SubGroup", "ZeroFacts", "RankShards", "ZeroLayout", "Stage3Layout", "Stage12Layout",
           "layout_for", "place_partition", "partition_slices"]


@dataclass(frozen=True)
class SubGroup:
    """One flat fp32 partition group ("sub-group") of the ZeRO optimizer."""

    index: int
    group: int
    """The inner optimizer's parameter group it belongs to."""
    layer: str
    params: tuple[tuple[str, tuple[int, ...]], ...]
    """(name, full shape) of the module parameters flattened into it, in order."""
    partition_numel: int
    """Elements of each rank's partition (padding included)."""


@dataclass(frozen=True)
class ZeroFacts:
    """What the header says about the ZeRO job that wrote the directory."""

    stage: int
    world_size: int
    sub_groups: tuple[SubGroup, ...]
    group_count: int
    module_keys: tuple[str, ...]
    ds_config: Any
    dtype: torch.dtype
    module_metadata: tuple[tuple[str, dict[str, Any]], ...]
    """The module ``state_dict()``'s ``_metadata`` (each submodule's version), in order."""
    buffer_names: tuple[str, ...]
    shared_params: dict[str, str]
    loss_scale: float
    clip_grad: Any

    @classmethod
    def from_header(cls, header: Mapping[str, Any], url: str, *,
                    deepspeed: bool = True) -> "ZeroFacts":
        """The facts, or LayerCheckError saying why this directory cannot be exported
        (``deepspeed``: as DeepSpeed's checkpoint, which some training setups rule out)."""
        zero = header.get("zero")
        if not isinstance(zero, dict):
            raise LayerCheckError(f"{url} was not written by ZeroLayerCheck (its header has no "
                                  "DeepSpeed ZeRO facts): --format deepspeed exports ZeRO "
                                  "checkpoints only; export this one with --format hf")
        facts = zero.get("checkpoint")
        if not isinstance(facts, dict):
            raise LayerCheckError(f"{url} was written by a layercheck that did not record "
                                  "DeepSpeed's checkpoint facts in its header: restore it with "
                                  "ZeroLayerCheck.restore and save it with engine.save_checkpoint")
        try:
            if deepspeed:
                cls._check_deepspeed(header, zero, facts, url)
            return cls._parse(header, zero, facts)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # int(inf)
            raise LayerCheckError(f"{url}: malformed ZeRO facts in the header ({exc!r})") from None

    @staticmethod
    def _check_deepspeed(header: Mapping[str, Any], zero: Mapping[str, Any],
                         facts: Mapping[str, Any], url: str) -> None:
        stage, world = int(zero["stage"]), int(header["world_size"])
        if facts["loss_scale"]["dynamic"]:
            raise LayerCheckError(f"{url} was trained in fp16 with dynamic loss scaling: the "
                                  "loss scale of each step is not checkpointed, so DeepSpeed's "
                                  "optimizer files cannot be written faithfully; train with a "
                                  "static fp16 loss_scale or bf16 to export")
        unsupported = [name for name, on in facts["layout"].items() if on]
        if unsupported:
            raise LayerCheckError(f"{url}: ZeRO-{stage} ran with {', '.join(unsupported)}, which "
                                  "the export does not reproduce; train without them to export")
        if int(facts["mp_world_size"]) != 1 or int(facts["dp_world_size"]) != world:
            raise LayerCheckError(f"{url}: model parallelism (mp {facts['mp_world_size']}, dp "
                                  f"{facts['dp_world_size']} of {world} ranks) is not supported by "
                                  "the export: it writes pure data-parallel checkpoints")

    @classmethod
    def _parse(cls, header: Mapping[str, Any], zero: Mapping[str, Any],
               facts: Mapping[str, Any]) -> "ZeroFacts":
        stage, world = int(zero["stage"]), int(header["world_size"])
        dtype = getattr(torch, str(facts["module_dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"module_dtype {facts['module_dtype']!r}")
        sub_groups = tuple(SubGroup(int(s["sub_group"]), int(s["group"]), str(s["layer"]),
                                    tuple((str(n), tuple(int(d) for d in shape))
                                          for n, shape in s["params"]),
                                    int(s["partition_numel"]))
                           for s in zero["sub_groups"])
        if [s.index for s in sub_groups] != list(range(len(sub_groups))):
            raise ValueError("sub-groups out of order")
        return cls(stage=stage, world_size=world, sub_groups=sub_groups,
                   group_count=len(zero["param_groups"]),
                   module_keys=tuple(str(k) for k in zero["module_keys"]),
                   ds_config=zero["ds_config"], dtype=dtype,
                   module_metadata=tuple((str(k), dict(v)) for k, v in facts["module_metadata"]),
                   buffer_names=tuple(str(b) for b in facts["buffer_names"]),
                   shared_params={str(k): str(v) for k, v in facts["shared_params"].items()},
                   loss_scale=float(facts["loss_scale"]["scale"]), clip_grad=facts["clip_grad"])

    @property
    def parameters(self) -> dict[str, tuple[int, ...]]:
        """Every optimized parameter's full shape, by name, in group order."""
        return {name: shape for sg in self.sub_groups for name, shape in sg.params}

    def of_layer(self, layer: str) -> list[int]:
        """The indexes of layer ``layer``'s sub-groups."""
        return [sg.index for sg in self.sub_groups if sg.layer == layer]

    def layer_parameters(self, layer: str) -> dict[str, tuple[int, ...]]:
        """Layer ``layer``'s optimized parameters' full shapes, by name, in group order."""
        return {name: shape for sg in self.sub_groups if sg.layer == layer
                for name, shape in sg.params}


class RankShards:
    """One rank's shard of every planned layer version: ``{layer: tensors}``."""

    def __init__(self, rank: int, layers: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        self.rank = rank
        self.layers = layers

    def master(self, sg: SubGroup) -> torch.Tensor:
        key = tensor_key("master", sub_group(sg.index))
        master = self.layers.get(sg.layer, {}).get(key)
        if master is None:
            raise ModelMismatch(f"layer {sg.layer}: rank {self.rank}'s shard has no {key}; the "
                                "header and the shards disagree (another model or grouping?)")
        if master.dim() != 1 or master.numel() != sg.partition_numel:
            raise ModelMismatch(f"layer {sg.layer}: rank {self.rank}'s {key} has "
                                f"shape {tuple(master.shape)}, the header says "
                                f"({sg.partition_numel},)")
        return master

    def optimizer_state(self, sg: SubGroup) -> dict[str, Any]:
        """The inner optimizer's state of this sub-group's flat partition, ``step``
        first as torch's Adam creates it (dict order carries no meaning when loading)."""
        fields = optimizer_fields(self.layers.get(sg.layer, {}), sub_group(sg.index))
        if not fields:
            raise ModelMismatch(f"layer {sg.layer}: rank {self.rank}'s shard has no optimizer "
                                f"state for sub-group {sg.index}")
        return {f: fields[f] for f in sorted(fields, key=lambda f: (f != "step", f))}

    def buffers(self) -> dict[str, torch.Tensor]:
        return {name: t for tensors in self.layers.values()
                for name, t in module_tensors(tensors, kinds=("buffer",)).items()}


def partition_slices(facts: ZeroFacts, sg: SubGroup,
                     rank: int) -> Iterator[tuple[str, int, int, int]]:
    """(parameter, first element in it, first element in the partition, count)
    of each slice of rank ``rank``'s partition of ``sg``: ``partitioning``'s
    arithmetic (ZeRO-3: each parameter cut in ``world_size``; ZeRO-1/2: the group's
    concatenation cut in partitions of ``partition_numel``)."""
    flat = FlatGroup(index=0, layer=sg.layer, partition_numel=sg.partition_numel,
                     params=tuple((name, math.prod(shape)) for name, shape in sg.params))
    layout = Partitioning(kind=ZERO3 if facts.stage == 3 else ZERO12,
                          world_size=facts.world_size, groups=(flat,))
    for seg in layout.segments(rank, 0):
        yield seg.param, seg.start, seg.offset, seg.stop - seg.start


def place_partition(facts: ZeroFacts, sg: SubGroup, rank: int, master: torch.Tensor,
                    full: Mapping[str, torch.Tensor]) -> None:
    """Copy the slices of rank ``rank``'s master partition of ``sg`` into the flat
    full weights they belong to (``full``: name -> 1-D tensor, any dtype; the copy
    casts, as DeepSpeed's fp32 -> bit16 copy does)."""
    for name, at, start, n in partition_slices(facts, sg, rank):
        full[name][at:at + n].copy_(master[start:start + n])


class ZeroLayout:
    """DeepSpeed's checkpoint files of one ZeRO stage (see the module doc for the
    call order). Needs deepspeed importable: the files hold its classes (loss
    scaler, stage enum, fragment addresses), as its own checkpoints do."""

    stage_enum: str

    def __init__(self, facts: ZeroFacts, doc: Mapping[str, Any], step: int,
                 adam_step: str = "global") -> None:
        if adam_step not in ADAM_STEPS:
            raise ValueError(f"adam_step={adam_step!r}: use one of {', '.join(ADAM_STEPS)}")
        self.adam_step = adam_step
        from deepspeed.git_version_info import version
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        self.facts, self.step = facts, step
        self.version = version
        self.zero_stage = getattr(ZeroStageEnum, self.stage_enum)
        self.loss_scaler = LossScaler(scale=facts.loss_scale)
        self.hyper = _param_groups(doc, facts)
        self.engine = _engine_counters(doc, step)
        self.scheduler = doc.get("scheduler")
        self.buffers: dict[str, torch.Tensor] = {}
        self._check_layout()

    # -- hooks ----------------------------------------------------------------------
    def _check_layout(self) -> None:
        """ModelMismatch unless the header's partition sizes fit this stage's layout."""
        raise NotImplementedError

    def _optimizer_state_dict(self, rank: int, shards: RankShards) -> dict[str, Any]:
        """What the ZeRO optimizer's ``state_dict()`` returns on ``rank``."""
        raise NotImplementedError

    def rank_files(self, rank: int, shards: RankShards) -> dict[str, Any]:
        if rank == 0:
            self.buffers = shards.buffers()
        prefix = "bf16_" if self.facts.dtype == torch.bfloat16 else ""
        return {f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt":
                {"optimizer_state_dict": self._optimizer_state_dict(rank, shards),
                 "ds_config": self.facts.ds_config, "ds_version": self.version}}

    def final_files(self) -> dict[str, Any]:
        return {}

    # -- shared pieces ---------------------------------------------------------------
    def _inner_state_dict(self, shards: RankShards) -> dict[str, Any]:
        """The inner torch optimizer's ``state_dict()``: one flat partition per
        sub-group, numbered group by group as torch numbers parameters."""
        number, groups = 0, []
        state: dict[int, dict[str, Any]] = {}
        for g, hyper in enumerate(self.hyper):
            ids = []
            for sg in (s for s in self.facts.sub_groups if s.group == g):
                state[number] = shards.optimizer_state(sg)
                if self.adam_step == "global" and "step" in state[number]:
                    state[number]["step"] = torch.full_like(state[number]["step"], float(self.step))
                ids.append(number)
                number += 1
            groups.append({**hyper, "params": ids})
        return {"state": state, "param_groups": groups}

    def _module(self, weights: Mapping[str, torch.Tensor] | None) -> OrderedDict:
        """The module's ``state_dict()``: a parameter's full weight (``weights``) or,
        under ZeRO-3, the empty placeholder a partitioned parameter holds; each
        persistent buffer; a tied name as a view of its owner's tensor."""
        params = self.facts.parameters
        module: OrderedDict[str, torch.Tensor] = OrderedDict()
        for key in self.facts.module_keys:
            if key in self.facts.shared_params:
                module[key] = None  # type: ignore[assignment]  # filled below, once its owner is
            elif key in params:
                module[key] = (torch.empty(0, dtype=self.facts.dtype) if weights is None
                               else weights[key].view(params[key]))
            elif key in self.facts.buffer_names:
                if key not in self.buffers:
                    raise ModelMismatch(f"buffer {key} is in no layer's shard: the export needs "
                                        "every persistent buffer in a layer")
                module[key] = self.buffers[key]
            else:
                raise ModelMismatch(f"{key} is neither an optimized parameter nor a persistent "
                                    "buffer (a frozen or empty parameter): the DeepSpeed export "
                                    "does not support those")
        for alias, owner in self.facts.shared_params.items():
            if alias not in module:
                continue
            if module.get(owner) is None:
                raise ModelMismatch(f"{alias} is tied to {owner}, which is no parameter here")
            # another tensor on the same storage, as state_dict() gives
            module[alias] = module[owner].view(module[owner].shape)
        module._metadata = OrderedDict((k, dict(v)) for k, v in self.facts.module_metadata)
        return module

    def _model_states(self, module: OrderedDict, rank: int) -> dict[str, Any]:
        """``engine._common_checkpoint_state`` (keys in its order)."""
        frozen = OrderedDict() if self.facts.stage >= 2 else None
        shapes = [OrderedDict((name, torch.Size(shape)) for name, shape in sg.params)
                  for sg in self.facts.sub_groups]
        return {"module": module, "buffer_names": list(self.facts.buffer_names), "optimizer": None,
                "param_shapes": shapes, "frozen_param_shapes": frozen,
                # DeepSpeed computes the tied names on global rank 0 only
                "shared_params": dict(self.facts.shared_params) if rank == 0 else {},
                "frozen_param_fragments": OrderedDict() if frozen is not None else None,
                "lr_scheduler": self.scheduler, "data_sampler": None, "random_ltd": None,
                **self.engine, "dp_world_size": self.facts.world_size, "mp_world_size": 1,
                "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
                "ds_config": self.facts.ds_config, "ds_version": self.version}


class Stage3Layout(ZeroLayout):
    """ZeRO-3: ``_rigid_state_dict`` per rank, and a model-states file per rank."""

    stage_enum = "weights"

    def _check_layout(self) -> None:
        world = self.facts.world_size
        for sg in self.facts.sub_groups:
            need = sum(math.ceil(math.prod(shape) / world) for _, shape in sg.params)
            if need != sg.partition_numel:
                raise ModelMismatch(f"sub-group {sg.index} ({sg.layer}): partitions of {need} "
                                    f"elements expected from its parameters, the header says "
                                    f"{sg.partition_numel}")

    def _optimizer_state_dict(self, rank: int, shards: RankShards) -> dict[str, Any]:
        return {"zero_stage": self.zero_stage, "loss_scaler": self.loss_scaler,
                "dynamic_loss_scale": False, "overflow": False,
                "partition_count": self.facts.world_size,
                "optimizer_state_dict": self._inner_state_dict(shards),
                "fp32_flat_groups": [shards.master(sg) for sg in self.facts.sub_groups]}

    def rank_files(self, rank: int, shards: RankShards) -> dict[str, Any]:
        files = super().rank_files(rank, shards)
        files[f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"] = self._model_states(
            self._module(None), rank)
        return files


class Stage12Layout(ZeroLayout):
    """ZeRO-1/2: the optimizer's ``state_dict`` per rank; rank 0's model-states
    file holds the whole module (the masters cast to the module's dtype)."""

    def __init__(self, facts: ZeroFacts, doc: Mapping[str, Any], step: int,
                 adam_step: str = "global") -> None:
        self.stage_enum = "gradients" if facts.stage == 2 else "optimizer_states"
        super().__init__(facts, doc, step, adam_step)
        from deepspeed.utils.tensor_fragment import fragment_address
        self.fragment_address = fragment_address
        self.weights = {name: torch.empty(math.prod(shape), dtype=facts.dtype)
                        for name, shape in facts.parameters.items()}

    def _check_layout(self) -> None:
        if any(sg.group != sg.index for sg in self.facts.sub_groups):
            raise ModelMismatch("ZeRO-1/2 has one flat partition per parameter group; the header's "
                                "sub-groups say otherwise")
        for sg in self.facts.sub_groups:
            if self._numel(sg) > sg.partition_numel * self.facts.world_size:
                raise ModelMismatch(f"sub-group {sg.index} ({sg.layer}): {self._numel(sg)} "
                                    f"elements do not fit {self.facts.world_size} partitions of "
                                    f"{sg.partition_numel}")

    @staticmethod
    def _numel(sg: SubGroup) -> int:
        return sum(math.prod(shape) for _, shape in sg.params)

    def _padding(self, sg: SubGroup, rank: int) -> int:
        """Elements of ``rank``'s partition past the group's end (``groups_padding``)."""
        left = rank * sg.partition_numel
        return min(sg.partition_numel, max(0, left + sg.partition_numel - self._numel(sg)))

    def _slice_mappings(self, sg: SubGroup, rank: int) -> OrderedDict:
        """``_param_slice_mappings``: where each parameter's slice lies in this partition."""
        return OrderedDict((name, self.fragment_address(numel=n, start=start))
                           for name, _, start, n in partition_slices(self.facts, sg, rank))

    def _optimizer_state_dict(self, rank: int, shards: RankShards) -> dict[str, Any]:
        masters = [shards.master(sg) for sg in self.facts.sub_groups]
        for sg, master in zip(self.facts.sub_groups, masters):
            place_partition(self.facts, sg, rank, master, self.weights)
        paddings = [self._padding(sg, rank) for sg in self.facts.sub_groups]
        lean = [m[:m.numel() - p] for m, p in zip(masters, paddings)]  # saved without padding
        return {"loss_scaler": self.loss_scaler, "dynamic_loss_scale": False, "overflow": False,
                "clip_grad": self.facts.clip_grad,
                "base_optimizer_state": self._inner_state_dict(shards),
                "single_partition_of_fp32_groups": lean,
                "zero_stage": self.zero_stage, "group_paddings": paddings,
                "param_alignment_paddings": [[0] * len(sg.params) for sg in self.facts.sub_groups],
                "partition_count": [self.facts.world_size] * len(self.facts.sub_groups),
                "ds_version": self.version,
                "param_slice_mappings": [self._slice_mappings(sg, rank)
                                         for sg in self.facts.sub_groups]}

    def final_files(self) -> dict[str, Any]:
        return {"mp_rank_00_model_states.pt": self._model_states(self._module(self.weights), 0)}


def layout_for(facts: ZeroFacts, doc: Mapping[str, Any], step: int,
               adam_step: str = "global") -> ZeroLayout:
    """The layout of ``facts.stage``."""
    if facts.stage == 3:
        return Stage3Layout(facts, doc, step, adam_step)
    if facts.stage in (1, 2):
        return Stage12Layout(facts, doc, step, adam_step)
    raise LayerCheckError(f"ZeRO stage {facts.stage} has no DeepSpeed checkpoint layout here")


def _param_groups(doc: Mapping[str, Any], facts: ZeroFacts) -> list[dict[str, Any]]:
    """Step T's optimizer hyper-parameters, with the tuples (betas) JSON made lists."""
    groups = doc.get("param_groups")
    if not isinstance(groups, list) or len(groups) != facts.group_count:
        raise ModelMismatch(f"the training state has {len(groups or [])} optimizer parameter "
                            f"groups, the header {facts.group_count}")
    return [{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()} for g in groups]


def _engine_counters(doc: Mapping[str, Any], step: int) -> dict[str, int]:
    engine = doc.get("engine") or {}
    if "global_steps" not in engine:
        raise LayerCheckError(f"the training state of step {step} lacks DeepSpeed's step counters "
                              "(its engine state): it was not written by ZeroLayerCheck")
    return {"skipped_steps": int(engine.get("skipped_steps", 0)),
            "global_steps": int(engine["global_steps"]),
            "global_samples": int(engine.get("global_samples", 0))}
