"""Durations with units: ``36s``, ``30m``, ``0.5h``, ``2d`` (a bare number is seconds)."""
from __future__ import annotations

import math
import re

from .errors import SimError

__all__ = ["parse_duration", "parse_range", "format_duration", "UNITS"]

UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_duration(text: str | float | int, *, what: str = "duration",
                   allow_zero: bool = False) -> float:
    """Seconds in ``text``; raises SimError naming ``what`` and the accepted units.

    Negative, non-finite and (unless ``allow_zero``) zero durations are errors."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _PATTERN.match(str(text).lower())
        if not match or match.group(2) not in ("",) + tuple(UNITS):
            raise SimError(f"{what}={text!r} is not a duration: write a positive number with "
                           f"a unit, e.g. 36s, 30m, 0.5h, 2d (units: {', '.join(UNITS)})")
        seconds = float(match.group(1)) * UNITS.get(match.group(2) or "s", 1.0)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise SimError(f"{what}={text!r} must be a positive duration, e.g. 0.5h")
    return seconds


def parse_range(text: str, *, what: str = "range") -> tuple[float, float]:
    """``0.01h..3h`` -> (36.0, 10800.0); the low end must be below the high end."""
    parts = str(text).split("..")
    if len(parts) != 2:
        raise SimError(f"{what}={text!r}: write LOW..HIGH with units, e.g. 0.01h..3h")
    low, high = (parse_duration(p, what=what) for p in parts)
    if not low < high:
        raise SimError(f"{what}={text!r}: the low end must be below the high end")
    return low, high


def format_duration(seconds: float) -> str:
    """A short human form: 36s, 30m, 1.5h, 2d."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"
