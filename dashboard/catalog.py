"""Which traces exist, which one opens by default, and reading an uploaded one.

A trace is a folder (``layercheck.contract.trace``). The dashboard lists the folders
under the traces directory (``$LAYERCHECK_TRACES``, else ``./traces``, else the
repository's ``traces/``), validates each with ``load`` and keeps the
error message of the invalid ones to show instead of a stack trace.
"""
from __future__ import annotations

import io
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Sequence

from layercheck.contract.decision import recorded_config
from layercheck.contract.trace import STUDY_FILE, Trace, TraceError, read_trace

__all__ = ["ENV", "DEFAULT_PRESET", "Entry", "traces_dir", "scan", "default_entry", "unpack_upload",
           "UPLOAD_FILES"]

ENV = "LAYERCHECK_TRACES"
DEFAULT_PRESET = "qwen2.5-7b"
"""The synthetic preset that opens when no captured trace is shipped (the paper's own setting)."""
UPLOAD_FILES = ("manifest.json", "steps.parquet", "drift.parquet", "writes.parquet",
                "recovery.parquet", "drill.json", STUDY_FILE)
_MAX_UPLOAD = 512 << 20  # bytes unpacked from one upload


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One folder of the traces directory: its manifest's summary, or why it is invalid."""

    name: str
    path: Path
    kind: str | None = None
    model: str | None = None
    steps: int | None = None
    layers: int | None = None
    has_drill: bool = False
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def traces_dir() -> Path:
    """$LAYERCHECK_TRACES, else ./traces when it exists, else the repository's traces/."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    local = Path.cwd() / "traces"
    return local if local.is_dir() else Path(__file__).resolve().parent.parent / "traces"


def describe(path: Path) -> Entry:
    """Validate the trace at ``path``; an invalid one becomes an Entry with ``error``."""
    try:
        trace = load(path)
    except TraceError as exc:
        return Entry(name=path.name, path=path, error=str(exc))
    return Entry(name=path.name, path=path, kind=trace.kind, model=model_label(trace),
                 steps=trace.num_steps, layers=len(trace.layer_names),
                 has_drill=trace.drill is not None)


def model_label(trace: Trace) -> str:
    """A short name for the trace's model: its label or name, and its size."""
    model = trace.manifest.get("model")
    if not isinstance(model, dict):
        return str(model)
    name = model.get("label") or model.get("name") or model.get("hf_id") or "model"
    params = model.get("parameters") or int(trace.layers["params"].sum())
    return f"{name} ({params / 1e6:,.1f} M parameters)"


def scan(root: Path) -> list[Entry]:
    """Every sub-folder of ``root`` holding a manifest.json, sorted by name."""
    if not root.is_dir():
        return []
    return [describe(p) for p in sorted(root.iterdir(), key=lambda p: p.name)
            if p.is_dir() and (p / "manifest.json").exists()]


def default_entry(entries: Sequence[Entry]) -> Entry | None:
    """The trace that opens first: the first captured trace by name, else the
    Qwen2.5-7B synthetic preset, else the first valid trace; None if none is valid."""
    valid = sorted((e for e in entries if e.valid), key=lambda e: e.name)
    for entry in valid:
        if entry.kind == "captured":
            return entry
    for entry in valid:
        if entry.kind == "synthetic" and entry.name.lower().startswith(DEFAULT_PRESET):
            return entry
    return valid[0] if valid else None


def unpack_upload(files: Sequence[tuple[str, bytes]], into: Path | None = None) -> Path:
    """Write an uploaded trace to a new folder and return it: either one .zip of
    the trace folder, or its files (manifest.json, *.parquet, drill.json, staleness.json).
    Raises TraceError with the fix when the upload cannot be a trace."""
    if not files:
        raise TraceError("nothing uploaded: upload a .zip of a trace folder, or its "
                         "manifest.json and Parquet files together")
    root = Path(into or tempfile.mkdtemp(prefix="layercheck-upload-"))
    root.mkdir(parents=True, exist_ok=True)
    if len(files) == 1 and files[0][0].lower().endswith(".zip"):
        return _unzip(files[0][1], root)
    for name, data in files:
        base = PurePosixPath(name.replace("\\", "/")).name
        if base not in UPLOAD_FILES:
            raise TraceError(f"{name}: not a trace file; a trace holds {', '.join(UPLOAD_FILES)} "
                             "(upload a .zip of the whole folder to keep them together)")
        (root / base).write_bytes(data)
    return root


def _unzip(data: bytes, root: Path) -> Path:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise TraceError("the upload is not a readable .zip file: zip the trace folder "
                         "(e.g. `cd traces && zip -r NAME.zip NAME`) and upload that") from None
    members = [m for m in archive.infolist() if not m.is_dir()]
    if sum(m.file_size for m in members) > _MAX_UPLOAD:
        raise TraceError(f"the .zip unpacks to more than {_MAX_UPLOAD >> 20} MiB; upload a smaller trace")
    manifests = [m for m in members if PurePosixPath(m.filename).name == "manifest.json"]
    if len(manifests) != 1:
        raise TraceError(f"the .zip holds {len(manifests)} manifest.json files; it must hold "
                         "exactly one trace folder")
    folder = PurePosixPath(manifests[0].filename).parent
    for m in members:
        path = PurePosixPath(m.filename)
        if path.parent == folder and path.name in UPLOAD_FILES:
            (root / path.name).write_bytes(archive.read(m))
    return root


def load(path: Path) -> Trace:
    """``read_trace``, and the trace's recorded config read (``layercheck.contract.decision``'s
    error rule: every view re-decides the run from it, so a trace whose config is not
    valid is an unreadable trace here, with the same TraceError); the UI's one call."""
    trace = read_trace(path)
    recorded_config(trace)
    return trace
