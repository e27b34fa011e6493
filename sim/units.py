"""Durations with units: ``36s``, ``30m``, ``0.5h``, ``2d`` (a bare number is seconds).

Every duration the simulator takes (a flag, a failure log's time, an API argument)
lies in ``MIN_DURATION_S`` .. ``MAX_DURATION_S`` (or is 0 where zero means none):
a nanosecond is shorter than anything a job does, and 1e18 s (about 32 billion
years) is longer than any MTBF or window means, while products and sums of such
durations (a window over a job of a million steps, Daly's interval) stay far
inside float64. Past them a value is a typo that overflowed the arithmetic
(``OverflowError``, NaN) or divided by an underflowed zero.
"""
from __future__ import annotations

import re

from .errors import SimError

__all__ = ["parse_duration", "parse_range", "format_duration", "is_duration", "UNITS",
           "MIN_DURATION_S", "MAX_DURATION_S", "DURATION_RANGE"]

UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
MIN_DURATION_S = 1e-9
MAX_DURATION_S = 1e18
DURATION_RANGE = "1 ns to 1e18 s"
"""The range every duration error names."""
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


def is_duration(seconds: object, *, allow_zero: bool = False) -> bool:
    """Whether ``seconds`` is a number in the simulator's range of durations (or 0)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        try:                                   # numpy scalars
            seconds = float(seconds)           # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return False
    try:
        value = float(seconds)
    except OverflowError:                      # an int past float64
        return False
    return (allow_zero and value == 0) or MIN_DURATION_S <= value <= MAX_DURATION_S


def parse_duration(text: str | float | int, *, what: str = "duration",
                   allow_zero: bool = False) -> float:
    """Seconds in ``text``; raises SimError naming ``what``, the accepted units and the
    range (``MIN_DURATION_S`` .. ``MAX_DURATION_S``; 0 too when ``allow_zero``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = text
    else:
        match = _PATTERN.match(str(text).lower())
        if not match or match.group(2) not in ("",) + tuple(UNITS):
            raise SimError(f"{what}={text!r} is not a duration: write a positive number with "
                           f"a unit, e.g. 36s, 30m, 0.5h, 2d (units: {', '.join(UNITS)})")
        seconds = float(match.group(1)) * UNITS.get(match.group(2) or "s", 1.0)
    if not is_duration(seconds, allow_zero=allow_zero):
        kind = "0 or a duration" if allow_zero else "a positive duration"
        raise SimError(f"{what}={text!r} must be {kind} from {DURATION_RANGE}, e.g. 0.5h")
    return float(seconds)


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
