"""Schemas of JSON objects: which fields an object holds, of what type and range. Torch-free.

A ``Schema`` maps field names to ``Field`` checks; ``Schema.problem(obj)`` is the
first thing wrong with an object, as one line naming the field, the value (cut
short) and what it must be, or None. Keys a schema does not name are allowed:
readers ignore them. The manifest's record schemas are built from these
(``format.RECORD_SCHEMAS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Field", "Schema", "expect", "integer", "number", "table", "obj", "deeper_than",
           "shown"]


@dataclass(frozen=True)
class Field:
    """One field: ``check(value)`` says what is wrong with a value (None: nothing);
    ``required``: the field must be present."""

    check: Callable[[Any], str | None]
    required: bool = True


def expect(ok: Callable[[Any], bool], needs: str, *, required: bool = True,
           null: bool = False) -> Field:
    """A field whose values satisfy ``ok``, ``needs`` saying what that is; ``null``: or null."""
    return Field(lambda v: None if (null and v is None) or ok(v)
                 else f"{needs}{', or null' if null else ''} is required", required)


def integer(low: int, high: int, needs: str, **kw: Any) -> Field:
    """An integer from ``low`` to ``high`` (never a bool, never a float)."""
    return expect(lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high,
                  needs, **kw)


def number(*, positive: bool, **kw: Any) -> Field:
    """A finite number, > 0 (``positive``) or >= 0 (never a bool; a numpy float is a float)."""
    return expect(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                  and math.isfinite(v)
                  and (v > 0 if positive else v >= 0),
                  f"a finite number {'> 0' if positive else '>= 0'}", **kw)


@dataclass(frozen=True)
class Schema:
    """The fields of one kind of object, each checked where present (and required
    where ``required``). ``variants``: the object also holds the fields of the
    first variant any of whose keys it has, else of the last."""

    fields: Mapping[str, Field]
    variants: tuple[Mapping[str, Field], ...] = ()

    def problem(self, value: Mapping[str, Any]) -> str | None:
        """What is wrong with ``value`` (an object), the first thing found; None if nothing."""
        fields = dict(self.fields)
        if self.variants:
            fields.update(next((v for v in self.variants if v.keys() & value.keys()),
                               self.variants[-1]))
        for name, field in fields.items():
            if name not in value:
                if field.required:
                    return f"{name} is missing"
                continue
            wrong = field.check(value[name])
            if wrong is not None:
                return f"{name}={shown(value[name])}: {wrong}"
        return None


def table(schema: Schema, needs: str, *, distinct: str | None = None) -> Field:
    """A non-empty list of objects of ``schema`` (``needs`` names them); ``distinct``: a
    field whose values differ from entry to entry."""
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or not value:
            return f"a non-empty list of {needs} is required"
        for i, entry in enumerate(value):
            wrong = schema.problem(entry) if isinstance(entry, dict) else "not an object"
            if wrong is not None:
                return f"entry {i}: {wrong}"
        if distinct is not None and len({entry[distinct] for entry in value}) < len(value):
            return f"two entries have the same {distinct}"
        return None
    return Field(check)


def obj(schema: Schema, **kw: Any) -> Field:
    """An object of ``schema``."""
    return Field(lambda v: "an object is required" if not isinstance(v, dict)
                 else schema.problem(v), **kw)


def deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects in ``value`` nest more than ``limit`` deep. Without
    recursion: a hostile value may nest deeper than the interpreter's stack."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > limit:
                return True
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return False


def shown(value: Any) -> str:
    """``repr(value)``, cut short for a one-line message: a hostile value may be
    megabytes long."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
