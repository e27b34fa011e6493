"""The manifest replayed: what is committed and live (reading a committed file: ``layerread``).

A layer version or a step's training state exists only once its record is in
the manifest (``manifest.jsonl``; records in ``layercheck.storage.format``); files
without a record are leftovers. Each line carries a CRC of its own content,
so a torn or garbled line is detected and skipped (with a problem reported),
never half-trusted; so is a record naming a file that is not its own
(``format.version_files``), whatever its CRC says. A ``resume`` record
abandons every later step of the timeline before it (and opens a timeline of
the ``lineage``, which ``compact`` keeps); a ``drop`` record
retires a version. A rank's view of a sharded checkpoint
(``read_manifest(store, rank=r)``) sees each version as its own shard. The
layouts the versions were written in (``format``: layouts) are replayed too:
``layouts`` and ``layout_of``. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from ..contract.errors import CheckpointNotFound, CorruptVersion, LayerCheckError
from .format import (MANIFEST, Layout, Version, decode_line, encode_record, resume_record,
                     version_files)
from .lineage import Lineage
from .store import Store

__all__ = ["ManifestView", "job_layout", "read_manifest", "read_again", "read_consistent", "seal_torn_tail", "compact",
           "encode_manifest"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class ManifestView:
    """The manifest replayed: what is committed and live now."""

    header: dict[str, Any] | None = None
    versions: dict[str, list[Version]] = field(default_factory=dict)
    """Per layer name, its live versions in ascending step order."""
    states: dict[int, Version] = field(default_factory=dict)
    """Per step, its committed training state."""
    problems: list[str] = field(default_factory=list)
    """Lines that were skipped, each with the reason (torn, bad CRC, bad path)."""
    skipped: list[bytes] = field(default_factory=list)
    """Those lines as they are in the manifest."""
    resumes: list[int] = field(default_factory=list)
    lineage: Lineage = field(default_factory=Lineage)
    """The timelines live now (``lineage``: which copies outside the directory are usable)."""
    rank: int | None = None
    """The rank whose shards ``versions`` and ``states`` show (sharded checkpoints)."""
    source: bytes = field(default=b"", repr=False, compare=False)
    """The manifest's bytes this view replays (``read_again`` compares them)."""
    layouts: dict[int, Layout] = field(default_factory=dict)
    """Per id, every layout recorded (``format``: layouts; 0, the header's, once it is read)."""
    _layers: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    """The header's layer names: a layer record of any other is skipped as damaged."""

    def layout_of(self, version: Version) -> Layout:
        """The layout ``version`` was written in (replay refuses a record naming another)."""
        return self.layouts.get(version.layout) or Layout.of_header(self.header)

    @property
    def world_size(self) -> int:
        """Ranks that write shards (1 for an unsharded checkpoint)."""
        return int((self.header or {}).get("world_size", 1))

    @property
    def layer_names(self) -> list[str]:
        return [layer["name"] for layer in (self.header or {}).get("layers", [])]

    def require_header(self, url: str) -> dict[str, Any]:
        """The header; CheckpointNotFound unless there is one, saying why where a
        damaged line may have been it (the first such line)."""
        if self.header is None:
            why = f": {self.problems[0]}" if self.problems else ""
            raise CheckpointNotFound(f"{url}: not a layercheck checkpoint (no {MANIFEST} with a "
                                     f"valid header{why}); point at the directory given to "
                                     "LayerCheck")
        return self.header

    def latest_step(self) -> int | None:
        return max(self.states) if self.states else None

    def base_of(self, version: Version) -> Version | None:
        """The live full version that holds a partial ``version``'s frozen parameters
        (``format``: ``base``); None for a full version, or where it is not live."""
        if version.base is None or version.layer is None:
            return None
        return next((v for v in self.versions.get(version.layer, []) if v.step == version.base
                     and v.base is None), None)

    def all_versions(self) -> Iterable[Version]:
        for versions in self.versions.values():
            yield from versions
        yield from self.states.values()

    def apply(self, record: dict[str, Any]) -> None:
        """Replay one record (checked by ``format.check_record``: ``decode_line``)."""
        kind = record["kind"]
        if kind == "header":
            if self.header is None:
                self.header = record
                self._layers = frozenset(self.layer_names)
                self.layouts[0] = Layout.of_header(record)
        elif kind == "layer":
            version = self._version(record)
            live = self.versions.setdefault(version.layer, [])
            if live and live[-1].step >= version.step:  # records come in step order, but:
                # a second record of one (layer, step) names the same file: it replaces
                # the first, so no version is live twice (retention would drop one,
                # deleting the file the other still needs)
                live[:] = [v for v in live if v.step != version.step]
            live.append(version)
        elif kind == "state":
            version = self._version(record)
            self.states[version.step] = version
        elif kind == "layout":
            if record["id"] in self.layouts:
                raise ValueError(f"layout {record['id']} is recorded twice")
            self.layouts[record["id"]] = Layout.from_record(record)
        elif kind == "resume":
            self._truncate(record["step"])
            self.lineage = self.lineage.opened(record.get("timeline"), record["step"])
        elif kind == "drop":
            self._drop(record["file"])
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def _version(self, record: dict[str, Any]) -> Version:
        """The version of a layer or state record, as this view's rank sees it; ValueError
        unless it names exactly the files its layer and step give
        (``format.version_files``: never the manifest, the lock, a user's file or
        another version's), its layer is one the header lists, and its layout is
        recorded and it has that layout's shards (before any header, the layers and
        layout 0's world size are not known: not checked)."""
        version = Version.from_record(record, self.rank)
        if version.layer is not None and self.header is not None \
                and version.layer not in self._layers:
            raise ValueError(f"a version of layer {version.layer!r}, which the header does "
                             "not list")
        if version.layout in self.layouts:  # its shards first: they decide its file names
            wrong = self.layouts[version.layout].shards_problem(len(version.shards))
            if wrong is not None:
                raise ValueError(wrong)
        elif version.layout or self.header is not None:
            raise ValueError(f"a version of layout {version.layout}, which no layout "
                             "record before it describes")
        own = version_files(version)
        if version.files != own:  # e.g. the manifest, .lock, another version's file
            wrong, right = next((f, o) for f, o in zip(version.files, own) if f != o)
            raise ValueError(f"it names the file {wrong!r}, not its own {right!r}: a record "
                             "may name only the file its layer and step give")
        return version

    def _drop(self, key: str) -> None:
        for name, versions in self.versions.items():
            self.versions[name] = [v for v in versions if v.key != key]
        self.states = {s: v for s, v in self.states.items() if v.key != key}

    def _truncate(self, step: int) -> None:
        self.resumes.append(step)
        for name, versions in self.versions.items():
            self.versions[name] = [v for v in versions if v.step <= step]
        self.states = {s: v for s, v in self.states.items() if s <= step}


def job_layout(view: ManifestView, world_size: int, facts: dict[str, Any]) -> tuple[Layout, bool]:
    """The layout a job of ``world_size`` ranks whose source gives ``facts`` writes in
    (``format``: layouts): the newest recorded one of its world size and backend, else
    a new one (True: not recorded yet), whose id is one above the highest so far."""
    for layout in sorted(view.layouts.values(), key=lambda layout: -layout.id):
        if layout.same_job(world_size, facts):
            return layout, False
    return Layout(id=max(view.layouts, default=0) + 1, world_size=world_size, facts=facts), True


def read_manifest(store: Store, rank: int | None = None) -> ManifestView:
    """Replay the store's manifest (as ``rank`` sees a sharded one). Damaged
    lines are skipped and listed in ``problems``; an absent manifest gives an
    empty view (no header)."""
    return _replay(_manifest_bytes(store), rank)


def read_again(store: Store, view: ManifestView) -> ManifestView:
    """The store's manifest as it is now, as ``view``'s rank sees it: ``view`` itself
    where not a byte changed since it was read (a replay costs tens of microseconds
    a line; a check for damage that reads the manifest again is then free)."""
    data = _manifest_bytes(store)
    return view if data == view.source else _replay(data, view.rank)


def _manifest_bytes(store: Store) -> bytes:
    return store.read(MANIFEST) if store.exists(MANIFEST) else b""


def _replay(data: bytes, rank: int | None) -> ManifestView:
    view = ManifestView(rank=rank, source=data)
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)  # a final line without newline: torn append
        try:
            if last:
                raise ValueError("torn append: the last line has no newline")
            view.apply(decode_line(line))
        except Exception as exc:  # any damage to one line: skip it, say why
            view.problems.append(f"{MANIFEST} line {number}: skipped ({exc})")
            view.skipped.append(line)
    return view


def encode_manifest(header: dict[str, Any], versions: Iterable[Version],
                    layouts: Iterable[Layout] = (), lineage: Lineage = Lineage()) -> bytes:
    """A whole manifest: the header, the ``layouts`` besides the header's (by id), the
    ``lineage``'s branches (resume records: before every version, they abandon none),
    then ``versions`` by step, each step's state last."""
    ordered = sorted(versions, key=lambda v: (v.step, v.layer is None, v.layer or ""))
    added = sorted((layout for layout in layouts if layout.id), key=lambda layout: layout.id)
    return encode_record(header) + b"".join(encode_record(layout.to_record()) for layout in added) \
        + b"".join(encode_record(resume_record(b.start, b.timeline)) for b in lineage.branches) \
        + b"".join(encode_record(v.to_record()) for v in ordered)


def compact(store: Store) -> int:
    """Rewrite the manifest with only what replaying it keeps: the header, the live
    versions and, as they are, the lines it skips (so ``inspect`` still reports
    them). Replaying the result gives the same header, layouts, lineage, versions and
    states; records of retired versions, drop records and the resume records of
    abandoned timelines are gone. Atomic
    (``write_atomic``): a crash leaves the old manifest or the new one, never a
    mix. Call only where nothing else appends meanwhile (the directory's
    writer, from the thread that appends). Returns the size it now has."""
    view = read_manifest(store)
    if view.header is None:
        raise LayerCheckError(f"{store.url}: no header to keep, so the manifest is not compacted")
    data = encode_manifest(view.header, view.all_versions(), view.layouts.values(),
                           view.lineage) + b"".join(
        line + b"\n" for line in view.skipped)
    store.write_atomic(MANIFEST, data)
    return len(data)


def read_consistent(store: Store, prepare: Callable[[ManifestView], T],
                    suspects: Callable[[T], Iterable[Version]], finish: Callable[[T], R], *,
                    attempts: int = 8) -> R:
    """``finish(prepare(view))`` on a snapshot of the manifest, for readers that hold
    no lock (``inspect``, ``plan``, ``export``) beside a trainer that may change the
    directory meanwhile: append, retire versions (``keep_versions``: a drop record,
    then the files) or start a new timeline (overwriting files of the abandoned one).

    ``prepare`` reads and changes nothing; ``finish`` may write (an export folder).
    What ``prepare`` found damaged (``suspects(prepared)``: the versions a plan
    passed over, or an inspection found wrong) and damaged manifest lines are
    believed only if they are still so in the manifest as it is now; otherwise both
    run again on the new one, and ``finish`` never sees a result that is not
    believed. An error (CorruptVersion, CheckpointNotFound) is believed once the
    manifest did not change while it was found. So a reader never passes over, nor
    reports as damaged, a version that was only retired, and never exports a
    composite that was not recoverable. All of it under ``store.reading()``, so
    a trainer's retention deletes no file meanwhile (its drop records still
    appear): retries are for what that cannot hold off (a new timeline
    overwriting abandoned files, an append in flight). LayerCheckError if the
    directory changed under every one of ``attempts`` tries."""
    with store.reading():  # a trainer's retention deletes no file meanwhile
        return _consistent(store, prepare, suspects, finish, attempts)


def _consistent(store: Store, prepare: Callable[[ManifestView], T],
                suspects: Callable[[T], Iterable[Version]], finish: Callable[[T], R],
                attempts: int) -> R:
    data, failure = _manifest_bytes(store), None
    for _ in range(attempts):
        view = _replay(data, None)
        try:
            prepared = prepare(view)
            suspected = set(suspects(prepared))
            if not (view.problems or suspected):
                return finish(prepared)
            data = _manifest_bytes(store)
            now = _replay(data, None)
            if suspected <= set(now.all_versions()) and set(view.problems) <= set(now.problems):
                return finish(prepared)  # still live, still damaged: so they are
        except (CorruptVersion, CheckpointNotFound) as exc:
            fresh = _manifest_bytes(store)
            if fresh == data:  # nothing moved while it was found: so it is
                raise
            data, failure = fresh, exc
    last = f"; the last try found: {failure}" if failure is not None else ""
    raise LayerCheckError(f"{store.url} changed under each of {attempts} tries to read it (a "
                          "running trainer starting a new timeline?): try again, or stop the "
                          f"trainer{last}")


def seal_torn_tail(store: Store) -> bool:
    """End a torn last line (a crash mid-append) with a newline; True if there was one.

    Call with the directory locked, before the first append: otherwise the next
    record would be glued to the torn bytes and be skipped with them, and a lost
    ``resume`` record would mix an abandoned timeline into later restores. The
    torn line itself stays, reported in ``problems`` as a damaged line."""
    if not store.exists(MANIFEST):
        return False
    data = store.read(MANIFEST)
    if not data or data.endswith(b"\n"):
        return False
    store.append(MANIFEST, b"\n")
    return True
