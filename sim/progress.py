"""Progress of a long command on stderr: a tqdm bar, or nothing.

    with Progress("python -m sim sensitivity", enabled=shown(args.progress)) as bar:
        sensitivity(..., progress=bar)          # the work calls bar(done, total)

A bar goes to stderr only, so a command's ``--json`` or ``--csv`` on stdout stays
clean; by default only where stderr is a terminal (``shown``), so a log or a pipe
gets no carriage returns. The work reports ``(done, total)`` in its own units (runs,
stages); a stage's name goes beside the count (``stage``).
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["Progress", "shown"]


def shown(asked: bool | None) -> bool:
    """Whether to draw a bar: as asked (``--progress`` / ``--no-progress``), else only
    where stderr is a terminal."""
    if asked is not None:
        return asked
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """A bar on stderr that the work moves by calling it with ``(done, total)``; a no-op
    when not ``enabled`` (tqdm is imported only for a bar drawn)."""

    def __init__(self, desc: str, *, enabled: bool, unit: str = "run") -> None:
        self.desc, self.enabled, self.unit = desc, enabled, unit
        self._bar: Any = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm
            # mininterval 0: a command's steps are few and seconds long, each worth drawing
            self._bar = tqdm(total=total, desc=self.desc, unit=self.unit, file=sys.stderr,
                             leave=False, dynamic_ncols=True, mininterval=0)
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def stage(self, name: str, done: int, total: int) -> None:
        """``(done, total)`` with the stage now running named beside the count."""
        self(done, total)
        if self._bar is not None:
            self._bar.set_postfix_str(name)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
