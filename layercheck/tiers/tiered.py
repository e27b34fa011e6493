"""Tiers: what a LayerCheck holds when a ``TierConfig`` is given (memory -> buddy -> storage).

    lc = LayerCheck(model, optimizer, "ckpt/", config, tiers=TierConfig(budget_bytes=4 << 30))

Every ``step()`` also puts every layer's tensors and the training state into
this rank's memory tier (``layercheck.tiers.memory``) and, with a buddy, sends
them to it (``layercheck.tiers.buddy``); the durable tier goes on as without
tiers. ``restore()`` (of the newest step) gathers every rank's inventory of
verified copies, chooses each layer's freshest intact copy
(``layercheck.tiers.choice``), moves the buddies' copies to the ranks that
need them, reads the layers left to storage from the durable directory, and
checks everything against the live objects before it copies the first byte:
like the durable restore, it applies all or nothing. A restore of an older
step (``restore(step)``) is the durable one. Slots of steps after the
restored one (a timeline abandoned) are taken away on every node, from every
rank's folder there (``drop_after``; also after ``restore(step)``).

Memory copies are keyed by the durable directory's header (its creation
time): a memory tier left by another run in the same folder is never used.
Each copy records its timeline, and is used only where the manifest's lineage
holds it (``layercheck.storage.lineage``): a node that sat out a restore of an
older step (its folder not reached by ``drop_after``) may keep the abandoned
timeline's copies, and a restore after the job comes back onto it refuses them.
A sharded backend's copies (``FsdpLayerCheck``, ``ZeroLayerCheck``) are its
source's ``capture()`` (the shard the rank owns), recorded with their layout;
one of another layout is never applied as it is (``layercheck.tiers.shards``),
and a layer's shards come from one step on every rank.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..contract.errors import CheckpointNotFound, CorruptVersion
from ..frozen import trained_nbytes
from ..storage.format import read_state_document, tensor_key
from ..storage.layerread import read_verified_file
from ..storage.lineage import Lineage
from ..storage.manifest import ManifestView, read_manifest
from ..storage.store import Store
from ..backends.ranks import together
from ..recovery import Planner, read_state
from ..reports import RestoreReport
from ..snapshot import apply_state, capture_state, check_state
from ..backends.source import ModuleSource
from ..storage.views import tensor_views
from ..backends import hostcopy
from .buddy import BuddyLink
from .choice import STORAGE, Choice, Copy, choose
from .config import TierConfig
from .memory import MemoryTier, slot_bytes
from .reshard import resume
from .shards import sharded, tier_layout, usable
from .slots import Slot, off_lineage, tensors_from, verified_bytes

LayerCheck = Any
"""The ``layercheck.checkpoint.LayerCheck`` that holds these tiers (it imports this
module, so the annotation does not import it back)."""

__all__ = ["Tiers", "TierRestore", "live_tensors", "job_of", "durable_layer"]

log = logging.getLogger("layercheck")


@dataclass
class TierRestore:
    """What a tiered restore took: per layer of this rank, (tier, step)."""

    step: int
    sources: dict[str, tuple[str, int]] = field(default_factory=dict)

    def tiers(self) -> dict[str, int]:
        """How many layers came from each tier."""
        out: dict[str, int] = {}
        for tier, _ in self.sources.values():
            out[tier] = out.get(tier, 0) + 1
        return out


def job_of(view: ManifestView) -> str:
    """The identity memory copies are keyed by: the durable directory's header."""
    return repr((view.header or {}).get("created"))


def live_tensors(source: Any, i: int) -> dict[str, torch.Tensor]:
    """Layer ``i``'s tensors, keyed as ``source.capture(i)`` keys them: the live ones
    for a ``ModuleSource`` (the memory tier copies them once, into its files),
    else the source's capture (a host copy of the shard a backend's rank owns; a
    device's copies are awaited: ``hostcopy.fence``)."""
    if type(source) is not ModuleSource:
        return source.capture(i)
    out: dict[str, torch.Tensor] = {}
    for name, p in source.layer_map.parameters(i):
        out[tensor_key("param", name)] = p.detach()
        for field_, value in source.optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[tensor_key("optim", name, field_)] = value.detach()
            elif isinstance(value, (int, float)):
                out[tensor_key("optim", name, field_)] = torch.tensor(float(value),
                                                                      dtype=torch.float64)
    return {**out, **source._capture_buffers(i)}


class Tiers:
    """A LayerCheck's memory tier and buddy link (see the module doc)."""

    def __init__(self, config: TierConfig, lc: LayerCheck) -> None:
        self.config = config
        self.folder = config.folder_for(lc.store.url)
        self.rank = lc.ranks.rank
        self.node = config.node_name()
        self.memory = MemoryTier(self.folder, self.rank, config.budget_bytes)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.link = (BuddyLink(self.folder, self.node, config.rack_name(), config.timeout_s)
                     if config.buddy and distributed else None)
        self.job = job_of(read_manifest(lc.store, self.rank))
        self.layout = tier_layout(lc.ranks.world_size, lc.source.header_facts(), lc.layout.id)
        """The layout this job's copies are written in (``shards.tier_layout``)."""
        self.last: TierRestore | None = None
        self.stall_s = 0.0
        """The training thread's seconds in the memory tier at the last step."""

    # -- every step -------------------------------------------------------------------
    def step(self, lc: LayerCheck, t: int, extra: Mapping[str, Any] | None) -> None:
        start = time.perf_counter()
        items = {f"L{i}": live_tensors(lc.source, i) for i in range(len(lc.layer_map))}
        copies = hostcopy.fence()  # a backend's device shards: copied before they are read
        if copies is not None:
            copies.wait()
        tensors, document = capture_state(t, lc.source.optimizer, lc.scheduler, extra,
                                          lc.source.engine_state(), lc.source.group_members())
        items["state"] = tensors
        if not self.memory.checked:
            self._check_budget(lc, slot_bytes(items))
        self.memory.write(t, items, {**document, "job": self.job, "node": self.node,
                                     "layout": self.layout, "timeline": lc.timeline},
                          self.link.exchange if self.link is not None else None)
        self.stall_s = time.perf_counter() - start

    def _check_budget(self, lc: LayerCheck, own: int) -> None:
        sizes = self.link.gather(own) if self.link is not None else [own]
        ward = sizes[self.link.ward] if self.link is not None else 0
        together(lc.ranks, lambda: self.memory.check_budget(own, ward))
        self.memory.checked = True

    def flush(self) -> None:
        self.memory.wait()

    def close(self) -> None:
        try:
            self.memory.close()
        finally:
            if self.link is not None:
                self.link.close()

    # -- restore ------------------------------------------------------------------------
    def restore(self, lc: LayerCheck, durable: Callable[[], int]) -> int:
        """The newest step, restored from the tiers (``durable()`` where memory holds
        none every rank can get, or storage holds a newer one). See the module doc."""
        start = time.perf_counter()
        self.memory.wait()
        view = read_manifest(lc.store, self.rank)
        self.job = job_of(view)
        inventory, foreign = self._inventory(len(lc.layer_map), view.lineage)
        gathered = lc.ranks.gather((inventory, _durable_state(lc, view), foreign))
        copies = [c for inventory, _, _ in gathered for c in inventory]
        stored = [step for _, step, _ in gathered]
        choice = choose(copies, lc.ranks.world_size, len(lc.layer_map),
                        None if None in stored else min(stored),
                        [[v.step for v in view.versions.get(name, [])]
                         for name in lc.layer_map.names], aligned=sharded(self.layout))
        others = sorted({layout for _, _, found in gathered for layout in found})
        if choice is None or choice.from_storage():
            if others:
                step = resume(self, lc, view, start)  # another world size: resharded
                if step is not None:
                    return step
                log.warning("layercheck: the memory tier holds copies written by %s, not this "
                            "job's %s, that cannot be resharded here: restoring from storage",
                            " and ".join(others), _describe(self.layout))
            return self._durable(lc, durable, view.lineage)
        lc.writer.flush()
        lc.drift.take()
        received = self._move(choice)
        layers, tensors, doc, read = together(
            lc.ranks, lambda: self._load(lc, choice, received, view))
        if sharded(self.layout) and len({tuple(r) for r in lc.ranks.gather(read)}) > 1:
            log.warning("layercheck: the ranks' intact durable shards of a layer differ "
                        "(a damaged file): restoring from storage, which agrees on them")
            return self._durable(lc, durable, view.lineage)
        return self.finish(lc, view, choice.step, lambda i: lc.source.apply(i, layers[i]),
                           tensors, doc, choice.sources(self.rank), layers, start)

    def finish(self, lc: LayerCheck, view: ManifestView, step: int,
               apply: Callable[[int], None], tensors: dict[str, torch.Tensor],
               doc: dict[str, Any], sources: list[tuple[str, int | None]],
               layers: list[Mapping[str, torch.Tensor]], start: float,
               sizes: list[int] | None = None) -> int:
        """Copy in what a restore of ``step`` read and checked (``apply(i)`` per layer of
        ``layers``, this rank's tensors of each; the training state), open the timeline
        at ``step`` and record where each layer (``sources``: per layer, tier and step;
        None: storage's) came from. ``sizes``: this rank's bytes of each layer, where
        ``layers`` does not hold them all (a resharding source that keeps nothing of its
        read). Every rank calls it (a collective)."""
        loading = time.perf_counter()
        lc._restore_called = False  # as the durable restore: step() refuses until done
        for i in range(len(lc.layer_map)):
            apply(i)
        apply_state(tensors, doc, lc.source.optimizer, lc.scheduler)
        lc.source.after_restore(doc.get("engine"), step)
        lc.extra = doc.get("extra")
        standing = _standing(view, step)
        lc._begin_timeline(step, view, base_taken=bool(view.states), applied=True,
                           standing={n: v for n, v in standing.items()})
        for name, version in standing.items():  # the durable tier's own age of each layer
            lc.state.last_written[lc.layer_map.index[name]] = version.step
        if sizes is None:
            sizes = [trained_nbytes(loaded, lc.source.frozen(i)) for i, loaded in enumerate(layers)]
            nbytes = sum(int(t.numel() * t.element_size()) for layer in layers for t in layer.values())
        else:
            nbytes = sum(sizes)
        if lc.config.write_budget is not None:  # the budget counts from here, in these sizes
            lc._set_sizes(np.array(sizes, dtype=np.float64))
        self.drop_after(step, view.lineage)  # with the timeline it opened
        done = time.perf_counter()
        self.last = TierRestore(step, {
            name: (tier, at if at is not None else standing[name].step)
            for name, (tier, at) in zip(lc.layer_map.names, sources)})
        lc.restored = RestoreReport(step, None, loading - start, 0.0, done - loading, nbytes)
        log.info("layercheck: restored step %d from the tiers (%s)", step,
                 ", ".join(f"{n} layers from {t}" for t, n in self.last.tiers().items()))
        return step

    def _durable(self, lc: LayerCheck, durable: Callable[[], int], lineage: Lineage) -> int:
        step = durable()
        self.drop_after(step, lineage)  # the lineage before it: what it refuses stays refused
        self.last = TierRestore(step, {name: (STORAGE, v.step) for name, v in (
            lc.restored.plan.sources.items() if lc.restored and lc.restored.plan else [])})
        return step

    def _inventory(self, num_layers: int, lineage: Lineage) -> tuple[list[Copy], list[str]]:
        """Every committed slot on this rank of this job (its own and its wards'), each
        item verified, of this job's layout and on the directory's ``lineage``
        (``storage.lineage``: one of an abandoned timeline is never used); and the
        layouts of those of others (``shards.usable``), described."""
        found, foreign, abandoned = [], set(), []
        root = Path(self.folder)
        folders = [("rank", self.rank, root / f"rank{self.rank}")] + sorted(
            ("ward", int(p.name[4:]), p) for p in root.glob("ward*") if p.name[4:].isdigit())
        for kind, of, where in folders:
            for k in (0, 1):
                slot = Slot(where, k)
                marker = slot.marker()
                if marker is None or marker.get("document", {}).get("job") != self.job:
                    continue
                refused = off_lineage(lineage, marker)
                if refused is not None:
                    abandoned.append(f"{where.name}'s step {marker['step']} ({refused})")
                    continue
                written = marker["document"].get("layout")
                if not usable(written, self.layout):
                    foreign.add(_describe(written))
                    continue
                ok = {name: _intact(slot, name, item) for name, item in marker["items"].items()}
                found.append(Copy(of, self.rank, kind, k, int(marker["step"]),
                                  ok.get("state", False),
                                  tuple(ok.get(f"L{i}", False) for i in range(num_layers)),
                                  marker))
        if abandoned:
            log.warning("layercheck: rank %d: memory-tier copies not used, %s", self.rank,
                        "; ".join(abandoned))
        return found, sorted(foreign)

    def _move(self, choice: Choice) -> dict[tuple[int, str], torch.Tensor]:
        """The buddies' copies, sent to the ranks that take them; what this rank got."""
        moves = []
        for r in sorted(choice.layers):
            wanted = [("state", choice.state[r])] + [
                (f"L{i}", c) for i, c in enumerate(choice.layers[r])]
            wanted = [(name, c) for name, c in wanted if c is not None]
            for name, c in wanted:
                if c.holder != r:
                    moves.append((c.holder, r, c.kind, c.k, name, c.marker["items"][name]))
        if not moves:
            return {}
        if self.link is None:
            raise CheckpointNotFound("a buddy's copy was chosen without a buddy link")

        def read(kind: str, of: int, k: int, name: str, item: dict[str, Any]) -> torch.Tensor:
            slot = Slot(Path(self.folder) / (f"ward{of}" if kind == "ward" else f"rank{of}"), k)
            try:
                data = np.fromfile(slot.path / name, dtype=np.uint8)
            except OSError:
                data = np.zeros(0, dtype=np.uint8)
            out = np.zeros(item["nbytes"], dtype=np.uint8)  # damaged: the receiver refuses it
            out[:min(len(data), len(out))] = data[:len(out)]
            return torch.from_numpy(out)
        got = self.link.move(moves, read)
        return {(moves[n][4], moves[n][1]): data for (n, _), data in got.items()}

    def _load(self, lc: LayerCheck, choice: Choice, received: dict, view: ManifestView
              ) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor], dict[str, Any],
                         list[int]]:
        """Every layer and the training state of this rank, verified and checked
        against the live objects; nothing live changed. Last, the step of each layer
        read from storage (ranks of a sharded job compare them)."""
        r = self.rank

        def item(name: str, c: Copy) -> dict[str, torch.Tensor]:
            entry = c.marker["items"][name]
            if c.holder == r:
                where = Path(self.folder) / (f"ward{c.of}" if c.kind == "ward" else f"rank{r}")
                data = Slot(where, c.k).read(name, entry)
            else:
                data = verified_bytes(received[(name, r)], entry["checksum"],
                                      f"rank {c.holder}'s copy of rank {r}'s {name}")
            return tensors_from(data, entry["tensors"])

        state = choice.state[r]
        if state is not None:
            tensors = item("state", state)
            doc = read_state_document(state.marker["document"])
        else:
            tensors, doc = read_state(lc.store, view.states[choice.step])
        check_state(doc, lc.source.optimizer, lc.source.group_members(), lc.scheduler)
        layers, read = [], []
        for i, c in enumerate(choice.layers[r]):
            name = lc.layer_map.names[i]
            if c is not None:
                loaded = item(f"L{i}", c)
            else:
                loaded, step = durable_version(lc.store, view, name, choice.step)
                read.append(step)
            lc.source.check(i, loaded)
            layers.append(loaded)
        return layers, tensors, doc, read

    def drop_after(self, step: int, lineage: Lineage | None = None) -> None:
        """Take away every slot of a step after ``step`` in this node's folder (its
        ranks' own and their wards', and those of ranks this job no longer has): a
        restore of ``step`` abandoned the timeline they belong to; and every slot of
        this job that ``lineage`` refuses (a timeline abandoned while this node sat
        out: refused for good). Every rank of the node calls it after the same
        restore, when no tier writes."""
        self.memory.drop_after(step)
        root = Path(self.folder)
        for p in root.glob("*") if root.is_dir() else []:
            kind = "rank" if p.name.startswith("rank") else "ward"
            if not p.name[len(kind):].isdigit():
                continue
            for k in (0, 1):
                slot = Slot(p, k)
                marker = slot.marker()
                if marker is None:
                    continue
                if marker["step"] > step or lineage is not None and marker.get(
                        "document", {}).get("job") == self.job and \
                        off_lineage(lineage, marker) is not None:
                    slot.invalidate()


def _intact(slot: Slot, name: str, item: dict[str, Any]) -> bool:
    try:
        slot.read(name, item)
    except CorruptVersion:
        return False
    return True


def _durable_state(lc: LayerCheck, view: ManifestView) -> int | None:
    """The step of this rank's newest durable training state that verifies."""
    for step in sorted(view.states, reverse=True):
        try:
            read_verified_file(lc.store, view.states[step])
        except CorruptVersion:
            continue
        return step
    return None


def _standing(view: ManifestView, step: int) -> dict[str, Any]:
    """Per layer, its newest committed durable version at or before ``step``."""
    out = {}
    for name in view.layer_names:
        older = [v for v in view.versions.get(name, []) if v.step <= step]
        if older:
            out[name] = max(older, key=lambda v: v.step)
    return out


def _describe(layout: Mapping[str, Any] | None) -> str:
    layout = layout or {}
    world = int(layout.get("world_size", 1))
    ranks = "1 process" if world == 1 else f"{world} ranks"
    backend = layout.get("backend") or "plain module"
    return f"{ranks} ({backend}{', stage 3' if layout.get('zero3') else ''})"


def durable_layer(store: Store, view: ManifestView, name: str, step: int
                  ) -> dict[str, torch.Tensor]:
    """Layer ``name``'s newest intact durable version at or before ``step``."""
    return durable_version(store, view, name, step)[0]


def durable_version(store: Store, view: ManifestView, name: str, step: int
                    ) -> tuple[dict[str, torch.Tensor], int]:
    """``durable_layer``, and the step of the version it is."""
    planner = Planner(store, view)
    for version in sorted((v for v in view.versions.get(name, []) if v.step <= step),
                          key=lambda v: v.step, reverse=True):
        try:
            return tensor_views(planner._completed(version, read_verified_file(store, version))
                                ), version.step
        except CorruptVersion as exc:
            log.warning("layercheck: layer %s: skipping its durable version of step %d: %s",
                        name, version.step, exc)
    raise CheckpointNotFound(f"layer {name}: no intact copy at or before step {step} in memory, "
                             "at the buddy, or in storage")
