"""Composite recovery: one planner for restore, export, gc, plan and the Trainer.

The plan for step T: the newest committed training state at or before T that
is intact (the resume point t), and for every layer the newest committed
version at or before t that is intact (size, checksum and safetensors layout
as committed). A damaged version is passed over, with a warning, down to the
base checkpoint; a layer with no intact version makes t unrecoverable
(CheckpointNotFound).

A version sharded over ranks (DeepSpeed ZeRO) is intact when every rank's
shard is. Live (``LayerCheck.restore``), each rank verifies its own shard and
the ranks agree (``Ranks.agree_min``): all take the oldest version proposed,
and a rank that proposed a newer one looks again at or below it. Offline
(``make_plan``), one process verifies every shard. Both choose the same. An
error on one rank (an I/O error, a model that does not fit) is raised on
every rank, so none is left waiting in a collective.

A live restore plans everything (every version verified, and checked
against the live model by ``use``) before it changes anything, then applies
the chosen versions (``load``, under ``together``): a restore that fails
leaves the model as it was. Each file is read once, into a buffer, verified
on that buffer (checksum as the bytes arrive, size, layout, identity), and
its tensors are views of it (``tensor_views``): what ``use`` checks is what
``load`` gives to apply. With ``apart``, the tensors a source keeps as they
are (a fresh optimizer's moments: ``LayerSource.kept_apart``) are read into
a buffer of their own, the rest of the file into another (``Loaded.own``
names them): the source keeps them without a copy and without the file's
other bytes, and nothing live changes before every file is verified. Up to
``keep_bytes`` of chosen files stay in memory from the plan to the apply; a
layer beyond that is read and verified again by ``load``, which tries again
after an I/O error (``REREAD_DELAYS``: a transient fault passes) and is the
only thing at the apply that can still fail: ``LayerCheck`` applies those
layers first (``kept`` says which they are). With ``threads`` > 1
the files are read ahead by a small pool, in the plan's order of consumption:
the choices, warnings and passed-over versions are those of a serial read.
Offline planners (``make_plan``, ``export``) keep nothing and read serially:
about a layer at a time in memory.
"""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np
import torch

from .backends.elastic import ElasticRead
from .contract.errors import CheckpointNotFound, CorruptVersion, LayerCheckError, ReadFailed
from .storage.format import Layout, Version, read_state_document, tensor_key
from .storage.layerread import VerifiedFile, read_verified_file
from .storage.manifest import ManifestView
from .storage.pretrained import Ref
from .backends.ranks import FAILED as _FAILED, Ranks, raise_together as _raise_together, together
from .storage.store import Store
from .storage.views import Loaded, parse_safetensors, referenced, tensor_views

__all__ = ["Loaded", "Plan", "Planner", "make_plan", "parse_safetensors", "read_state",
           "tensor_views", "together", "REREAD_DELAYS"]

UseLayer = Callable[[Version, "dict[str, torch.Tensor]"], None]
"""Called with (chosen version, its tensors) as each layer is chosen; it may refuse
the plan (ModelMismatch) or pass the version over (CorruptVersion)."""
T = TypeVar("T")
REREAD_DELAYS = (0.1, 0.5, 2.0)
"""Seconds ``Planner.load`` waits before each further read of a file it reads again
(a layer beyond ``keep_bytes``) after an I/O error (ReadFailed): the file verified
minutes ago, so a transient fault (EIO, a timeout) is the likely cause; one that
outlasts all of them (2.6 s) is raised."""


@dataclass
class Plan:
    """Where each piece of the composite state of ``step`` comes from."""

    step: int
    state: Version
    sources: dict[str, Version]
    warnings: list[str] = field(default_factory=list)
    passed_over: list[Version] = field(default_factory=list)
    """Versions found damaged and passed over; ``warnings[i]`` says why of the i-th."""
    bases: dict[str, Version] = field(default_factory=dict)
    """Per layer whose source is a partial version, the full version holding its
    frozen parameters (read with it; ``format``: frozen tensors)."""

    def staleness(self) -> dict[str, int]:
        return {name: self.step - v.step for name, v in self.sources.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step,
                "layers": [{"layer": n, "source_step": v.step, "staleness": self.step - v.step,
                            "file": v.file, "bytes": v.bytes, "reason": v.reason,
                            **({"layout": v.layout} if v.layout else {}),  # format: layouts
                            # where a layer has frozen parameters: the version holding them
                            **({"frozen_from_step": v.base if v.base is not None else v.step,
                                "frozen_tensors": len(v.frozen)} if v.frozen else {})}
                           for n, v in self.sources.items()],
                "bytes": sum(v.bytes for v in [*self.sources.values(), *self.bases.values()]),
                "warnings": list(self.warnings)}


def read_state(store: Store, version: Version, data: VerifiedFile | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, state document) of a committed training state (``data``: the file,
    already verified; else read and verified now). The tensors are views of it."""
    file = data if data is not None else read_verified_file(store, version)
    return tensor_views(file), read_state_document(file.metadata)


class Planner:
    """Chooses the composite of a step (see the module doc).

    ``ranks``: the live ranks that must agree (default: one process);
    ``every_shard``: verify every rank's shard, not only the view's own;
    ``keep_bytes``: how many bytes of chosen layer files (checked by ``use``)
    may stay in memory from ``layers`` to ``load`` (0: none, each is read again);
    ``threads``: files read at once (1: serially); ``apart``: which tensors of a
    layer file to read into memory of their own (``read_verified_file``; given
    to ``load``'s caller as ``Loaded.own``); ``running``: the layout the live job
    writes in (``format``: layouts; None offline), a layer version of another one
    being read as an ``ElasticRead`` (``use`` and ``load`` give that instead of its
    tensors) whose files ``elastic_ranks(version, layout)`` names are verified in the
    plan (default: every rank's). Memory held while choosing: at most
    ``keep_bytes`` plus ``2 * threads`` files read ahead.
    Call ``state`` first, then ``layers`` with its step (or ``plan`` for both).
    ``warnings`` collects every fallback; ``load_s`` the seconds ``load`` spent
    reading files again."""

    def __init__(self, store: Store, view: ManifestView, *, ranks: Ranks | None = None,
                 every_shard: bool = False, keep_bytes: int = 0, threads: int = 1,
                 apart: Callable[[str], bool] | None = None, running: int | None = None,
                 elastic_ranks: Callable[[Version, Layout], list[int]] | None = None) -> None:
        if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0:
            raise ValueError(f"keep_bytes={keep_bytes!r}: give the bytes of layer files a "
                             "restore may keep in memory, an integer >= 0 (0: read again)")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads={threads!r}: give the number of files to read at once, "
                             "an integer >= 1")
        self.store, self.view = store, view
        self.ranks = ranks or Ranks()
        self.every_shard = every_shard
        self.keep_bytes, self.threads, self.apart = keep_bytes, threads, apart
        self.running = running
        self.elastic_ranks = elastic_ranks or (lambda _, layout: list(range(layout.world_size)))
        self.warnings: list[str] = []
        self.passed_over: list[Version] = []
        self._newest_damage: dict[str, str] = {}
        """Per layer (or the training state), why its newest version tried here was
        passed over: what ``CheckpointNotFound`` says where none is intact."""
        self.load_s = 0.0
        self._kept: dict[str, VerifiedFile | ElasticRead] = {}
        """This rank's verified file of each chosen layer version held for ``load``."""

    def plan(self, step: int | None = None, *, exact: bool = False,
             use: UseLayer | None = None) -> Plan:
        state, _ = self.state(step, exact=exact)
        sources = self.layers(state.step, use)
        return Plan(state.step, state, sources, self.warnings, self.passed_over,
                    self.bases(sources))

    def bases(self, sources: dict[str, Version]) -> dict[str, Version]:
        """Per layer whose chosen version is partial, its full version (``Plan.bases``)."""
        return {name: base for name, version in sources.items()
                if (base := self.view.base_of(version)) is not None}

    def state(self, step: int | None = None, *,
              exact: bool = False) -> tuple[Version, VerifiedFile]:
        """The newest intact training state at or before ``step`` (default: the
        newest), or of exactly ``step`` (``exact``), and its verified file."""
        view, url = self.view, self.store.url
        view.require_header(url)
        if not view.states:
            raise CheckpointNotFound(f"{url}: no recoverable step yet (training stopped before "
                                     "the base checkpoint)")
        exact = exact and step is not None
        if exact and step not in view.states:
            raise CheckpointNotFound(f"step {step} is not a recoverable step of {url} "
                                     f"({_steps(view)}); pass one of them, or leave out --step "
                                     "for the newest")
        bound = view.latest_step() if step is None else step
        if min(view.states) > bound:
            raise CheckpointNotFound(f"no recoverable step at or before {bound}; the oldest is "
                                     f"{min(view.states)}")
        candidates = [v for s, v in view.states.items() if s <= bound and (s == step or not exact)]
        ((state, data),) = self._agreed([("training state", candidates)], bound, keep=True)
        return state, data  # type: ignore[return-value]

    def layers(self, step: int, use: UseLayer | None = None) -> dict[str, Version]:
        """Per layer (header order), its newest intact version at or before ``step``;
        ``use`` gets each chosen version's tensors (again, should the ranks then
        agree on an older one). With ``use``, up to ``keep_bytes`` of the chosen
        files stay for ``load``."""
        names = self.view.layer_names
        items = [(f"layer {name}", [v for v in self.view.versions.get(name, []) if v.step <= step])
                 for name in names]
        picks = self._agreed(items, step, use, keep=False)
        self._kept = {version.file: file for version, file in picks
                      if version is not None and file is not None}
        return {name: version for name, (version, _) in zip(names, picks)}  # type: ignore[misc]

    def _agreed(self, items: list[tuple[str, list[Version]]], step: int,
                use: UseLayer | None = None, *,
                keep: bool) -> list[tuple[Version | None, VerifiedFile | None]]:
        """For each (what, its versions <= step): the newest version that every rank
        has intact, and this rank's verified file of it where kept (``keep``: always;
        else with ``use``, within ``keep_bytes``; others are dropped once checked)."""
        bound = np.full(len(items), step, dtype=np.int64)
        chosen = np.full(len(items), -2, dtype=np.int64)
        picks: list[tuple[Version | None, VerifiedFile | None]] = [(None, None)] * len(items)
        held = 0
        while True:
            failure = None
            try:
                todo = [i for i in range(len(items)) if chosen[i] != bound[i]]
                work = [(items[i][0], [v for v in items[i][1] if v.step <= bound[i]]) for i in todo]
                for i, (version, file) in zip(todo, self._choose(work, use)):
                    if picks[i][1] is not None and not keep:
                        held -= picks[i][1].nbytes  # type: ignore[union-attr]
                    if not keep and (use is None or file is None
                                     or held + file.nbytes > self.keep_bytes):
                        file = None
                    elif file is not None and not keep:
                        held += file.nbytes
                    picks[i] = (version, file)
                    chosen[i] = version.step if version is not None else -1
            except Exception as exc:  # noqa: BLE001 - raised below, on every rank
                failure, chosen[:] = exc, _FAILED
            agreed, same = self.ranks.agree_min(chosen)
            _raise_together(failure, agreed)
            if (agreed < 0).any():
                raise CheckpointNotFound(self._none_intact(*items[int(np.argmin(agreed))], step))
            if same:
                return picks
            bound = agreed

    def _choose(self, work: list[tuple[str, list[Version]]], use: UseLayer | None
                ) -> list[tuple[Version | None, VerifiedFile | None]]:
        """``_newest_intact`` of each (what, versions), in order; with ``threads`` > 1
        the newest version of the next few is read meanwhile (reads and the checksum
        release the GIL, ``format.Checksummer``; from the page cache, where reading
        is copying, more threads than cores only compete), but consumed in order, as
        a serial read would."""
        if self.threads == 1 or len(work) < 2:
            return [self._newest_intact(versions, what, use) for what, versions in work]
        ahead, window, started = {}, 2 * self.threads, 0
        out = []
        with ThreadPoolExecutor(min(self.threads, len(work)),
                                thread_name_prefix="layercheck-read") as pool:
            try:
                for i, (what, versions) in enumerate(work):
                    while started < min(len(work), i + window):
                        newest = _newest_first(work[started][1])
                        if newest:
                            ahead[started] = pool.submit(self._read, newest[0])
                        started += 1
                    out.append(self._newest_intact(versions, what, use, ahead.pop(i, None)))
            finally:
                for future in ahead.values():  # a failure: what was read ahead is not needed
                    future.cancel()
        return out

    def together(self, work: Callable[[], T],
                 elsewhere: Callable[[], BaseException] | None = None) -> T:
        """``work()`` on every rank; if it raises on any rank, it raises on all: its own
        error where it failed, ``elsewhere()`` (default: a LayerCheckError saying so)
        on the ranks where it did not."""
        return together(self.ranks, work, elsewhere)

    def load(self, version: Version) -> Loaded | ElasticRead:
        """The tensors of a planned version (this rank's file): views of the file kept
        from ``layers`` (then released), else of the file read and verified again.
        A source copies what it keeps (``LayerSource.apply``). A version of another
        layout gives its ``ElasticRead``: the files the plan verified where kept, else
        each read and verified again (retried likewise) as the source first asks."""
        file = self._kept.pop(version.file, None)
        if file is None and self.elastic(version):
            file = self._elastic_read(version, lambda shard: self._read_again(shard, None))
        if file is None:
            start = time.perf_counter()
            try:
                file = self._read_again(version)
            finally:
                self.load_s += time.perf_counter() - start
        return file if isinstance(file, ElasticRead) else tensor_views(file)

    def elastic(self, version: Version) -> bool:
        """Whether a live restore reads layer ``version`` resharded (another layout)."""
        return self.running is not None and version.layer is not None and \
            version.layout != self.running

    def reader(self, version: Version) -> ElasticRead:
        """An ``ElasticRead`` of any planned ``version``, each rank's file read and verified
        (completed by its frozen parameters) when first touched: what an offline export of
        a composite that mixes layouts reads through, one layer at a time."""
        return self._elastic_read(version, lambda shard: self._read_again(shard, None))

    def _elastic_read(self, version: Version,
                      read: Callable[[Version], VerifiedFile]) -> ElasticRead:
        """The ``ElasticRead`` of ``version``, each rank's file read by ``read``."""
        shards = version.per_rank()
        return ElasticRead(version, self.view.layout_of(version),
                           lambda rank: self._completed(shards[rank], read(shards[rank])))

    def kept(self, version: Version) -> bool:
        """Whether ``load`` gives ``version`` from memory (else it reads it again)."""
        return version.file in self._kept

    def _read_again(self, version: Version, apart: Any = True) -> VerifiedFile:
        """``version``'s file read and verified again, tried again after each of
        ``REREAD_DELAYS`` where it fails with an I/O error (damage is not retried);
        ``apart`` as ``read_verified_file``'s (True: the planner's)."""
        apart = self.apart if apart is True else apart
        for delay in REREAD_DELAYS:
            try:
                return self._completed(version, read_verified_file(self.store, version, apart))
            except ReadFailed:
                time.sleep(delay)
        return self._completed(version, read_verified_file(self.store, version, apart))

    def _newest_intact(self, versions: list[Version], what: str, use: UseLayer | None,
                       newest: "Future[VerifiedFile | ElasticRead] | None" = None
                       ) -> tuple[Version | None, VerifiedFile | ElasticRead | None]:
        """The newest version of ``versions`` whose file is intact (and that ``use``
        accepts), with that file; ``newest``: its newest version's file, being read."""
        for n, version in enumerate(_newest_first(versions)):
            try:
                file = newest.result() if n == 0 and newest is not None else self._read(version)
            except CorruptVersion as exc:
                self.warnings.append(f"{what}: skipping the version of step {version.step}: {exc}")
                self._newest_damage.setdefault(what, f"step {version.step}'s: {exc}")
                self.passed_over.append(version)
                continue
            if use is not None:
                use(version, file if isinstance(file, ElasticRead) else tensor_views(file))
            return version, file
        return None, None

    def _read(self, version: Version) -> VerifiedFile | ElasticRead:
        """The view's own file of ``version``, verified (with every other rank's
        shard, under ``every_shard``); for a version of another layout, its
        ``ElasticRead`` with the files ``elastic_ranks`` names verified."""
        if self.elastic(version):
            read = self._elastic_read(
                version, lambda shard: read_verified_file(self.store, shard))
            for rank in self.elastic_ranks(version, read.layout):
                read.verified(rank)
            return read
        for shard in version.per_rank() if self.every_shard else ():
            if shard.file != version.file:
                read_verified_file(self.store, shard)
        apart = self.apart if version.layer is not None else None  # a training state: whole
        return self._completed(version, read_verified_file(self.store, version, apart))

    def _completed(self, version: Version, file: VerifiedFile) -> VerifiedFile:
        """``file``, and for a partial version its full version's file too (verified
        likewise; ``format``: frozen tensors), and the frozen parameters the full
        version holds by reference (read from the pretrained file, verified:
        ``layercheck.storage.pretrained``), so that its views are the whole layer."""
        if not version.frozen:
            return file
        full = version if version.base is None else self.view.base_of(version)
        if full is None:
            raise CorruptVersion(f"{version.file}: its frozen parameters are in the layer's "
                                 f"version of step {version.base}, which is not committed "
                                 "(retired, or its write failed)")
        refs = {name: Ref(*where) for name, *where in full.refs}
        held = tuple(tensor_key("param", name) for name in version.frozen if name not in refs)
        if version.base is not None and held:
            own = full if version.rank is None else full.per_rank()[version.rank]
            file = file.with_frozen(read_verified_file(self.store, own), held, version.file)
        wanted = [name for name in version.frozen if name in refs]
        if not wanted:
            return file
        return dataclasses.replace(file, referenced={
            tensor_key("param", name): referenced(refs[name]) for name in wanted})

    def _none_intact(self, what: str, versions: list[Version], step: int) -> str:
        if not versions:
            return f"{what} has no committed version at or before step {step}"
        where = " on every rank" if self.view.world_size > 1 else ""
        why = self._newest_damage.get(what)  # on another rank, perhaps: then not known here
        why = f"; the newest here, {why}" if why is not None else ""
        return (f"{what}: no committed version intact{where} ({len(versions)} tried, all "
                f"damaged{why})")


def make_plan(store: Store, view: ManifestView, step: int | None = None, *,
              exact: bool = False) -> Plan:
    """The composite plan of ``step`` (default: the newest recoverable step; with
    ``exact``, exactly ``step``), every rank's shard verified. Offline: nothing
    is loaded, nothing agreed with anyone."""
    return Planner(store, view, every_shard=True).plan(step, exact=exact)


def _newest_first(versions: list[Version]) -> list[Version]:
    return sorted(versions, key=lambda v: v.step, reverse=True)


def _steps(view: ManifestView) -> str:
    steps = sorted(view.states)
    return (f"recoverable steps: {', '.join(map(str, steps))}" if len(steps) <= 6 else
            f"{len(steps)} recoverable steps from {steps[0]} to {steps[-1]}")
