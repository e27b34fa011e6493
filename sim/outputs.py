"""Where a command writes its files: a folder made before any work, write errors as one line.

A folder that cannot be made or written (``sweep --out /etc/passwd``) is refused before
the first failure is drawn, not after the whole sweep has run, and an error while
writing names the file.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import SimError

__all__ = ["output_folder", "writing"]


def output_folder(text: str, *, flag: str = "--out") -> Path:
    """The folder ``text``, made (with its parents) now, or ``SimError`` saying why not."""
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise SimError(f"{flag} {text}: exists and is not a folder; give a folder for the "
                       "output files (it is made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError(f"{flag} {text}: cannot make the folder ({exc.strerror or exc}); "
                       "give a folder you can write") from None
    probe = folder / ".sim-write-probe"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SimError(f"{flag} {text}: cannot write there ({exc.strerror or exc}); give a "
                       "folder you can write") from None
    return folder


@contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Turn an ``OSError`` while writing into ``folder`` into one line that names the file."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or folder
        raise SimError(f"cannot write {where} ({exc.strerror or exc}): free space or give "
                       "another --out") from None
