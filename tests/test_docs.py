"""docs/ as reference: pages a reader can take in, links that land, and the change
recipes of docs/architecture.md naming files that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 500
"""A page longer than this is split by topic; the history of runs lives in results.md."""
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in page.read_text().splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = _slug(heading.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        found.update(re.findall(r'<a id="([^"]+)"', line))
    return found


def test_every_page_is_under_the_limit():
    long = {p.name: n for p in PAGES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by topic (at most {MAX_LINES} lines a page): {long}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_lands(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: links that land nowhere: {broken}"


def test_every_docs_page_the_code_names_exists():
    named = set()
    for folder in ("layercheck", "profiler", "sim", "dashboard", "benchmarks", "tools", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            named.update(re.findall(r"docs/([\w.-]+\.md)", path.read_text()))
    assert sorted(n for n in named if not (ROOT / "docs" / n).exists()) == []


RECIPE_EXAMPLES = {"<name>": "jit", "<module>": "twophase", "<backend>": "fsdp", "<format>": "dcp"}
"""What each recipe's placeholder is for a change already made (docs/architecture.md)."""


def _recipes() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## What a change touches")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_file_a_recipe_names_exists():
    section = _recipes()
    paths = set(re.findall(r"`((?:[\w<>.-]+/)+[\w<>.-]+\.py)`", section))
    assert len(paths) >= 20, paths
    missing = []
    for path in sorted(paths):
        for placeholder, example in RECIPE_EXAMPLES.items():
            path = path.replace(placeholder, example)
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"docs/architecture.md's recipes name files the code lacks: {missing}"


def test_every_recipe_counts_its_files():
    """A recipe's bold line states its count; its numbered list ends there."""
    section = _recipes()
    blocks = re.split(r"\n(?=\*\*)", section)[1:]
    checked = 0
    for block in blocks:
        head = block.split("\n\n", 1)[0]
        stated = re.search(r"\((\d+)(?: at most)?\)", head) or re.search(r"(\d+) files", head)
        numbers = [int(n) for n in re.findall(r"^(\d+)\. ", block, re.M)]
        if stated and numbers:
            assert max(numbers) == int(stated.group(1)), head
            checked += 1
    assert checked >= 5
