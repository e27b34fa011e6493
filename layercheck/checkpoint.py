"""LayerCheck: the object a training loop holds, on one rank or on each of many.

    lc = LayerCheck(model, optimizer, "ckpt/", LayerCheckConfig(), scheduler=scheduler)
    step = lc.restore()                  # 0 on a fresh directory, else the last completed step
    for step in range(step + 1, total + 1):
        ...; optimizer.step(); scheduler.step()
        lc.step(extra={"epoch": epoch})  # once after every optimizer step
    lc.close()                           # waits for pending writes

Call order: construct, ``restore()`` once before training (it also marks
where the new timeline starts), ``step()`` after every optimizer step,
``close()``. ``extra`` (JSON-serialisable) comes back in ``lc.extra`` after
``restore()``: the place for the data position.

One lifecycle for every backend: drift (``DriftTracker``) -> decide
(``Policy``) -> snapshot -> persist and commit (``Writer``) at every step;
plan -> verify -> restore (``Planner``) at the start. Where the layers'
tensors live is a ``source.LayerSource`` (default: the model's parameters and
the optimizer's state), what ranks agree on a ``ranks.Ranks`` (default: one
process). ``ZeroLayerCheck`` passes ZeRO's partitions and the process
group's ranks, ``FsdpLayerCheck`` FSDP2's DTensor shards and the same ranks;
there, every method is a collective.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torch import nn

from .backends import hostcopy
from .contract.config import LayerCheckConfig
from .directory import open_directory, refuse_to_abandon, write_header
from .drift.tracker import DriftTracker
from .backends.elastic import ElasticRead
from .contract.errors import (CorruptVersion, LayerCheckError, ModelMismatch, ReadFailed,
                              RestoreIncomplete, TimelineNotRecorded)
from .storage.format import MANIFEST, Layout, Version, encode_record, layout_record, resume_record
from .frozen import FrozenParts, KeptTensors, trained_nbytes
from .storage.layerfile import DTYPES
from .backends.layermap import LayerMap
from .storage.layerread import VerifiedFile
from .storage.lineage import new_timeline
from .storage.manifest import ManifestView, read_manifest
from .storage.pretrained import PretrainedFiles
from .contract.policy import Decision, Policy, PolicyState, Reason, lr_peak, lr_ratio
from .backends.ranks import Ranks
from .recovery import Plan, Planner, read_state, together
from .reports import RestoreReport, StepReport
from .storage.retention import Retention
from .snapshot import apply_state, capture_state, check_state
from .backends.source import LayerSource, ModuleSource, tensors_nbytes
from .storage.store import Store
from .storage.location import open_store
from .storage.writer import LayerSnapshot, StepJob, Writer, WriteRecord

if TYPE_CHECKING:
    from .tiers.config import TierConfig

__all__ = ["LayerCheck", "StepReport", "RestoreReport"]

log = logging.getLogger("layercheck")
UNBOUNDED = ("layercheck: %s keeps every layer version written (keep_versions=None), so it "
             "grows with every write: bound it with LayerCheckConfig(keep_versions=2) (each layer "
             "keeps its 2 newest versions and its base copy; the newest step stays recoverable), "
             "or prune it later with `python -m layercheck gc %s`")
"""The notice ``restore()`` logs (a warning of the ``layercheck`` logger: one line on stderr
where logging is not configured) when a run starts at step 0 with unbounded retention."""


class LayerCheck:
    """Layer-wise checkpointing of a model + optimizer (+ scheduler) into ``directory``.

    ``source`` and ``ranks`` are for backends (see the module doc): a backend
    passes where its layers live and how its ranks agree, and gets the whole
    lifecycle; ``model`` and ``optimizer`` are then the backend's own.
    ``pretrained``: the safetensors files (folder or file) the model was loaded
    from; frozen parameters found there unchanged are recorded by reference,
    not written (``layercheck.storage.pretrained``). ``tiers``: a memory tier (and buddy
    replica) over the directory, the durable tier (``layercheck.tiers``)."""

    def __init__(self, model: nn.Module, optimizer: Any, directory: "str | Store",
                 config: LayerCheckConfig | None = None, *, scheduler: Any = None,
                 layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 source: LayerSource | None = None, ranks: Ranks | None = None,
                 pretrained: "str | os.PathLike[str] | None" = None,
                 tiers: "TierConfig | None" = None) -> None:
        self.config = config or LayerCheckConfig()
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.layer_map = layer_map or LayerMap.for_model(model, self.config.layers)
        self.source = source or ModuleSource(model, optimizer, self.layer_map)
        self.pretrained = PretrainedFiles(pretrained) if pretrained is not None else None
        self.ranks = ranks or Ranks()
        self.policy = Policy.from_config(self.config, self.layer_map.names, self.layer_map.kinds)
        self.state = PolicyState(policy=self.policy)
        self.lr_peak = lr_peak(self.config.lr_peak, self.source.optimizer.param_groups,
                               scaling=self.config.lr_scaling)
        self.store = open_store(directory, **dict(storage_options or {}))
        self._closed = False
        if self.ranks.is_coordinator:
            self.store.lock()
        try:
            self._init_directory()
        except BaseException:
            self._release()
            raise
        self.frozen = FrozenParts(len(self.layer_map), self.source.frozen, self.source.fingerprints)
        self.kept = KeptTensors(self.source, self.ranks)
        self.drift = DriftTracker(self.source.optimizer, self.source.drift_layers(),
                                  groups=self.source.drift_groups(),
                                  sampling=self.config.drift_sampling,
                                  reduce=self.ranks.all_reduce_sum,
                                  adapters=self.source.drift_adapters(),
                                  fused_step=self.config.fused_step)
        self.writer = Writer(self.store, queue_bytes=self.config.queue_bytes,
                             on_error=self.config.on_error, commit=self.ranks.commit())
        self.current_step = 0
        self.timeline: str | None = None
        """The timeline steps are trained in (``storage.lineage``), once one is opened."""
        self.extra: dict[str, Any] | None = None
        self.last_report: StepReport | None = None
        self.restored: RestoreReport | None = None
        self._restore_called = False
        self._retry: set[int] = set()
        self.tiers = None
        if tiers is not None:
            from .tiers.tiered import Tiers
            self.tiers = Tiers(tiers, self)

    # -- lifecycle -----------------------------------------------------------
    def _init_directory(self) -> None:
        """The directory's header (written once) checked against this model, and the
        layout this job writes in (``directory.open_directory``)."""
        self.layout, self._new_layout = open_directory(
            self.store, self.ranks, self.layer_map, self.source.header_facts(),
            lambda facts: write_header(self.store, self.model, self.layer_map, self.config,
                                       self.lr_peak, self.ranks, facts), self.model)

    def close(self) -> None:
        """Wait for every pending write to commit, then release the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self.writer.close()
            if self.tiers is not None:
                self.tiers.close()
        finally:
            self.drift.remove()
            self._release()

    def _release(self) -> None:
        """Give the directory back (its lock, which the coordinator alone holds) and
        the ranks' own resources."""
        try:
            if self.ranks.is_coordinator:
                self.store.unlock()
        finally:
            self.ranks.close()

    def flush(self) -> None:
        """Wait until everything submitted so far is committed (in every tier)."""
        self.writer.flush()
        if self.tiers is not None:
            self.tiers.flush()

    def __enter__(self) -> "LayerCheck":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recovery --------------------------------------------------------------
    def restore(self, step: int | None = None, *, exact: bool = False) -> int:
        """Restore the composite state of ``step`` (default: the newest step every
        rank can recover; ``exact``: exactly ``step``, else CheckpointNotFound)
        into the live model, optimizer, scheduler and RNGs. Returns the restored
        step t (0 when there is nothing to restore): train on from t+1.

        Everything that can fail is checked before the first byte is copied in
        (every chosen file verified, the optimizer's and scheduler's types and
        state, each layer against the live model and optimizer): a failed restore
        leaves the model, optimizer, scheduler and RNGs as they were. Two failures
        can come later, and say what the objects then hold: a layer beyond
        ``restore_memory`` whose second read fails for good after others were
        copied in (RestoreIncomplete; those are read first, each retried), and
        the record of the new timeline (TimelineNotRecorded: the objects hold step
        t, the directory is as it was). After either, ``step()`` refuses until a
        ``restore()`` succeeds; after a failure before the first copy, the objects
        and the timeline are those of before the call. With ``tiers``, the newest
        step is restored from the freshest intact copy of each layer across the
        tiers (``layercheck.tiers.tiered``); a given ``step`` is restored from
        storage, and the memory tier's copies of later steps (the timeline it
        abandons) are dropped."""
        if self.tiers is not None and step is None:
            return self.tiers.restore(self, lambda: self._restore_durable(None, exact=exact))
        restored = self._restore_durable(step, exact=exact)
        if self.tiers is not None:
            self.tiers.drop_after(restored)
        return restored

    def _restore_durable(self, step: int | None, *, exact: bool) -> int:
        """``restore`` from the durable tier alone."""
        start = time.perf_counter()
        self.writer.flush()  # a failed pending write is raised before anything changes
        self.drift.take()  # sums of steps before a restore are of weights it replaces
        view = read_manifest(self.store, self.ranks.rank)
        for problem in view.problems if self.ranks.is_coordinator else []:
            warnings.warn(f"layercheck: {problem}", stacklevel=2)
        if step is None and not view.states:
            refuse_to_abandon(self.store.url, view)
            log.info("layercheck: %s holds no recoverable step; starting from step 0",
                     self.store.url)
            self._begin_timeline(0, view)
            self.restored = RestoreReport(0, None, time.perf_counter() - start, 0.0, 0.0, 0)
            return 0
        planner = Planner(self.store, view, ranks=self.ranks, keep_bytes=self.config.restore_bytes(),
                          threads=self.config.restore_threads, apart=self.source.kept_apart(),
                          running=self.layout.id, elastic_ranks=lambda version, written:
                          self.source.elastic_ranks(self.layer_map.index[version.layer], written))
        state, data = planner.state(step, exact=exact)
        tensors, doc = planner.together(lambda: self._read_state(state, data))
        sizes = np.zeros(len(self.layer_map))

        def check(version: Version, loaded: Any) -> None:
            index = self.layer_map.index[version.layer]
            if isinstance(loaded, ElasticRead):  # another layout: resharded on read
                self._elastic(version, loaded.layout,
                              lambda: self.source.check_elastic(index, loaded.layout, loaded))
                sizes[index] = version.total_bytes / self.ranks.world_size  # its share, about
                return
            self.source.check(index, loaded)
            sizes[index] = trained_nbytes(loaded, version.frozen)
        # everything is verified and checked against the live objects before anything changes
        loading = time.perf_counter()
        plan_s = loading - start
        sources = planner.layers(state.step, use=check)
        applying = time.perf_counter()
        self._restore_called = False  # from the first copy until this completes, step() refuses
        planner.together(lambda: self._apply(planner, sources, tensors, doc),
                         elsewhere=lambda: RestoreIncomplete.elsewhere(state.step))
        self.source.after_restore(doc["engine"], state.step)
        load_s = applying - loading + planner.load_s
        restore_s = time.perf_counter() - applying - planner.load_s
        rank = f"rank {self.ranks.rank}: " if self.ranks.sharded else ""
        for message in planner.warnings:
            warnings.warn(f"layercheck: {rank}{message}", stacklevel=2)
        self.extra = doc.get("extra")
        self._begin_timeline(state.step, view, base_taken=True, applied=True, standing=sources)
        if self.config.write_budget is not None:  # the budget counts from here, in these sizes
            self._set_sizes(sizes)
        plan = Plan(state.step, state, sources, planner.warnings, bases=planner.bases(sources))
        self.restored = RestoreReport(state.step, plan, plan_s, load_s, restore_s,
                                      sum(v.bytes for v in [*sources.values(),
                                                            *plan.bases.values()]))
        return state.step

    def _read_state(self, state: Version, data: VerifiedFile) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, doc = read_state(self.store, state, data)
        check_state(doc, self.source.optimizer, self.source.group_members(), self.scheduler)
        self.kept.check(doc.get("kept") or {}, state.step)
        return tensors, doc

    def _apply(self, planner: Planner, sources: dict[str, Version], tensors: dict[str, Any],
               doc: dict[str, Any]) -> None:
        """Put the planned composite into the live objects (``planner.load``: each
        version as verified in the plan, or read and verified again).

        Reading a file again is all that can fail here, so the layers read again go
        first: one that fails before any layer is copied changes nothing. Later, the
        layers already copied cannot be put back without a second copy of them in
        memory, which is what reading again saves: RestoreIncomplete says which
        layers hold what, on every rank."""
        step, done = doc["step"], []
        order = sorted(sources, key=lambda name: planner.kept(sources[name]))  # stable
        for name in order:
            index = self.layer_map.index[name]
            try:  # a version of another layout reads (again) as its source asks: in here
                loaded = planner.load(sources[name])
                if isinstance(loaded, ElasticRead):
                    self._elastic(sources[name], loaded.layout, lambda: self.source.apply_elastic(
                        index, loaded.layout, loaded))  # noqa: B023 - called at once
                else:
                    self.source.apply(index, loaded)
            except (ReadFailed, CorruptVersion) as exc:
                if not done:
                    raise type(exc)(f"{exc}. Restore read it again to copy it in, before "
                                    "anything else: nothing was changed; call restore() "
                                    "again once the storage answers") from None
                raise RestoreIncomplete.copying(self.store.url, step, exc, done, [
                    n for n in order if n not in done]) from None
            done.append(name)
        apply_state(tensors, doc, self.source.optimizer, self.scheduler)

    def _elastic(self, version: Version, written: Layout, work: Any) -> None:
        """``work()``, a source's check or apply of a version written in another layout;
        a refusal (ModelMismatch) says which version, and both world sizes."""
        try:
            work()
        except ModelMismatch as exc:
            raise ModelMismatch(
                f"layer {version.layer}: its version of step {version.step} was written by "
                f"{_ranks(written.world_size)}, this job has {self.ranks.world_size} "
                f"({written.describe()} -> {self.layout.describe()}): {exc}") from None

    def _begin_timeline(self, step: int, view: ManifestView, *, base_taken: bool = False,
                        applied: bool = False,
                        standing: dict[str, Version] | None = None) -> None:
        """Everything recorded beyond ``step`` is abandoned; counting restarts at ``step``
        (restored layers equal their saved copies: their accumulators start at zero).
        ``view`` is the manifest as read before (nothing was written since); it is
        brought up to date in memory rather than read again. The record comes after
        the apply (``applied``: a restore of ``step`` was copied in), so that a
        restore that fails abandons nothing; if it cannot be written, every rank
        raises TimelineNotRecorded, saying what the objects hold. ``standing``: the
        version of each layer a restore applied (retention counts no newer one it
        passed over)."""
        self.writer.flush()
        timeline = self.ranks.from_coordinator(new_timeline())  # one id on every rank
        resume = resume_record(step, timeline)
        records = [resume] + ([layout_record(self.layout)] if self._new_layout else [])
        together(self.ranks, lambda: self._record(records, applied),
                 elsewhere=lambda: TimelineNotRecorded.at(
                     self.store.url, step, "rank 0 could not append it: its error says why",
                     applied))
        for record in records:
            view.apply(record)
        self._new_layout = False  # recorded: this job's versions name it from now on
        self.timeline = timeline  # copies outside the directory record it (``lineage``)
        self.writer.layout = self.layout.id
        self.current_step = step
        self.state = PolicyState.at(self.policy, step, base_taken=base_taken)
        self.drift.resync()
        self.kept.start(step)
        self.frozen.start(self.layer_map.names, {  # a full version of another layout holds
            name: v for name, v in (standing or {}).items()  # no shard of this one's ranks
            if v.layout == self.layout.id})
        if self.config.keep_versions is not None:
            self.writer.retention = Retention(self.config.keep_versions, view, standing)
        elif step == 0 and self.ranks.is_coordinator:  # the default, as a run starts:
            log.warning(UNBOUNDED, self.store.url, self.store.url)  # say how to bound it
        self._restore_called = True
        self.ranks.barrier()  # no rank writes into the new timeline before it is opened

    def _record(self, records: list[dict[str, Any]], applied: bool) -> None:
        """Append the ``resume`` record (and this job's new layout) in one append."""
        if not self.ranks.is_coordinator:
            return
        try:
            self.store.append(MANIFEST, b"".join(encode_record(r) for r in records))
        except OSError as exc:
            raise TimelineNotRecorded.at(self.store.url, records[0]["step"], exc, applied) from None

    def _start_without_restore(self) -> None:
        """A run that never called restore(): fine on an empty directory; on one
        holding checkpoints, starting over would abandon them, so refuse."""
        view = read_manifest(self.store, self.ranks.rank)
        refuse_to_abandon(self.store.url, view)
        self._begin_timeline(0, view)

    # -- training --------------------------------------------------------------
    def step(self, extra: Mapping[str, Any] | None = None) -> StepReport:
        """Account one optimizer step; at an opportunity, snapshot the chosen
        layers and the training state and queue them for the writer."""
        if self._closed:
            raise LayerCheckError("step() after close(): create a new LayerCheck to go on")
        if not self._restore_called:
            self._start_without_restore()
        self.writer.raise_if_failed()
        self.current_step += 1
        t = self.current_step
        drift, lr, drift_s = self.drift.take()
        self.frozen.observe()
        decision = self.state.observe(t, drift, lr_ratio(lr, self.lr_peak))
        decision = self._add_failed(decision)
        start = time.perf_counter()
        queued = 0
        if self.policy.is_opportunity(t) and self.state.base_step is not None:
            queued = self._submit(t, decision, extra)
        if self.tiers is not None:
            self.tiers.step(self, t, extra)
        report = StepReport(t, decision, drift, lr, drift_s, time.perf_counter() - start, queued,
                            decision.k_scale)
        self.last_report = report
        return report

    def _set_sizes(self, local: np.ndarray) -> None:
        """Give the policy each layer's bytes (summed over the ranks' shards): what a
        write budget charges. Every rank calls it at the same step."""
        sizes = np.round(self.ranks.all_reduce_sum(np.asarray(local, dtype=np.float64)))
        self.policy = dataclasses.replace(self.policy, sizes=sizes)
        self.state.policy = self.policy

    def _submit(self, t: int, decision: Decision, extra: Mapping[str, Any] | None) -> int:
        kept = self.kept.unchanged()  # what no version holds: refused if it moved
        snaps = []
        for index, reason in zip(decision.layers.tolist(), decision.reasons.tolist()):
            part = self.frozen.part(index, t)  # frozen parameters: in the full version only
            refs = self._references(index, part.frozen) if part.base is None else ()
            omit = part.omit | {ref[0] for ref in refs}
            tensors = (self.source.capture(index, omit) if omit  # type: ignore[call-arg]
                       else self.source.capture(index))
            snaps.append(LayerSnapshot(index, self.layer_map.names[index], Reason(reason).label,
                                       tensors, tensors_nbytes(tensors), part.frozen, part.base,
                                       refs))
        if t == self.state.base_step:  # every layer, just captured: its size for a budget
            local = np.zeros(len(self.layer_map))
            local[[snap.index for snap in snaps]] = [  # frozen weights: written this once
                trained_nbytes(snap.tensors, snap.frozen) for snap in snaps]
            self._set_sizes(local)
        state = capture_state(t, self.source.optimizer, self.scheduler, extra,
                              self.source.engine_state(), self.source.group_members(), kept)
        copies = hostcopy.fence()  # device copies still under way: the writer waits for them
        job = StepJob(step=t, layers=snaps, state=state,
                      nbytes=sum(s.nbytes for s in snaps) + tensors_nbytes(state[0]),
                      ready=copies.wait if copies is not None else None)
        self.writer.submit(job)
        return job.nbytes

    def _references(self, index: int, frozen: tuple[str, ...]
                    ) -> tuple[tuple[str, str, str, str], ...]:
        """The frozen parameters of a full version that a pretrained file holds as they
        are (``pretrained``): recorded by reference and checksum, not written."""
        if self.pretrained is None or not frozen:
            return ()
        params = dict(self.layer_map.parameters(index))
        refs = []
        for name in frozen:
            value = params[name].detach().to("cpu").contiguous()
            data = value.reshape(-1).view(torch.uint8).numpy()
            ref = self.pretrained.find(memoryview(data), DTYPES[value.dtype], tuple(value.shape))
            if ref is not None:
                refs.append((name, ref.file, ref.key, ref.checksum))
        return tuple(refs)

    def _add_failed(self, decision: Decision) -> Decision:
        """Under on_error='warn', layers whose write failed join the next opportunity."""
        failed = self.writer.take_failed_layers()
        self.frozen.forget(failed)  # a full version that failed holds nothing for later ones
        self._retry |= failed
        if not self._retry or not self.policy.is_opportunity(decision.step):
            return decision
        extra = sorted(self._retry - set(decision.layers.tolist()))
        self._retry = set()
        self.state.mark_written(decision.step, extra)
        layers = np.concatenate([decision.layers, np.array(extra, dtype=np.int64)])
        reasons = np.concatenate([decision.reasons, np.full(len(extra), Reason.RETRY,
                                                            dtype=np.int64)])
        order = np.argsort(layers, kind="stable")
        return Decision(decision.step, layers[order], reasons[order], decision.k_scale)

    # -- introspection ---------------------------------------------------------
    def drain_writes(self) -> list[WriteRecord]:
        """Layer versions committed since the last call (for profiling)."""
        return self.writer.drain_completed()

    @property
    def bytes_written(self) -> int:
        return self.writer.bytes_written


def _ranks(world_size: int) -> str:
    return "1 process" if world_size == 1 else f"{world_size} ranks"
