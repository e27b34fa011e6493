"""A figure's plausible band: the range ``python -m sim sensitivity`` varies it across, and why.

Torch-free. A ``Band`` lives with the figure it bounds (``layercheck.contract.calibration.Figure.band``,
the paper-a100 figures in ``sim.costs``) or as a figure's default rule
(``layercheck.contract.calibration.FigureSpec.band``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Band", "BandError"]


class BandError(ValueError):
    """A band that is malformed or states no reason; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Band:
    """The plausible range of a figure nobody measured here, and why (what ``python -m sim
    sensitivity`` varies it across). ``relative``: ``low`` and ``high`` are factors of the
    figure's value (a rule of ``FigureSpec``, for any value); else they are the figure's
    own unit. The reason names its source (a paper's numbers, a hardware spec, this
    project's own measurements) or says that it is a judgment."""

    low: float
    high: float
    reason: str
    relative: bool = False

    def __post_init__(self) -> None:
        for key in ("low", "high"):
            number = getattr(self, key)
            if isinstance(number, bool) or not isinstance(number, (int, float)) \
                    or not math.isfinite(number):
                raise BandError(f"band {key} {number!r} must be a finite number")
        if not self.low <= self.high:
            raise BandError(f"band [{self.low}, {self.high}]: low must not exceed high")
        if self.relative and self.low <= 0:
            raise BandError(f"a relative band's factors must be positive, not {self.low}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise BandError("a band must state its reason (its source, or that it is "
                                   "a judgment)")

    def around(self, value: float) -> "Band":
        """This band for a figure of ``value``: a relative band scaled by it; an absolute one
        widened, if need be, to hold it."""
        if self.relative:
            return Band(low=value * self.low, high=value * self.high, reason=self.reason)
        return Band(low=min(self.low, value), high=max(self.high, value), reason=self.reason)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"low": self.low, "high": self.high, "reason": self.reason}
        if self.relative:
            out["relative"] = True
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "Band":
        if not isinstance(data, Mapping) or sorted(set(data) - {"relative"}) != ["high", "low", "reason"]:
            raise BandError("band must be an object of low, high and reason")
        return cls(**dict(data))
