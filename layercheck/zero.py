"""LayerCheck inside DeepSpeed ZeRO (stages 1, 2 and 3), one object per rank.

    from layercheck import LayerCheckConfig
    from layercheck.groups import layer_aligned_param_groups
    from layercheck.zero import ZeroLayerCheck

    optimizer = torch.optim.AdamW(layer_aligned_param_groups(model, weight_decay=0.01), lr=2e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    lc = ZeroLayerCheck(engine, "ckpt/", LayerCheckConfig(...))
    step = lc.restore()                 # every rank, same directory
    for step in range(step + 1, total + 1):
        loss = engine(batch).loss; engine.backward(loss); engine.step()
        lc.step()                       # every rank, after every engine.step()
    lc.close()

What happens on each rank:
- Drift is computed on the update path from this rank's flat fp32 partitions
  and their Adam moments (the inner optimizer's step hook), and the per-layer
  sums are all-reduced, so every rank sees the exact global drift and the
  pure policy makes the same decision everywhere: a layer is written by all
  ranks at the same step.
- Each rank persists its own shard of a layer version (its fp32 master
  partitions, exp_avg, exp_avg_sq and step counts): no gather. The version's
  manifest record, naming every rank's shard, is appended by rank 0 only once
  every rank's shard is durable (``commit.ShardedCommit``).
- Recovery: every rank loads its shard of the newest committed version of
  each layer (the ranks agree on the version, falling back together past a
  shard that fails its checksum on any rank), restores fp32 masters and Adam
  moments, and refreshes the module weights from them (DeepSpeed's own
  ``safe_set_full_fp32_param`` would leave the 16-bit weights stale).

The optimizer's parameter groups must be layer-aligned (no group mixes two
layers; ``groups.layer_aligned_param_groups`` builds them) so that a layer's
optimizer state is whole flat partitions. The directory must be shared by
all ranks (one filesystem or object store).
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .checkpoint import MODEL_CONFIG, LayerCheck, RestoreReport
from .commit import ShardedCommit, all_gather_json
from .config import LayerCheckConfig
from .errors import CheckpointNotFound, CorruptVersion, LayerCheckError, ModelMismatch
from .layermap import LayerMap
from .manifest import (FORMAT, MANIFEST, ManifestView, Version, encode_record, read_manifest,
                       read_verified, seal_torn_tail)
from .policy import Policy, PolicyState
from .recovery import Plan, parse_safetensors
from .snapshot import apply_state, capture_state, tensors_nbytes
from .store import open_store
from .writer import Writer

__all__ = ["ZeroLayerCheck", "Partitions", "Stage3Partitions", "Stage12Partitions",
           "partitions_for"]


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)


class Partitions:
    """This rank's flat fp32 partitions ("sub-groups"), which layer each belongs
    to, their Adam state, and how the module weights are refreshed from them.

    Subclasses bind DeepSpeed's stage-specific attributes: ``flats`` (fp32
    master partitions, one per sub-group), ``members`` (the module parameters
    flattened into each), ``group_ids`` (the inner optimizer's param group of
    each) and ``low`` (the module-dtype partition each one feeds)."""

    flats: list[torch.Tensor]
    members: list[list[torch.nn.Parameter]]
    group_ids: list[int]

    def __init__(self, ds_optimizer: Any, layer_map: LayerMap) -> None:
        self.ds = ds_optimizer
        self.inner: torch.optim.Optimizer = ds_optimizer.optimizer
        self.layer_map = layer_map
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

    def _bind(self) -> None:
        raise NotImplementedError

    def low(self, k: int) -> torch.Tensor:
        """The module-dtype partition that sub-group ``k``'s fp32 master feeds."""
        raise NotImplementedError

    def refresh_module(self) -> None:
        """Make the module weights (and gathered copies) reflect the low partitions.
        A collective: every rank calls it."""
        raise NotImplementedError

    def group(self, k: int) -> dict:
        return self.inner.param_groups[self.group_ids[k]]

    def capture(self, i: int) -> dict[str, torch.Tensor]:
        """Host copies of layer ``i``'s shard on this rank."""
        out: dict[str, torch.Tensor] = {}
        for k in self.of_layer[i]:
            out[f"master/sg{k}"] = _host(self.flats[k])
            for key, value in self.inner.state.get(self.flats[k], {}).items():
                if torch.is_tensor(value):
                    out[f"optim/{key}/sg{k}"] = _host(value)
                elif isinstance(value, (int, float)):
                    out[f"optim/{key}/sg{k}"] = torch.tensor(float(value), dtype=torch.float64)
        for name, b in self.layer_map.buffers(i):
            out[f"buffer/{name}"] = _host(b)
        return out

    def apply(self, i: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy a loaded shard of layer ``i`` into the fp32 masters, the Adam state
        and the module-dtype partitions (``refresh_module`` finishes the job)."""
        layer = self.layer_map.names[i]
        with torch.no_grad():
            for k in self.of_layer[i]:
                flat = self.flats[k]
                master = _take(tensors, f"master/sg{k}", flat.shape, layer)
                flat.copy_(master)
                state = {}
                for key, value in tensors.items():
                    kind, _, rest = key.partition("/")
                    field, _, owner = rest.partition("/")
                    if kind == "optim" and owner == f"sg{k}":
                        state[field] = value if field == "step" else value.to(flat.device)
                if not state:
                    raise ModelMismatch(f"layer {layer}: the saved shard has no optimizer state "
                                        f"for sub-group {k}")
                self.inner.state[flat] = state
                self.low(k).copy_(flat)
            for name, b in self.layer_map.buffers(i):
                b.copy_(_take(tensors, f"buffer/{name}", b.shape, layer))

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

    def refresh_module(self) -> None:
        self.ds.update_lp_params()  # copies fp32 -> bit16 partitions, then all-gathers


def partitions_for(engine: Any, layer_map: LayerMap) -> Partitions:
    """The ``Partitions`` of ``engine``'s ZeRO optimizer, by stage."""
    stage = int(engine.zero_optimization_stage()) if hasattr(engine, "zero_optimization_stage") else 0
    ds = engine.optimizer
    if stage == 3:
        return Stage3Partitions(ds, layer_map)
    if stage in (1, 2):
        parts = Stage12Partitions(ds, layer_map)
        parts.stage = stage
        return parts
    raise LayerCheckError(f"the DeepSpeed engine runs ZeRO stage {stage}: ZeroLayerCheck needs "
                          "stage 1, 2 or 3 (for no ZeRO, use LayerCheck(engine.module, "
                          "engine.optimizer, ...))")


def _take(tensors: Mapping[str, torch.Tensor], key: str, shape: torch.Size,
          layer: str) -> torch.Tensor:
    if key not in tensors:
        raise ModelMismatch(f"layer {layer}: the saved shard has no {key}; it was written for a "
                            "different model, optimizer grouping or world size")
    value = tensors[key]
    if value.shape != shape:
        raise ModelMismatch(f"layer {layer}: {key} has shape {tuple(value.shape)} in the "
                            f"checkpoint but {tuple(shape)} here; restore with the same world "
                            "size and parameter groups")
    return value


class ZeroLayerCheck(LayerCheck):
    """Layer-wise checkpointing of a DeepSpeed ZeRO engine (see the module doc).

    Every rank constructs one with the same directory and config, calls
    ``restore()`` once, ``step()`` after every ``engine.step()`` and
    ``close()``: they are collectives."""

    def __init__(self, engine: Any, directory: str, config: LayerCheckConfig | None = None, *,
                 scheduler: Any = None, layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 timeout_s: float = 1800.0) -> None:
        import datetime
        import torch.distributed as dist
        if not dist.is_initialized():
            raise LayerCheckError("torch.distributed is not initialised: create ZeroLayerCheck "
                                  "after deepspeed.initialize()")
        self.config = config or LayerCheckConfig()
        self.engine = engine
        self.model = engine.module
        self.optimizer = engine.optimizer
        self.scheduler = scheduler if scheduler is not None else engine.lr_scheduler
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        timeout = datetime.timedelta(seconds=timeout_s)
        # two CPU groups: one for the training thread, one for the writer thread
        # (collectives of two threads must never share a group)
        self._step_group = dist.new_group(backend="gloo", timeout=timeout)
        self._commit_group = dist.new_group(backend="gloo", timeout=timeout)
        self.layer_map = layer_map or (LayerMap.explicit(self.model, self.config.layers)
                                       if self.config.layers else LayerMap.auto(self.model))
        self.parts = partitions_for(engine, self.layer_map)
        self.inner = self.parts.inner
        self.policy = Policy.from_config(self.config, self.layer_map.names, self.layer_map.kinds)
        self.state = PolicyState(policy=self.policy)
        self.lr_peak = self.config.lr_peak or max(
            float(g.get("initial_lr", g["lr"])) for g in self.inner.param_groups)
        self.store = open_store(directory, **dict(storage_options or {}))
        self._closed = False
        if self.rank == 0:
            self.store.lock()
        try:
            self._init_directory()
        except BaseException:
            if self.rank == 0:
                self.store.unlock()
            raise
        self.drift = ShardedDrift(self.parts, reduce=self._all_reduce)
        self.writer = Writer(self.store, queue_bytes=self.config.queue_bytes,
                             on_error=self.config.on_error,
                             commit=ShardedCommit(self._commit_group, self.rank, self.world_size))
        self.current_step = 0
        self.extra = None
        self.last_report = None
        self.restored = None
        self._restore_called = False
        self._retry = set()

    # -- collectives on the training thread ----------------------------------
    def _all_reduce(self, sums: np.ndarray) -> np.ndarray:
        import torch.distributed as dist
        t = torch.tensor(sums, dtype=torch.float64)  # a copy: the caller's array stays its own
        dist.all_reduce(t, group=self._step_group)
        return t.numpy()

    def _agree_min(self, values: np.ndarray) -> tuple[np.ndarray, bool]:
        """(elementwise minimum over ranks, whether every rank had exactly it)."""
        import torch.distributed as dist
        t = torch.from_numpy(np.asarray(values, dtype=np.int64).copy())
        low, high = t.clone(), t.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self._step_group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self._step_group)
        return low.numpy(), bool(torch.equal(low, high))

    def _barrier(self) -> None:
        import torch.distributed as dist
        dist.barrier(group=self._step_group)

    # -- lifecycle --------------------------------------------------------------
    def _init_directory(self) -> None:
        if self.rank == 0:
            if seal_torn_tail(self.store):
                warnings.warn(f"layercheck: {MANIFEST} ended in a torn record; it is skipped",
                              stacklevel=3)
            if read_manifest(self.store).header is None:
                self._write_header()
        self._barrier()
        view = read_manifest(self.store, self.rank)
        if view.header is None:
            raise LayerCheckError(f"{self.store.url}: rank {self.rank} cannot see the manifest "
                                  "rank 0 wrote; the directory must be shared by all ranks")
        self.layer_map.check_signature(view.header["layers"])
        if view.world_size != self.world_size:
            raise ModelMismatch(f"{self.store.url} was written by {view.world_size} ranks, this job "
                                f"has {self.world_size}: resume at the same world size, or export "
                                "it (python -m layercheck export) and load the export")

    def _write_header(self) -> None:
        engine = self.engine
        header = {"kind": "header", "format": FORMAT, "layers": self.layer_map.signature(),
                  "config": self.config.to_dict(), "lr_peak": self.lr_peak,
                  "created": time.time(), "world_size": self.world_size,
                  "zero": {"stage": self.parts.stage,
                           "sub_groups": self.parts.describe(),
                           "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                            for g in self.inner.param_groups],
                           "module_keys": list(self.model.state_dict().keys()),
                           "ds_config": _jsonable(getattr(engine, "config", None)),
                           "checkpoint": _checkpoint_facts(engine, self.parts)}}
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            self.store.write_atomic(MODEL_CONFIG, config.to_json_string().encode())
        self.store.append(MANIFEST, encode_record(_jsonable(header)))

    def _release(self) -> None:
        if self.rank == 0:  # rank 0 alone holds the lock
            self.store.unlock()

    # -- recovery -----------------------------------------------------------------
    def restore(self, step: int | None = None) -> int:
        """Restore this rank's shard of the composite state of ``step`` (default:
        the newest step every rank can recover) and refresh the module weights.
        Returns the restored step t (0 on a fresh directory); a collective."""
        start = time.perf_counter()
        view = read_manifest(self.store, self.rank)
        for problem in view.problems if self.rank == 0 else []:
            warnings.warn(f"layercheck: {problem}", stacklevel=2)
        if not view.states:
            if step is not None:
                raise CheckpointNotFound(f"{self.store.url}: no recoverable step yet")
            self._begin_timeline(0, view)
            self.restored = RestoreReport(0, None, time.perf_counter() - start, 0.0, 0.0, 0)
            return 0
        notes: list[str] = []
        state, data = self._agreed_state(view, step, notes)
        plan_s = time.perf_counter() - start
        load_s, restore_s, sources = self._load_layers(view, state.step, notes)
        t0 = time.perf_counter()
        tensors, metadata = parse_safetensors(data, state.file)
        doc = apply_state(tensors, metadata, self.inner, self.scheduler)
        engine_state = (doc.get("extra") or {}).pop("_deepspeed", {})
        self.engine.global_steps = int(engine_state.get("global_steps", state.step))
        self.engine.global_samples = int(engine_state.get(
            "global_samples", state.step * self.engine.train_batch_size()))
        self.engine.skipped_steps = int(engine_state.get("skipped_steps", 0))
        self.parts.refresh_module()
        restore_s += time.perf_counter() - t0
        for message in notes:
            warnings.warn(f"layercheck: rank {self.rank}: {message}", stacklevel=2)
        self.extra = (doc.get("extra") or {}).get("user")
        self._begin_timeline(state.step, view, base_taken=True)
        plan = Plan(step=state.step, state=state, sources=sources, warnings=notes)
        self.restored = RestoreReport(state.step, plan, plan_s, load_s, restore_s,
                                      sum(v.bytes for v in sources.values()))
        return state.step

    def _agreed_state(self, view: ManifestView, step: int | None,
                      notes: list[str]) -> tuple[Version, bytes]:
        """The newest step <= ``step`` whose training state every rank can read."""
        bound = view.latest_step() if step is None else step
        while True:
            mine, data = _newest_intact([v for s, v in view.states.items() if s <= bound],
                                        self.store, notes, "training state")
            agreed, same = self._agree_min(np.array([mine.step if mine else -1]))
            if agreed[0] < 0:
                raise CheckpointNotFound(f"no recoverable step at or before {bound} on every rank")
            if same:
                return mine, data  # type: ignore[return-value]
            bound = int(agreed[0])

    def _load_layers(self, view: ManifestView, step: int,
                     notes: list[str]) -> tuple[float, float, dict[str, Version]]:
        """Load and apply every layer's newest intact shard <= ``step``, the ranks
        agreeing on each layer's version; returns (load s, apply s, the versions)."""
        names = self.layer_map.names
        bound = np.full(len(names), step, dtype=np.int64)
        chosen = np.full(len(names), -2, dtype=np.int64)
        load_s = apply_s = 0.0
        sources: dict[str, Version] = {}
        while True:
            for i, name in enumerate(names):
                if chosen[i] == bound[i]:
                    continue
                t0 = time.perf_counter()
                versions = [v for v in view.versions.get(name, []) if v.step <= bound[i]]
                version, data = _newest_intact(versions, self.store, notes, f"layer {name}")
                load_s += time.perf_counter() - t0
                if version is None:
                    chosen[i] = -1
                    continue
                t0 = time.perf_counter()
                tensors, _ = parse_safetensors(data, version.file)
                self.parts.apply(i, tensors)
                apply_s += time.perf_counter() - t0
                chosen[i] = version.step
                sources[name] = version
            agreed, same = self._agree_min(chosen)
            if (agreed < 0).any():
                missing = names[int(np.argmin(agreed))]
                raise CheckpointNotFound(f"layer {missing} has no intact committed version at or "
                                         f"before step {step} on every rank")
            if same:
                return load_s, apply_s, sources
            bound = agreed

    # -- training ------------------------------------------------------------------
    def step(self, extra: Mapping[str, Any] | None = None):
        """Account one ``engine.step()`` on this rank (a collective: all ranks call it)."""
        return super().step(extra)

    def _submit(self, t: int, decision, extra: Mapping[str, Any] | None) -> int:
        from .policy import Reason
        from .writer import LayerSnapshot, StepJob
        snaps = []
        for index, reason in zip(decision.layers.tolist(), decision.reasons.tolist()):
            tensors = self.parts.capture(index)
            snaps.append(LayerSnapshot(index, self.layer_map.names[index], Reason(reason).label,
                                       tensors, tensors_nbytes(tensors)))
        engine = self.engine
        doc = {"user": dict(extra) if extra is not None else None,
               "_deepspeed": {"global_steps": int(engine.global_steps),
                              "global_samples": int(engine.global_samples),
                              "skipped_steps": int(engine.skipped_steps)}}
        state = capture_state(t, self.inner, self.scheduler, doc)
        job = StepJob(step=t, layers=snaps, state=state,
                      nbytes=sum(s.nbytes for s in snaps) + tensors_nbytes(state[0]))
        self.writer.submit(job)
        return job.nbytes

    def _append(self, record: dict[str, Any]) -> None:
        if self.rank == 0:  # rank 0 alone writes the manifest
            super()._append(record)

    def _read_manifest(self) -> ManifestView:
        return read_manifest(self.store, self.rank)

    def _begin_timeline(self, step: int, view: ManifestView, *, base_taken: bool = False) -> None:
        super()._begin_timeline(step, view, base_taken=base_taken)
        self._barrier()  # no rank writes into the new timeline before rank 0 has opened it


class ShardedDrift:
    """Per-layer drift from this rank's flat partitions, exact over all ranks.

    The inner optimizer's step hook runs after each flat partition's update
    (ZeRO-3 steps one sub-group at a time; ZeRO-1/2 all at once) and adds,
    for the partitions that were just updated, sum |w(t) - w(t-1)| and
    sum |w(t)| per layer (the update-path formula of ``drift.py``, no weight
    copy, float64 sums). ``take()`` all-reduces the two sums over the ranks
    and returns d_l = moved / size: the same number on every rank, equal to
    the drift of the whole unpartitioned layer. Call ``take`` once per
    optimizer step (``step()`` does).
    """

    def __init__(self, parts: Partitions, *, reduce: Callable[[np.ndarray], np.ndarray]) -> None:
        self.parts = parts
        self.reduce = reduce
        self._layer_of = {id(f): parts.layer_of[k] for k, f in enumerate(parts.flats)}
        self._sums = np.zeros((2, len(parts.of_layer)), dtype=np.float64)
        self.lr = float("nan")
        self.seconds = 0.0
        self._handle = parts.inner.register_step_post_hook(self._after_step)

    def remove(self) -> None:
        self._handle.remove()

    def resync(self) -> None:
        """Nothing cached: step counts are read from the optimizer state each time."""

    def take(self) -> tuple[np.ndarray, float, float]:
        start = time.perf_counter()
        moved, size = self.reduce(self._sums)
        self._sums[:] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            drift = np.where(size > 0, moved / np.where(size > 0, size, 1.0),
                             np.where(moved > 0, np.inf, 0.0))
        seconds = self.seconds + time.perf_counter() - start
        self.seconds = 0.0
        return drift, self.lr, seconds

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        start = time.perf_counter()
        with torch.no_grad():
            for group in optimizer.param_groups:
                for flat in group["params"]:
                    layer = self._layer_of.get(id(flat))
                    state = optimizer.state.get(flat)
                    if layer is None or flat.grad is None or not state or "exp_avg" not in state:
                        continue
                    moved, size = _adam_sums(optimizer, group, flat, state)
                    self._sums[0, layer] += moved
                    self._sums[1, layer] += size
        self.lr = max(float(g["lr"]) for g in optimizer.param_groups)
        self.seconds += time.perf_counter() - start


def _adam_sums(optimizer: torch.optim.Optimizer, group: Mapping[str, Any], w: torch.Tensor,
               state: Mapping[str, Any]) -> tuple[float, float]:
    """(sum |w(t) - w(t-1)|, sum |w(t)|) of one tensor just updated by Adam/AdamW,
    from its moments (see ``drift.py`` for the derivation)."""
    step = float(state["step"])
    lr, eps = float(group["lr"]), float(group["eps"])
    beta1, beta2 = (float(b) for b in group["betas"])
    bc1, c = 1 - beta1 ** step, (1 - beta2 ** step) ** 0.5
    v = state["max_exp_avg_sq"] if group.get("amsgrad") else state["exp_avg_sq"]
    q = v.add(1e-30).sqrt_().add_(eps * c).reciprocal_().mul_(state["exp_avg"])
    scale = lr / bc1 * c
    wd = float(group.get("weight_decay", 0.0))
    decoupled = group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW))
    shrink = 1.0
    if wd and decoupled:
        q.add_(w, alpha=lr * wd / scale)
        shrink = 1 - lr * wd
    moved = scale * float(q.abs_().sum(dtype=torch.float64)) / shrink
    return moved, float(w.abs().sum(dtype=torch.float64))


def _newest_intact(versions: list[Version], store: Any, notes: list[str],
                   what: str) -> tuple[Version | None, bytes | None]:
    """The newest of ``versions`` whose file (this rank's shard) verifies, and its bytes."""
    for version in sorted(versions, key=lambda v: v.step, reverse=True):
        try:
            return version, read_verified(store, version)
        except CorruptVersion as exc:
            notes.append(f"{what}: skipping the version of step {version.step}: {exc}")
    return None, None


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
    """``value`` with tuples, sizes and numpy/torch scalars made plain JSON."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, torch.Size)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
