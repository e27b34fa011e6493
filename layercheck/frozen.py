"""Which parameters of each layer train, and which full version holds the others.

A layer version carries the parameters that train and their optimizer state
(``format``: frozen tensors). ``FrozenParts`` decides, for each version the
policy writes, whether it may leave the frozen parameters out (a *partial*
version naming its layer's *full* version, whose file holds them) or must hold
everything (a full version): partial only where each parameter frozen now was
frozen at every step since that full version was taken, so the bytes there are
still its value. A parameter unfrozen later is then simply written (it is not
frozen now); one frozen later was not frozen all along, so the next version is
full and becomes the layer's new full version. A failed write of a layer
forgets its full version (its record may never have committed): the next
version of it is full again. Frozen means ``requires_grad`` is False
(``LayerSource.frozen``); buffers are written in every version (some change in
training: batch-norm statistics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from .format import Version, tensor_key

__all__ = ["FrozenParts", "Part", "trained_nbytes"]


@dataclass(frozen=True)
class Part:
    """What one version of a layer holds: all but ``frozen`` where ``base`` is set."""

    frozen: tuple[str, ...] = ()
    base: int | None = None

    @property
    def omit(self) -> frozenset[str]:
        """The parameters the version's file leaves out."""
        return frozenset(self.frozen) if self.base is not None else frozenset()


class FrozenParts:
    """Per layer: its full version's step and the parameters frozen ever since.

    ``frozen(i)``: the names of layer i's parameters that do not train now.
    Call ``observe()`` once per step (cheap: only layers with a full version
    holding frozen parameters are looked at), ``part(i, step)`` for each version
    written, ``forget(layers)`` after their write failed, ``start(standing)``
    where a timeline opens (the versions a restore applied, or none)."""

    def __init__(self, layers: int, frozen: Callable[[int], Iterable[str]]) -> None:
        self._frozen = frozen
        self._base: list[int | None] = [None] * layers
        self._since: list[frozenset[str]] = [frozenset()] * layers
        self._index: dict[str, int] = {}

    def start(self, names: list[str], standing: Mapping[str, Version] | None = None) -> None:
        """A new timeline: each layer's full version is the one its standing version
        (applied by a restore) is or names; none without a restore."""
        self._index = {name: i for i, name in enumerate(names)}
        self._base = [None] * len(names)
        self._since = [frozenset()] * len(names)
        for name, version in (standing or {}).items():
            i = self._index[name]
            base = version.base if version.base is not None else (
                version.step if version.frozen else None)
            if base is not None:
                self._base[i] = base
                self._since[i] = frozenset(version.frozen) & frozenset(self._frozen(i))

    def observe(self) -> None:
        """Note this step's frozen parameters: one trained now is no longer frozen all along."""
        for i, since in enumerate(self._since):
            if since:
                self._since[i] = since & frozenset(self._frozen(i))

    def part(self, i: int, step: int) -> Part:
        """What layer ``i``'s version of ``step`` holds; a full one becomes its full version."""
        now = frozenset(self._frozen(i))
        base = self._base[i]
        if now and base is not None and base < step and now <= self._since[i]:
            return Part(tuple(sorted(now)), base)
        self._base[i] = step if now else None
        self._since[i] = now
        return Part(tuple(sorted(now)))

    def forget(self, layers: Iterable[int]) -> None:
        """Their last write failed: their next version is full."""
        for i in layers:
            self._base[i], self._since[i] = None, frozenset()


def trained_nbytes(tensors: Mapping[str, Any], frozen: Iterable[str]) -> int:
    """The bytes of a layer's tensors but its ``frozen`` parameters: what each of its
    versions after the full one writes (a write budget's size of the layer)."""
    skip = {tensor_key("param", name) for name in frozen}
    return sum(t.numel() * t.element_size() for key, t in tensors.items() if key not in skip)
