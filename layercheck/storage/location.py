"""Where a checkpoint location points: a local directory, or another filesystem.

One rule for every form that reaches this machine's file system, so that each
of them opens the same ``LocalStore`` and meets the same directory lock: a plain
path; a ``file:`` URL as RFC 8089 writes it (``file:///abs``,
``file://localhost/abs``, ``file:/abs``; percent-escapes decoded, as
``Path.as_uri()`` writes them); fsspec's ``local:`` URL, read by the same rule;
and an fsspec cache chained over one of those (``simplecache::file:///abs``,
``filecache::``, ``blockcache::``), whose target is that directory. A form that
reaches the local file system but names no local directory (another host, a
relative path after a scheme, a query, another fsspec wrapper such as ``dir::``
or ``zip::`` over a local file) is refused with the fix, never resolved against
the working directory nor opened without the lock. Anything else is an fsspec
URL for ``FsspecStore``. Torch-free.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from ..contract.errors import LayerCheckError
from .fsspecstore import FsspecStore
from .localstore import LocalStore
from .store import Store

__all__ = ["local_directory", "open_store"]

_LOCAL_SCHEMES = ("file", "local")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_LOCAL_HOSTS = ("", "localhost")
_FIX = "give the directory as file:///abs/path (or file://localhost/abs/path), or as a plain path"


def local_directory(location: "str | os.PathLike[str]") -> str | None:
    """The local directory that ``location`` names (see the module doc), as a path
    string; None for a URL of another filesystem (``memory://``, ``s3://b/p``,
    ``simplecache::s3://...``). LayerCheckError, saying the fix, for a URL of the
    local file system that names no local directory."""
    text = os.fspath(location)
    segments = text.split("::")
    if len(segments) > 1 and _is_protocol(segments[0]):
        return _chained(text, segments)
    scheme = _scheme(text)
    if scheme is not None:
        return _file_url(text, scheme)
    if "://" in text:
        return None  # an fsspec URL of another filesystem (or an unknown protocol: it says so)
    return text


def _scheme(text: str) -> str | None:
    """The scheme of ``text`` if it is a URL of the local file system, else None."""
    match = _SCHEME.match(text)
    if match is None:
        return None
    scheme = match.group(1).lower()
    if scheme in _LOCAL_SCHEMES:
        return scheme
    if not text[match.end():].startswith("//"):
        return None  # 'ckpt:v2' is a folder's name, not a URL
    return scheme if _local_class(scheme) else None


def _file_url(text: str, scheme: str) -> str:
    """The absolute path of the local URL ``text`` (RFC 8089, also for ``local:``)."""
    rest = text[len(scheme) + 1:]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host.lower() not in _LOCAL_HOSTS:
            raise LayerCheckError(
                f"{text}: names host {host!r}, and a {scheme}: URL reaches only this machine's "
                f"file system (its host is empty or 'localhost'): {_FIX}")
        if not slash:
            raise LayerCheckError(f"{text}: names no directory: {_FIX}")
        path = "/" + path
    elif rest.startswith("/"):
        path = rest
    else:
        raise LayerCheckError(f"{text}: {rest!r} is not an absolute path, and a {scheme}: URL "
                              f"is resolved against no working directory: {_FIX}")
    if "?" in path or "#" in path:
        raise LayerCheckError(f"{text}: a checkpoint directory's URL takes no query or fragment: "
                              f"{_FIX} (escape '?' as %3F and '#' as %23 in a name)")
    return unquote(path)


def _chained(text: str, segments: list[str]) -> str | None:
    """The local directory of an fsspec chain ``outer::...::target``: its target's,
    where every outer part is a cache of it; None where the target is not local."""
    target = segments[-1]
    scheme = _scheme(target)
    if scheme is None and "://" in target:
        return None  # a cache (or other wrapper) of another filesystem: fsspec's to open
    for outer in segments[:-1]:
        protocol, _, own = outer.partition("://")
        if own or not _is_cache(protocol):
            raise LayerCheckError(
                f"{text}: reaches the local file system through {protocol!r}, which layercheck "
                "does not open (it could not lock the directory against a second writer): "
                f"{_FIX}, which it locks")
    return _file_url(target, scheme) if scheme is not None else target


def _filesystem_class(protocol: str) -> type | None:
    try:
        import fsspec
        return fsspec.get_filesystem_class(protocol)
    except Exception:  # unknown protocol, driver not installed: not one of these
        return None


def _is_protocol(text: str) -> bool:
    protocol = text.partition("://")[0]
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", protocol)) and \
        _filesystem_class(protocol) is not None


def _is_cache(protocol: str) -> bool:
    from fsspec.implementations.cached import CachingFileSystem
    cls = _filesystem_class(protocol)
    return cls is not None and issubclass(cls, CachingFileSystem)


def _local_class(protocol: str) -> bool:
    from fsspec.implementations.local import LocalFileSystem
    cls = _filesystem_class(protocol)
    return cls is not None and issubclass(cls, LocalFileSystem)


def open_store(location: "str | os.PathLike[str] | Store", *, create: bool = True,
               **storage_options: object) -> Store:
    """A Store for a location, or a Store passed through unchanged. Every form that
    names a local directory (a path, ``file:`` and ``local:`` URLs, fsspec caches
    chained over them: ``location.local_directory``) opens it as a ``LocalStore``,
    with its lock; any other fsspec URL ('memory://run1', 's3://b/p') an
    ``FsspecStore``."""
    if isinstance(location, Store) and not isinstance(location, (str, os.PathLike)):
        return location
    text = local_directory(location)
    if text is None:
        url = os.fspath(location)
        try:
            return FsspecStore(url, create=create, **storage_options)
        except LayerCheckError:
            raise
        except Exception as exc:  # unknown protocol, missing driver, unreachable host, ...
            raise LayerCheckError(f"{url}: cannot open it as an fsspec URL ({exc}); check the "
                                  "protocol and that its fsspec driver is installed") from None
    if not create and not Path(text).is_dir():
        raise LayerCheckError(f"{text}: no such checkpoint directory")
    return LocalStore(text, create=create)
