"""Which parameters of each layer train, and which full version holds the others.

A layer version carries the parameters that train and their optimizer state
(``format``: frozen tensors). ``FrozenParts`` decides, for each version the
policy writes, whether it may leave frozen parameters out (a *partial* version
naming its layer's *full* version, whose file holds them) or must hold
everything (a full version). Frozen (``requires_grad`` False) is not
unchanged: an EMA teacher (MoCo, DINO, BYOL) moves every step without
training. So a parameter is left out only while it provably equals the copy
the full version holds: frozen at every step since that full version, and its
fingerprint (``layercheck.storage.fingerprint``, taken where the tensor lives) the one
taken when the full version was captured. Each partial version checks the
fingerprints of what it leaves out; nothing else is read per step.

A frozen parameter found changed is *moving*: written in this and every later
version (like a trained one, never fingerprinted again), while the rest stay
left out. A parameter unfrozen later is simply written (it is not frozen now);
one frozen later was not frozen all along, so the next version is full and
becomes the layer's new full version (its ``frozen``: the frozen parameters but
the moving ones, which later versions may leave out). A failed write of a layer
forgets its full version (its record may never have committed): the next
version of it is full again. Buffers are written in every version (some change
in training: batch-norm statistics).

A source may also hold frozen tensors that no version holds at all
(``LayerSource.kept``: ZeRO's frozen parameters, in no sub-group): a restore
leaves them as they are live. ``KeptTensors`` makes that sound: a step where
one changed since the timeline began is refused on every rank before anything
of it is written, each step's state records their fingerprints, and a restore
refuses a live one that is not the tensor the restored step recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from .contract.errors import LayerCheckError, ModelMismatch
from .storage.fingerprint import fingerprints, recomputed
from .storage.format import Version, tensor_key

if TYPE_CHECKING:
    from .backends.ranks import Ranks
    from .backends.source import LayerSource

__all__ = ["FrozenParts", "KeptTensors", "Part", "trained_nbytes"]

Look = Callable[[int, Iterable[str]], Mapping[str, str]]
"""``look(i, names)``: the fingerprints of layer i's parameters ``names`` as they are now."""


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
    """Per layer: its full version's step, the parameters frozen and unchanged ever
    since (with their fingerprints then), and those found moving.

    ``frozen(i)``: the names of layer i's parameters that do not train now;
    ``look``: their fingerprints (``Look``). Call ``observe()`` once per step
    (cheap: only layers with parameters left out or moving are looked at),
    ``part(i, step)`` for each version written (right before it is captured),
    ``forget(layers)`` after their write failed, ``start(standing)`` where a
    timeline opens (the versions a restore applied, or none)."""

    def __init__(self, layers: int, frozen: Callable[[int], Iterable[str]], look: Look) -> None:
        self._frozen, self._look = frozen, look
        self._base: list[int | None] = [None] * layers
        self._since: list[frozenset[str]] = [frozenset()] * layers
        self._prints: list[Mapping[str, str]] = [{}] * layers
        self._moving: list[frozenset[str]] = [frozenset()] * layers
        self._index: dict[str, int] = {}

    def start(self, names: list[str], standing: Mapping[str, Version] | None = None) -> None:
        """A new timeline: each layer's full version is the one its standing version
        (applied by a restore, so the live parameters are its copies now) is or names;
        none without a restore."""
        self._index = {name: i for i, name in enumerate(names)}
        self._base = [None] * len(names)
        self._since = [frozenset()] * len(names)
        self._prints = [{}] * len(names)
        self._moving = [frozenset()] * len(names)
        for name, version in (standing or {}).items():
            i = self._index[name]
            base = version.base if version.base is not None else (
                version.step if version.frozen else None)
            if base is not None:
                self._base[i] = base
                self._since[i] = frozenset(version.frozen) & frozenset(self._frozen(i))
                self._prints[i] = dict(self._look(i, self._since[i]))

    def observe(self) -> None:
        """Note this step's frozen parameters: one trained now is no longer frozen all along."""
        for i, (since, moving) in enumerate(zip(self._since, self._moving)):
            if since or moving:
                now = frozenset(self._frozen(i))
                self._since[i], self._moving[i] = since & now, moving & now

    def part(self, i: int, step: int) -> Part:
        """What layer ``i``'s version of ``step`` holds; a full one becomes its full version."""
        now = frozenset(self._frozen(i))
        base = self._base[i]
        if now and base is not None and base < step and now <= self._since[i] | self._moving[i]:
            check = now & self._since[i]
            prints = self._look(i, check)
            changed = frozenset(n for n in check if prints[n] != self._prints[i][n])
            if changed:  # moved since the full version: written from now on
                self._moving[i] |= changed
                self._since[i] -= changed
            if check - changed:
                return Part(tuple(sorted(check - changed)), base)
        held = now - self._moving[i]  # what later versions may leave out
        self._base[i] = step if held else None
        self._since[i] = held
        self._prints[i] = dict(self._look(i, held)) if held else {}
        return Part(tuple(sorted(held)))

    def forget(self, layers: Iterable[int]) -> None:
        """Their last write failed: their next version is full."""
        for i in layers:
            self._base[i], self._since[i], self._prints[i] = None, frozenset(), {}


class KeptTensors:
    """The live tensors no version holds (``source.kept()``), proven unchanged (module doc).

    ``start(step)`` where a timeline begins (after a restore's copies), ``unchanged()``
    before each step's versions are captured (its fingerprints go into the state),
    ``check(recorded, step)`` when a restore has read the state of ``step``."""

    def __init__(self, source: "LayerSource", ranks: "Ranks") -> None:
        self.source, self.ranks = source, ranks
        self._prints: dict[str, str] = {}
        self._since = 0

    def start(self, step: int) -> None:
        self._prints, self._since = fingerprints(self.source.kept()), step

    def unchanged(self) -> dict[str, str]:
        """The fingerprints now; LayerCheckError on every rank where one changed on any
        rank since the timeline began (a restore would bring the versions back beside
        a value they were not trained with)."""
        tensors = self.source.kept()
        if not tensors:  # the same on every rank: the same parameters are frozen
            return {}
        now = fingerprints(tensors)
        changed = sorted(key for key, value in now.items() if self._prints.get(key) != value)
        count = float(len(changed))
        if self.ranks.sharded:  # every rank refuses together, or none does
            count = float(self.ranks.all_reduce_sum(np.array([count]))[0])
        if count:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            what = f"{changed[0]}{more}" if changed else "a frozen parameter of another rank"
            raise LayerCheckError(
                f"{what} changed since step {self._since} although it does not train "
                "(requires_grad False): no layer version holds it here, so a restore could "
                "not bring its new value back, and this step is not checkpointed: "
                f"{self.source.kept_advice}")
        return now

    def check(self, recorded: Mapping[str, str], step: int) -> None:
        """ModelMismatch unless each live tensor that the state of ``step`` recorded has
        the recorded fingerprint (``fingerprint.recomputed``), where this source holds
        it (``LayerSource.live``: not a ZeRO-3 rank's elements at another world size)."""
        for key, value in sorted(recorded.items()):
            tensor = self.source.live(key)
            found = recomputed(tensor, value) if tensor is not None else None
            if found is not None and found != value:
                raise ModelMismatch(
                    f"{key} is not the tensor the checkpoint of step {step} was trained with "
                    f"(fingerprint {found}, recorded {value}); no layer version holds it "
                    "(frozen under ZeRO), so a restore would keep this one: build the model "
                    "with the frozen weights that run used")


def trained_nbytes(tensors: Mapping[str, Any], frozen: Iterable[str]) -> int:
    """The bytes of a layer's tensors but its ``frozen`` parameters: what each of its
    versions after the full one writes (a write budget's size of the layer)."""
    skip = {tensor_key("param", name) for name in frozen}
    return sum(t.numel() * t.element_size() for key, t in tensors.items() if key not in skip)
