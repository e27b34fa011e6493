"""Where a layer's tensors live: the adapter between LayerCheck and a backend.

``LayerCheck`` owns the lifecycle for one rank and many; a ``LayerSource``
answers what depends on where the tensors are: ``drift_layers()`` (per
layer, the tensors the optimizer steps; ``drift_groups()`` names their param
groups where the optimizer holds them only while stepping), ``capture(i)``
(host copies of layer i, keyed as ``layercheck.storage.format`` says; ``frozen(i)``
names the parameters that do not train, which ``capture(i, omit)`` leaves
out where its full version holds them unchanged: ``fingerprints(i, names)``), ``check(i,
tensors)`` (ModelMismatch unless a loaded layer i fits the live tensors: keys,
shapes, dtypes; nothing is copied), ``apply(i, tensors)`` (it back into the
live tensors), and what the
backend adds to the header (``header_facts``) and to every step's state
(``engine_state``) and must redo once every layer is back (``after_restore``).
A restore checks every layer before it applies the first, so one that fails
leaves the live model as it was.

Backends: ``ModuleSource`` (an ``nn.Module`` and its torch optimizer),
``layercheck.backends.zeropartitions.Partitions`` (DeepSpeed ZeRO's flat fp32 partitions, one
shard per rank) and ``layercheck.backends.dtensorshards.DTensorShards`` (FSDP2's DTensor
shards, one per rank). On restore, ``apply`` for every layer, then ``after_restore``
once (a collective where the backend has ranks).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from ..contract.errors import ModelMismatch
from ..storage.fingerprint import fingerprints
from ..storage.format import Layout, group_members, kept_range, optimizer_state, tensor_key
from .hostcopy import host  # a layer source's capture copies through it
from .layermap import LayerMap

__all__ = ["LayerSource", "ModuleSource", "host", "tensors_nbytes", "take",
           "capture_optimizer_state", "check_state_fields", "local"]


def owned(value: torch.Tensor, device: torch.device | str,
          live: Any = None, *, own: bool = False) -> torch.Tensor:
    """A tensor of the live state holding ``value``: copied into ``live`` where that
    is a tensor of its shape, dtype and device; else ``value`` itself where it is
    ``own`` (read apart: memory holding nothing else, ``recovery.Loaded.own``) and
    on ``device``; else a copy on ``device`` (never a view of a file's buffer)."""
    if isinstance(live, torch.Tensor) and live.shape == value.shape and \
            live.dtype == value.dtype and live.device == torch.device(device):
        return live.copy_(value)
    if own and value.device == torch.device(device):
        return value
    return value.to(device, copy=True)


def tensors_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def take(tensors: Mapping[str, torch.Tensor], key: str, like: torch.Tensor,
         layer: str) -> torch.Tensor:
    """``tensors[key]``, or ModelMismatch when it is missing or not shaped like ``like``
    or of another dtype (a copy would cast it silently)."""
    if key not in tensors:
        raise ModelMismatch(f"layer {layer}: the saved version has no {key}; the checkpoint was "
                            "written for a different model, optimizer grouping or world size")
    value = tensors[key]
    if value.shape != like.shape:
        raise ModelMismatch(f"layer {layer}: {key} has shape {tuple(value.shape)} in the "
                            f"checkpoint but {tuple(like.shape)} here (a different model, "
                            "parameter grouping or world size)")
    if value.dtype != like.dtype:
        raise ModelMismatch(f"layer {layer}: {key} is {value.dtype} in the checkpoint but "
                            f"{like.dtype} here: load the model in the dtype it was trained in "
                            "(its optimizer state was saved for that dtype)")
    return value


def capture_optimizer_state(state: Mapping[str, Any], owner: str) -> dict[str, torch.Tensor]:
    """Host copies of one tensor's optimizer state (scalars as float64 0-d tensors)."""
    out = {}
    for field, value in state.items():
        if torch.is_tensor(value):
            out[tensor_key("optim", owner, field)] = host(value)
        elif isinstance(value, (int, float)):
            out[tensor_key("optim", owner, field)] = torch.tensor(float(value), dtype=torch.float64)
    return out


def check_state_fields(layer: str, owner: str, saved: Mapping[str, Any],
                       live: Mapping[str, Any]) -> None:
    """ModelMismatch unless the saved optimizer state of ``owner`` has every field its
    live state holds (tensors and numbers), where both have state: a live optimizer
    that has stepped shows the fields its step reads, which another optimizer's
    state lacks (AdamW's ``exp_avg`` where SGD saved ``momentum_buffer``). The
    check an older checkpoint, which records no optimizer type, still gets."""
    fields = {f for f, v in live.items() if torch.is_tensor(v) or isinstance(v, (int, float))}
    if saved and fields and not fields <= set(saved):
        raise ModelMismatch(
            f"layer {layer}: the checkpoint's optimizer state of {owner} holds "
            f"{', '.join(sorted(saved))}, this optimizer's {', '.join(sorted(fields))}: another "
            "optimizer (or other options) than the run that saved it; build the optimizer as "
            "that run did, or export the weights (python -m layercheck export) and start a new "
            "run from them in a new directory")


class LayerSource:
    """Where a model's layers live (the contract is in the module doc)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    """The torch optimizer that steps ``drift_layers()`` and holds their state."""
    layer_map: LayerMap

    resize_advice = "export it (python -m layercheck export) and load the export"
    """How to go on at another world size, for the error that refuses one."""

    def drift_layers(self) -> list[list[torch.Tensor]]:
        raise NotImplementedError

    def drift_adapters(self) -> Any:
        """The LoRA modules whose drift is taken of their effective weights
        (``lora.AdapterDrift``), or None: every tensor counts as itself."""
        return None

    def drift_groups(self) -> dict[int, dict] | None:
        """``id(tensor) -> param group`` for the tensors of ``drift_layers()``;
        None: the optimizer's ``param_groups`` hold them all the time."""
        return None

    def capture(self, i: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def frozen(self, i: int) -> list[str]:
        """Layer ``i``'s parameters that do not train now (``layercheck.frozen``): a source
        that names any must take ``capture(i, omit=...)``, leaving those out. Default
        none: a backend's versions hold everything."""
        return []

    def fingerprints(self, i: int, names: Iterable[str]) -> dict[str, str]:
        """The fingerprints (``layercheck.storage.fingerprint``) of layer ``i``'s parameters
        ``names`` as they are now: what ``frozen.FrozenParts`` compares with those of a
        full version before a version leaves one out."""
        params = dict(self.layer_map.parameters(i))
        return fingerprints({name: params[name] for name in names})

    kept_advice = ("make it trainable (give it to the optimizer, with lr 0 if it must not "
                   "move by its gradient) or keep it out of the model this job checkpoints")
    """What to do about a ``kept`` tensor that changes, for the error that refuses the step."""

    def kept(self) -> dict[str, torch.Tensor]:
        """The live tensors that no version of this source holds, which a restore leaves
        as they are (ZeRO: frozen parameters, in no sub-group), by ``format.kept_key``.
        ``LayerCheck`` refuses a step where one changed since the timeline began, and
        records their fingerprints with each step's state, which a restore compares
        with the live ones (``live``). Default none: versions hold every parameter."""
        return {}

    def live(self, key: str) -> torch.Tensor | None:
        """The live tensor that a recorded ``kept`` key (of any source's) names, if this
        one holds it whole: what a restore compares with the recorded fingerprint.
        Default: none."""
        return None

    def check(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """ModelMismatch unless ``apply(i, tensors)`` fits; copies nothing."""
        raise NotImplementedError

    def apply(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy layer ``i``'s saved ``tensors`` into the live objects. They are views of
        a verified file's bytes (``recovery.tensor_views``): keep none of them, copy
        (``owned``) what becomes live state; but those that ``tensors.own`` names
        (where it has that attribute: ``recovery.Loaded``) were read apart at
        ``kept_apart``'s request, and may be kept as they are."""
        raise NotImplementedError

    def kept_apart(self) -> Callable[[str], bool] | None:
        """Which saved tensors (by key) ``apply`` would keep as live state as they
        are, had a restore read them into memory of their own (``Loaded.own``),
        rather than copy them; asked once per restore, before anything is read.
        None: it copies everything."""
        return None

    # -- another layout (format: layouts) ------------------------------------------
    ElasticRead = Callable[[int, str, int, int], torch.Tensor]
    """``read(rank, key, start, stop)``: the flat elements [start, stop) of tensor ``key``
    in rank ``rank``'s verified file of the version being loaded (``elastic.ElasticRead``:
    a rank's file is read and verified when first touched; CorruptVersion where damaged)."""

    def elastic_ranks(self, i: int, written: Layout) -> list[int]:
        """The ranks of ``written`` whose files of layer ``i``'s version this rank's
        ``apply_elastic`` reads: the plan verifies them (falling back past a damaged
        one) before anything changes. Default: every rank's."""
        return list(range(written.world_size))

    def check_elastic(self, i: int, written: Layout, read: "LayerSource.ElasticRead") -> None:
        """ModelMismatch unless ``apply_elastic(i, written, read)`` fits; changes nothing.
        Default: a source without ``apply_elastic`` is refused here, before any layer is
        copied in; one with it checks in it."""
        if type(self).apply_elastic is LayerSource.apply_elastic:
            raise ModelMismatch(self.cannot_reshard(written))

    def apply_elastic(self, i: int, written: Layout, read: "LayerSource.ElasticRead") -> None:
        """Load layer ``i`` from a version written under ``written`` (another world size
        or backend) through ``read`` (``ElasticRead``). Default: ModelMismatch naming
        ``resize_advice``."""
        raise ModelMismatch(self.cannot_reshard(written))

    def cannot_reshard(self, written: Layout) -> str:
        return (f"{type(self).__name__} cannot reshard a version that {written.describe()} "
                f"wrote: {self.resize_advice}")

    def _capture_buffers(self, i: int) -> dict[str, torch.Tensor]:
        return {tensor_key("buffer", name): host(b) for name, b in self.layer_map.buffers(i)}

    def _buffers(self, i: int, tensors: Mapping[str, torch.Tensor]
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(live buffer, its saved value) of layer ``i``, each checked (``take``)."""
        return [(b, take(tensors, tensor_key("buffer", name), b, self.layer_map.names[i]))
                for name, b in self.layer_map.buffers(i)]

    def group_members(self) -> list[str]:
        """Per param group of ``optimizer``, ``format.group_members`` of its parameters
        (recorded with every step's state; a restore into other groups is refused)."""
        names = {id(p): n for i in range(len(self.layer_map))
                 for n, p in self.layer_map.parameters(i)}
        return [group_members([names.get(id(p), f"#{j}") for j, p in enumerate(g["params"])])
                for g in self.optimizer.param_groups]

    def header_facts(self) -> dict[str, Any]:
        """Backend facts for the directory's header (JSON-ready)."""
        return {}

    def engine_state(self) -> dict[str, Any] | None:
        """The backend's counters, saved with every step's training state."""
        return None

    def after_restore(self, engine: Mapping[str, Any] | None, step: int) -> None:
        """Finish a restore of ``step``: every layer and the optimizer's
        hyper-parameters are back; ``engine`` is what ``engine_state`` gave then."""


class ModuleSource(LayerSource):
    """A plain ``nn.Module`` and its torch optimizer, in one process: a layer
    version holds ``param/<name>``, the optimizer state of each parameter
    (``optim/<field>/<name>``) and the layer's persistent buffers."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 layer_map: LayerMap) -> None:
        self.model, self.optimizer, self.layer_map = model, optimizer, layer_map
        self._named = {name: p for i in range(len(layer_map))
                       for name, p in layer_map.parameters(i)}

    def drift_layers(self) -> list[list[torch.Tensor]]:
        return [[p for _, p in self.layer_map.parameters(i)] for i in range(len(self.layer_map))]

    def frozen(self, i: int) -> list[str]:
        return [name for name, p in self.layer_map.parameters(i) if not p.requires_grad]

    def drift_adapters(self) -> Any:
        from .lora import AdapterDrift, drift_terms
        layer_of = {name: i for i in range(len(self.layer_map))
                    for name, _ in self.layer_map.parameters(i)}
        terms = drift_terms(self.model, layer_of)
        return AdapterDrift(terms) if terms else None

    def live(self, key: str) -> torch.Tensor | None:
        """A parameter, or its flat elements [start, stop) (``format.kept_range``)."""
        name, span = kept_range(key)
        p = self._named.get(name)
        if p is None or (span is not None and not 0 <= span[0] <= span[1] <= p.numel()):
            return None
        return p if span is None else p.detach().reshape(-1)[span[0]:span[1]]

    def capture(self, i: int, omit: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """Layer ``i``'s tensors but the parameters ``omit`` names (frozen ones, which
        its full version holds) and their optimizer state."""
        out: dict[str, torch.Tensor] = {}
        for name, p in self.layer_map.parameters(i):
            if name in omit:
                continue
            out[tensor_key("param", name)] = host(p)
            out.update(capture_optimizer_state(self.optimizer.state.get(p, {}), name))
        return {**out, **self._capture_buffers(i)}

    def check(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        self._placed(i, tensors)
        saved = optimizer_state(tensors)
        for name, p in self.layer_map.parameters(i):
            check_state_fields(self.layer_map.names[i], name, saved.get(name, {}),
                               self.optimizer.state.get(p, {}))

    def kept_apart(self) -> Callable[[str], bool] | None:
        """The optimizer state of host parameters that have none yet (a fresh
        optimizer): ``apply`` keeps it as read, instead of allocating it and copying
        (live state is copied into, and parameters always are: their storage stays
        the model's)."""
        fresh = {name for i in range(len(self.layer_map))
                 for name, p in self.layer_map.parameters(i)
                 if p.device.type == "cpu" and not self.optimizer.state.get(p)}
        if not fresh:
            return None
        return lambda key: key.startswith("optim/") and key.split("/", 2)[-1] in fresh

    def apply(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        pairs = self._placed(i, tensors)
        groups = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        own, state = getattr(tensors, "own", frozenset()), optimizer_state(tensors)
        with torch.no_grad():
            for live, saved in pairs:
                live.copy_(saved)
        for name, p in self.layer_map.parameters(i):
            if id(p) in groups:
                on_device = groups[id(p)].get("capturable") or groups[id(p)].get("fused")
                live = self.optimizer.state.get(p, {})
                self.optimizer.state[p] = {
                    field: owned(value, "cpu" if field == "step" and not on_device else p.device,
                                 live.get(field), own=tensor_key("optim", name, field) in own)
                    for field, value in state.get(name, {}).items()}

    def elastic_ranks(self, i: int, written: Layout) -> list[int]:
        return list(range(written.world_size))  # one process holds the whole layer

    def check_elastic(self, i: int, written: Layout, read: Any) -> None:
        """A version of FSDP2 ranks (or a plain module's): resharded into this source's
        tensors (``_resharded``), checked as a same-size version is (``check``), and
        kept with ``read`` for the apply (``ElasticRead.held``: the plan counts them)."""
        tensors = self._resharded(i, written, read)
        self.check(i, tensors)
        if hasattr(read, "held"):
            read.held = tensors

    def apply_elastic(self, i: int, written: Layout, read: Any) -> None:
        tensors = getattr(read, "held", None)
        if tensors is None:  # read again (beyond restore_memory): what the plan checked went
            tensors = self._resharded(i, written, read)
        else:
            read.held = None
        self.apply(i, tensors)

    def _whole(self, i: int, written: Layout, read: Any) -> dict[str, torch.Tensor]:
        """Layer ``i``'s whole tensors, from a version of ``written`` (see ``elastic``);
        ZeRO's flat partitions joined by ``reshard.zero_layer_tensors``; ModelMismatch for
        a layout read neither way."""
        from .elastic import resharded
        if written.backend == "zero":  # flat partitions: ZeRO's arithmetic joins them
            from .reshard import zero_layer_tensors
            return zero_layer_tensors(written, self.layer_map.names[i],
                                      self.layer_map.parameters(i), self.layer_map.buffers(i),
                                      read, self.optimizer)
        if written.backend not in (None, "fsdp"):
            raise ModelMismatch(self.cannot_reshard(written))
        return resharded(read, self.layer_map.parameters(i), self.layer_map.buffers(i),
                         lambda _, p: (0, p.shape[0] if p.dim() else 1))

    def _resharded(self, i: int, written: Layout, read: Any) -> dict[str, torch.Tensor]:
        """Layer ``i``'s tensors as this source holds them, from a version of ``written``:
        whole, in one process (``_whole``); a sharded source, its own share."""
        return self._whole(i, written, read)

    def _placed(self, i: int, tensors: Mapping[str, torch.Tensor]
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        layer = self.layer_map.names[i]
        return [(p, take(tensors, tensor_key("param", name), p, layer))
                for name, p in self.layer_map.parameters(i)] + self._buffers(i, tensors)


def local(t: torch.Tensor) -> torch.Tensor:
    """The elements of ``t`` this process holds: a DTensor's local shard, else ``t``."""
    to_local = getattr(t, "to_local", None)  # DTensor's; a plain tensor has none
    return to_local() if to_local is not None else t
