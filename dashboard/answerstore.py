"""Answers kept on disk between servers, as JSON: a server started cold shows an answer it
(or an earlier server) computed before without computing it again.

An answer is kept under ``key(parts)``: a hash of the caller's ``parts`` (a job's command
line, a trace folder's modification stamp ...), of ``FORMAT`` and of ``fingerprint()``:
every source and data file of the simulator (sim/), of the policy it replays
(layercheck/contract/) and of the dashboard modules that turn its answer into what a page
shows, and the versions of Python and of the numeric and plotting packages. Code that
would answer differently gives another key, so an answer computed by older code is never
shown, and what is shown is always what this code computes for these inputs.

Files are plain JSON (``json.loads``: nothing is unpickled or executed), written whole or
not at all (a temporary file in the same folder, then ``os.replace``). Each holds its own
key: a file that cannot be read, is not JSON, holds another key or another format, or
whose payload the caller cannot decode is ignored, and the answer computed again and
written over it. A folder that cannot be written only means nothing is kept. Files live in
$LAYERCHECK_DASHBOARD_STORE, else $XDG_CACHE_HOME/layercheck/answers, else
~/.cache/layercheck/answers; the least recently used beyond ``MAX_FILES`` are removed.

``frame_payload`` and ``frame_of`` carry a DataFrame through JSON exactly (floats as
Python writes them, which reads back to the same bits; NaN and infinities included;
column order and dtypes kept). No Streamlit here.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, TypeVar

import pandas as pd

__all__ = ["ENV", "FORMAT", "MAX_FILES", "folder", "fingerprint", "key", "cached", "frame_payload",
           "frame_of"]

ENV = "LAYERCHECK_DASHBOARD_STORE"
FORMAT = 1
"""The files' layout: bump it when what ``cached`` writes around a payload changes."""
MAX_FILES = 32
"""Answers kept (the My job page's is about 0.2 MB)."""
_ROOT = Path(__file__).resolve().parent.parent
_SOURCES = (_ROOT / "sim", _ROOT / "layercheck" / "contract")
_FILES = tuple(_ROOT / "dashboard" / f"{name}.py"
               for name in ("answerstore", "charts", "jobsummary", "myjob", "verdict"))
_PACKAGES = ("numpy", "pandas", "scipy", "numba", "simpy", "pyarrow", "plotly")
_SKIP = (".pyc", ".nbi", ".nbc")

T = TypeVar("T")


def folder() -> Path:
    """Where answers are kept (created when the first is stored)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layercheck" / "answers"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of everything an answer depends on besides its inputs (the module docstring's
    list); computed once per process."""
    digest = hashlib.sha256(sys.version.encode())
    for name in _PACKAGES:
        try:
            digest.update(f"{name} {metadata.version(name)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent\n".encode())
    files = [p for root in _SOURCES for p in root.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in _SKIP]
    for path in sorted({*files, *_FILES}):
        digest.update(os.path.relpath(path, _ROOT).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def key(parts: object) -> str:
    """The key an answer to ``parts`` (its inputs, as JSON-able values) is kept under."""
    text = json.dumps([FORMAT, fingerprint(), parts], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def cached(parts: object, compute: Callable[[], T], *, encode: Callable[[T], dict],
           decode: Callable[[dict], T]) -> T:
    """The answer kept for ``parts`` if there is a readable one, else ``compute()``, kept.

    ``encode`` turns an answer into JSON-able data, ``decode`` back; a ``decode`` that
    raises (a damaged or foreign file) means the answer is computed again."""
    name = key(parts)
    path = folder() / f"{name}.json"
    try:
        stored = json.loads(path.read_bytes())
        if stored["format"] == FORMAT and stored["key"] == name:
            value = decode(stored["payload"])
            os.utime(path)                    # recently used: the last to be removed
            return value
    except Exception:                         # none kept, unreadable, damaged or foreign
        pass
    value = compute()
    _store(path, {"format": FORMAT, "key": name, "payload": encode(value)})
    return value


def _store(path: Path, content: dict) -> None:
    part = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".part", delete=False,
                                         encoding="utf-8") as f:
            part = f.name
            json.dump(content, f)
        os.replace(part, path)                # whole or not at all, whatever runs beside it
        part = None
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[MAX_FILES:]:
            old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):  # a folder that cannot be written keeps nothing
        if part is not None:
            Path(part).unlink(missing_ok=True)


def frame_payload(frame: pd.DataFrame) -> dict:
    """A DataFrame (default index) as JSON-able data that ``frame_of`` reads back equal."""
    columns = [str(c) for c in frame.columns]
    if len(set(columns)) != len(columns) or list(frame.columns) != columns:
        raise ValueError("frame_payload needs distinct string column names")
    return {"columns": columns, "dtypes": [str(frame[c].dtype) for c in columns],
            "data": [frame[c].tolist() for c in columns]}


def frame_of(payload: dict) -> pd.DataFrame:
    """The DataFrame ``frame_payload`` wrote (raises on anything else)."""
    columns, dtypes, data = payload["columns"], payload["dtypes"], payload["data"]
    if not len(columns) == len(dtypes) == len(data) or len({len(d) for d in data}) > 1:
        raise ValueError("not a stored frame")
    return pd.DataFrame({c: pd.Series(d, dtype=t) for c, t, d in zip(columns, dtypes, data)},
                        columns=columns)

