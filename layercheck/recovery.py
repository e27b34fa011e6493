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
against the live model by ``use``) before it changes anything, then loads
the chosen versions again to apply them (``load``, under ``together``): a
restore that fails leaves the model as it was.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np
import torch
from safetensors.torch import load as st_load

from .errors import CheckpointNotFound, CorruptVersion, LayerCheckError
from .format import Version, read_state_document
from .manifest import ManifestView, check_structure, read_verified
from .ranks import Ranks
from .store import Store

__all__ = ["Plan", "Planner", "make_plan", "parse_safetensors", "read_state"]

UseLayer = Callable[[Version, "dict[str, torch.Tensor]"], None]
"""Called with (chosen version, its tensors) as each layer is chosen; it may refuse
the plan (ModelMismatch) or pass the version over (CorruptVersion)."""
T = TypeVar("T")
_FAILED = -3
"""What a rank proposes in an agreement when it failed: every rank then raises."""


@dataclass
class Plan:
    """Where each piece of the composite state of ``step`` comes from."""

    step: int
    state: Version
    sources: dict[str, Version]
    warnings: list[str] = field(default_factory=list)
    passed_over: list[Version] = field(default_factory=list)
    """Versions found damaged and passed over; ``warnings[i]`` says why of the i-th."""

    def staleness(self) -> dict[str, int]:
        return {name: self.step - v.step for name, v in self.sources.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step,
                "layers": [{"layer": n, "source_step": v.step, "staleness": self.step - v.step,
                            "file": v.file, "bytes": v.bytes, "reason": v.reason}
                           for n, v in self.sources.items()],
                "bytes": sum(v.bytes for v in self.sources.values()),
                "warnings": list(self.warnings)}


def parse_safetensors(data: bytes, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors blob (no pickle); CorruptVersion if malformed."""
    metadata = check_structure(data, what)
    try:
        return st_load(data), metadata
    except Exception as exc:  # a damaged file can fail in many ways; all mean 'corrupt'
        raise CorruptVersion(f"{what}: not a valid safetensors file ({exc})") from None


def read_state(store: Store, version: Version,
               data: bytes | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, state document) of a committed training state (``data``: its
    bytes, already verified; else read and verified now)."""
    tensors, metadata = parse_safetensors(data if data is not None else
                                          read_verified(store, version), version.file)
    return tensors, read_state_document(metadata)


class Planner:
    """Chooses the composite of a step (see the module doc).

    ``ranks``: the live ranks that must agree (default: one process);
    ``every_shard``: verify every rank's shard, not only the view's own.
    Call ``state`` first, then ``layers`` with its step (or ``plan`` for both).
    ``warnings`` collects every fallback; ``load_s`` the seconds spent reading
    and parsing layer versions."""

    def __init__(self, store: Store, view: ManifestView, *, ranks: Ranks | None = None,
                 every_shard: bool = False) -> None:
        self.store, self.view = store, view
        self.ranks = ranks or Ranks()
        self.every_shard = every_shard
        self.warnings: list[str] = []
        self.passed_over: list[Version] = []
        self.load_s = 0.0

    def plan(self, step: int | None = None, *, exact: bool = False,
             use: UseLayer | None = None) -> Plan:
        state, _ = self.state(step, exact=exact)
        return Plan(state.step, state, self.layers(state.step, use), self.warnings,
                    self.passed_over)

    def state(self, step: int | None = None, *, exact: bool = False) -> tuple[Version, bytes]:
        """The newest intact training state at or before ``step`` (default: the
        newest), or of exactly ``step`` (``exact``), and its verified bytes."""
        view, url = self.view, self.store.url
        if view.header is None:
            raise CheckpointNotFound(f"{url}: not a layercheck checkpoint (no manifest header)")
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
        agree on an older one)."""
        names = self.view.layer_names
        items = [(f"layer {name}", [v for v in self.view.versions.get(name, []) if v.step <= step])
                 for name in names]
        picks = self._agreed(items, step, use)
        return {name: version for name, (version, _) in zip(names, picks)}  # type: ignore[misc]

    def _agreed(self, items: list[tuple[str, list[Version]]], step: int,
                use: UseLayer | None = None, *,
                keep: bool = False) -> list[tuple[Version | None, bytes | None]]:
        """For each (what, its versions <= step): the newest version that every rank
        has intact, and (``keep``) this rank's verified bytes of it; otherwise the
        bytes are dropped as soon as read, so that a layer at a time is in memory."""
        bound = np.full(len(items), step, dtype=np.int64)
        chosen = np.full(len(items), -2, dtype=np.int64)
        picks: list[tuple[Version | None, bytes | None]] = [(None, None)] * len(items)
        while True:
            failure = None
            try:
                for i, (what, versions) in enumerate(items):
                    if chosen[i] != bound[i]:
                        version, data = self._newest_intact(
                            [v for v in versions if v.step <= bound[i]], what, use)
                        picks[i] = (version, data if keep else None)
                        chosen[i] = version.step if version is not None else -1
            except Exception as exc:  # noqa: BLE001 - raised below, on every rank
                failure, chosen[:] = exc, _FAILED
            agreed, same = self.ranks.agree_min(chosen)
            self._raise_together(failure, agreed)
            if (agreed < 0).any():
                raise CheckpointNotFound(self._none_intact(*items[int(np.argmin(agreed))], step))
            if same:
                return picks
            bound = agreed

    def together(self, work: Callable[[], T]) -> T:
        """``work()`` on every rank; if it raises on any rank, it raises on all."""
        failure, result = None, None
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - raised below, on every rank
            failure = exc
        agreed, _ = self.ranks.agree_min(np.array([_FAILED if failure else 0], dtype=np.int64))
        self._raise_together(failure, agreed)
        return result  # type: ignore[return-value]

    def _raise_together(self, failure: BaseException | None, agreed: np.ndarray) -> None:
        if failure is not None:
            raise failure
        if (agreed == _FAILED).any():
            raise LayerCheckError("another rank failed to restore (its error says why); this "
                                  "rank stops with it")

    def load(self, version: Version) -> dict[str, torch.Tensor]:
        """The tensors of a planned version (this rank's file), read and verified again."""
        start = time.perf_counter()
        tensors, _ = parse_safetensors(read_verified(self.store, version), version.file)
        self.load_s += time.perf_counter() - start
        return tensors

    def _newest_intact(self, versions: list[Version], what: str,
                       use: UseLayer | None) -> tuple[Version | None, bytes | None]:
        start = time.perf_counter()
        for version in sorted(versions, key=lambda v: v.step, reverse=True):
            try:
                data = self._read(version)
            except CorruptVersion as exc:
                self.warnings.append(f"{what}: skipping the version of step {version.step}: {exc}")
                self.passed_over.append(version)
                continue
            if use is not None:
                tensors, _ = parse_safetensors(data, version.file)
                self.load_s += time.perf_counter() - start
                use(version, tensors)
            return version, data
        return None, None

    def _read(self, version: Version) -> bytes:
        """The view's own file of ``version``, verified (with every other rank's
        shard, under ``every_shard``)."""
        for shard in version.per_rank() if self.every_shard else ():
            if shard.file != version.file:
                read_verified(self.store, shard)
        return read_verified(self.store, version)

    def _none_intact(self, what: str, versions: list[Version], step: int) -> str:
        if not versions:
            return f"{what} has no committed version at or before step {step}"
        where = " on every rank" if self.view.world_size > 1 else ""
        return f"{what}: no committed version intact{where} ({len(versions)} tried, all damaged)"


def make_plan(store: Store, view: ManifestView, step: int | None = None, *,
              exact: bool = False) -> Plan:
    """The composite plan of ``step`` (default: the newest recoverable step; with
    ``exact``, exactly ``step``), every rank's shard verified. Offline: nothing
    is loaded, nothing agreed with anyone."""
    return Planner(store, view, every_shard=True).plan(step, exact=exact)


def _steps(view: ManifestView) -> str:
    steps = sorted(view.states)
    return (f"recoverable steps: {', '.join(map(str, steps))}" if len(steps) <= 6 else
            f"{len(steps)} recoverable steps from {steps[0]} to {steps[-1]}")
