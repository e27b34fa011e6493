"""The drift tracker's fused path: per-layer sums of one step read by the kernel.

Contiguous CPU fp32 tensors whose weights and both moments the kernel may read
(``fusable``) go through ``layercheck.drift.kernels``' one streaming pass, loaded on first
use (numba takes a second or more to import, so only a tracker that steps pays for
it; where it cannot be imported, nothing is fused and ``layercheck.drift``'s torch
path measures everything). Per step this only reads each tensor's address; what
depends on which entries those are (the kernel's segments, each entry's layer and
scale) is built once per set of entries (``_Layout``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Protocol

import numpy as np
import torch

from .adamupdate import NOT_STEPPED, AdamTerms



class _Entry(Protocol):
    """What the fused path reads of one tracked parameter (``layercheck.drift``'s entries
    are these; stated here so that the dependency points one way)."""

    param: torch.Tensor
    layer: int
    scale: float

    @property
    def data(self) -> torch.Tensor: ...

    def extent(self) -> tuple[int, int, int]: ...

__all__ = ["FusedSums", "fusable", "load_kernels"]

_kernels: ModuleType | bool | None = None
"""layercheck.drift.kernels once imported; False where numba is missing or fails to
import; None before the first try."""


def load_kernels() -> ModuleType | None:
    """``layercheck.drift.kernels``, imported on the first call; None where it cannot be (the
    failure is remembered)."""
    global _kernels
    if _kernels is None:
        try:
            _kernels = importlib.import_module(".kernels", __package__)
        except ImportError:
            _kernels = False
    return _kernels or None


def fusable(t: torch.Tensor) -> bool:
    """Whether the kernel may read ``t`` through its address (see layercheck.drift.kernels)."""
    return t.is_cpu and t.dtype is torch.float32 and t.is_contiguous()


@dataclass(frozen=True)
class _Layout:
    """What the fused pass needs about one set of entries, built once for it:
    the kernel's segments, and each entry's layer, scale and identity."""

    plan: object  # layercheck.drift.kernels.FusedPass
    layer: np.ndarray
    scale: np.ndarray
    ids: frozenset[int]

    @classmethod
    def of(cls, kernels: ModuleType, entries: list[_Entry]) -> "_Layout":
        return cls(kernels.FusedPass([e.extent() for e in entries]),
                   np.array([e.layer for e in entries], dtype=np.intp),
                   np.array([e.scale for e in entries]), frozenset(id(e) for e in entries))


class FusedSums:
    """The fused path over a tracker's entries (``entries``, each of a layer below
    ``layers``). ``moments(entry)``: its (exp_avg, second moment) tensors; ``sampling``:
    the tracker's (the pass reads block ``phase % sampling`` of each run); ``enabled``
    False: nothing is fused. ``count``: entries measured since the caller last reset it."""

    def __init__(self, entries: list[_Entry], layers: int,
                 moments: Callable[[_Entry], tuple[torch.Tensor, torch.Tensor]], *,
                 sampling: int, enabled: bool) -> None:
        self._all = entries
        self._layers = layers
        self._moments = moments
        self.sampling = sampling
        self._fused = enabled
        self._layouts: dict[tuple[int, ...], _Layout] = {}
        self._indices: dict[int, list[int]] = {}  # parameter id -> its entries' indices
        for index, e in enumerate(entries):
            self._indices.setdefault(id(e.param), []).append(index)
        self.count = 0

    def sums(self, stepped: set[int], updates: dict[int, AdamTerms],
             phase: int) -> tuple[np.ndarray, np.ndarray, frozenset[int]]:
        """Per-layer sums over the stepped entries the kernel can read, and which those
        were (by ``id`` of the entry). ``stepped``: ids of the parameters this optimizer
        call stepped; ``updates``: the terms of those Adam moved (the others are read for
        sum |w| only)."""
        kernels = load_kernels() if self._fused else None
        if kernels is None:
            return np.zeros(self._layers), np.zeros(self._layers), frozenset()
        chosen, ptr, terms = [], [], []
        # only what this call stepped (under ZeRO-3 one partition of many), in entry order
        for index in sorted(i for key in stepped for i in self._indices.get(key, ())):
            e = self._all[index]
            key = id(e.param)
            w = e.data
            if not fusable(w):
                continue
            t = updates.get(key)
            if t is None:
                chosen.append(index)
                ptr.append((w.data_ptr(), 0, 0))
                terms.append(NOT_STEPPED)
                continue
            m, v = self._moments(e)
            if fusable(m) and fusable(v):
                chosen.append(index)
                ptr.append((w.data_ptr(), m.data_ptr(), v.data_ptr()))
                terms.append(t)
        self.count += len(chosen)
        if not chosen:
            return np.zeros(self._layers), np.zeros(self._layers), frozenset()
        layout = self._layouts.get(tuple(chosen))
        if layout is None:
            layout = self._layouts[tuple(chosen)] = _Layout.of(kernels, [self._all[i] for i in chosen])
        # a step's entries share a few update terms (one per param group)
        unique: dict[int, int] = {}
        which = np.array([unique.setdefault(id(t), len(unique)) for t in terms], dtype=np.intp)
        table = np.array([(t.eps_c, t.alpha, t.moved(1.0)) for t in
                          {id(t): t for t in terms}.values()]).T
        raw_moved, raw_size = layout.plan.run(
            np.array(ptr, dtype=np.int64), table[0].astype(np.float32)[which],
            table[1].astype(np.float32)[which], phase % self.sampling, self._threads())
        moved = np.bincount(layout.layer, raw_moved * table[2][which] * layout.scale,
                            minlength=self._layers)
        size = np.bincount(layout.layer, raw_size * layout.scale, minlength=self._layers)
        return moved, size, layout.ids

    @staticmethod
    def _threads() -> int:
        """Threads the kernel may use: torch's own count, so that the pass takes
        the cores training uses and no more (see layercheck.drift.kernels, Threads)."""
        return torch.get_num_threads()
