"""Fixed-width text tables that fit a terminal: ``python -m sim``'s every table.

    print(render([Column("strategy", 15, left=True), Column("ratio", 7)], rows))

A table wider than ``width`` (default ``WIDTH``, 100 columns) is printed in blocks
of columns, each block repeating the first ``keep`` columns (the row's name), as
pandas prints a wide frame; ``width=None`` prints every column on one line (the
commands' ``--wide``). Cells arrive formatted; a row shorter than the header leaves
its last cells blank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["WIDTH", "Column", "render"]

WIDTH = 100
"""The columns a table may take by default: a terminal's 80 to 120, a pasted log's."""


@dataclass(frozen=True)
class Column:
    """One column: its header, its least width, and its alignment (right unless ``left``)."""

    header: str
    width: int = 0
    left: bool = False

    def cell(self, text: str, width: int) -> str:
        return f"{text:<{width}}" if self.left else f"{text:>{width}}"


def render(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, keep: int = 1,
           width: int | None = WIDTH) -> str:
    """The table of ``rows`` under ``columns``: a header, a rule, a line a row; in blocks
    of at most ``width`` characters (module doc), the first ``keep`` columns in each."""
    sizes = [max([c.width, len(c.header), *(len(r[i]) for r in rows if i < len(r))])
             for i, c in enumerate(columns)]
    blocks = _blocks(sizes, keep, width)
    out = []
    for block in blocks:
        chosen = [*range(keep), *block]
        head = " ".join(columns[i].cell(columns[i].header, sizes[i]) for i in chosen).rstrip()
        lines = [head, "-" * len(head)]
        for row in rows:
            cells = [columns[i].cell(row[i] if i < len(row) else "", sizes[i]) for i in chosen]
            lines.append(" ".join(cells).rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _blocks(sizes: list[int], keep: int, width: int | None) -> list[list[int]]:
    """The columns after the first ``keep``, cut into runs that fit ``width`` beside them
    (a column too wide for any block gets one of its own)."""
    rest = list(range(keep, len(sizes)))
    if width is None or not rest:
        return [rest]
    base = sum(sizes[:keep]) + keep - 1
    blocks: list[list[int]] = [[]]
    used = base
    for i in rest:
        if blocks[-1] and used + 1 + sizes[i] > width:
            blocks.append([])
            used = base
        blocks[-1].append(i)
        used += 1 + sizes[i]
    return blocks
