"""The My job page's answers kept on disk between servers: a server started cold answers a
job it (or an earlier server) has answered before without searching again.

An answer is stored under a key made of the job's command line, what else the caller says
it depends on (a trace folder's modification stamp), and ``fingerprint()``: a hash of every
source and data file of the simulator (sim/) and of the policy it replays
(layercheck/contract/), of dashboard/myjob.py, and of the versions of Python, numpy,
pandas, scipy and numba. Code that would answer differently gives another key, so an
answer computed by older code is never shown: the page and ``python -m sim`` keep naming
the same winner.

Files live in $LAYERCHECK_DASHBOARD_CACHE, else $XDG_CACHE_HOME/layercheck/answers, else
~/.cache/layercheck/answers; the least recently used beyond ``MAX_FILES`` are removed. A
file that cannot be read is removed and the answer computed again; a folder that cannot be
written only means nothing is kept. They are pickles: point the variable only at a folder
you alone write. No Streamlit here.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, TypeVar

__all__ = ["ENV", "MAX_FILES", "folder", "fingerprint", "key", "cached"]

ENV = "LAYERCHECK_DASHBOARD_CACHE"
MAX_FILES = 16
"""Answers kept (each is a few tens of MB: every strategy's settings and their runs)."""
_ROOT = Path(__file__).resolve().parent.parent
_SOURCES = (_ROOT / "sim", _ROOT / "layercheck" / "contract")
_FILES = (_ROOT / "dashboard" / "myjob.py",)
_PACKAGES = ("numpy", "pandas", "scipy", "numba")

T = TypeVar("T")


def folder() -> Path:
    """Where answers are kept (not created until one is stored)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layercheck" / "answers"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of everything an answer depends on besides its inputs (the module docstring's
    list); computed once per process (about 10 ms)."""
    digest = hashlib.sha256(sys.version.encode())
    for name in _PACKAGES:
        try:
            digest.update(f"{name} {metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    files = [p for root in _SOURCES for p in root.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".nbi", ".nbc")]
    for path in sorted({*files, *_FILES}):
        digest.update(os.path.relpath(path, _ROOT).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(argv: list[str], *extra: object) -> str:
    """The file name an answer to ``argv`` (and ``extra``: what else it depends on) is kept under."""
    text = repr((fingerprint(), list(argv), extra))
    return hashlib.sha256(text.encode()).hexdigest()[:32] + ".pickle"


def cached(argv: list[str], compute: Callable[[], T], *extra: object) -> T:
    """The answer kept for ``argv`` and ``extra`` if there is one, else ``compute()``, kept."""
    path = folder() / key(argv, *extra)
    try:
        with path.open("rb") as f:
            value = pickle.load(f)
        os.utime(path)                    # recently used: the last to be removed
        return value
    except OSError:                       # none kept, or a folder that cannot be read
        pass
    except Exception:                     # truncated, or from classes that have changed
        path.unlink(missing_ok=True)
    value = compute()
    _store(path, value)
    return value


def _store(path: Path, value: object) -> None:
    part = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as f:
            part = f.name
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(part, path)            # whole or not at all, whatever runs beside it
        kept = sorted(path.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[MAX_FILES:]:
            old.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError):  # a folder that cannot be written keeps nothing
        if part is not None:
            Path(part).unlink(missing_ok=True)
