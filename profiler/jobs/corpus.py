"""The training text: real English prose that ships with every CPython, so it is offline.

Two sources, both part of the Python installation that runs the profiler:

- ``pydoc_data.topics``: the Python Language Reference as ``help()`` shows it
  (79 topics, about 0.46 M characters of technical English);
- the docstrings (at least ``MIN_DOCSTRING`` characters) of the standard
  library's top-level modules, their classes and functions (about 0.7 M
  characters), parsed with ``ast`` (nothing is imported).

Documents are split deterministically: every ``EVAL_EVERY``-th document (in
a fixed order) is held out for evaluation. ``fingerprint`` names the exact
text (it changes with the Python version), and goes into every trace.
``load_corpus(part)`` gives one source alone (``PARTS``): the post-training
model (``profiler.posttrain``) is pretrained on one and fine-tuned on the other.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "load_corpus", "MIN_DOCSTRING", "EVAL_EVERY", "PARTS"]

MIN_DOCSTRING = 200
"""Shorter docstrings are mostly one-line summaries: little text, many fragments."""

EVAL_EVERY = 20
"""One document in twenty is held out (5%)."""

PARTS = {"all": "pydoc_data.topics (Python Language Reference) + standard-library docstrings "
                f">= {MIN_DOCSTRING} chars",
         "reference": "pydoc_data.topics (Python Language Reference)",
         "docstrings": f"standard-library docstrings >= {MIN_DOCSTRING} chars"}
"""The corpus's parts by name, and what each holds."""


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """Documents split into a training and a held-out part."""

    train: tuple[str, ...]
    heldout: tuple[str, ...]
    fingerprint: str
    """sha256 of all documents in order (first 16 hex digits)."""
    part: str = "all"
    """Which of ``PARTS``."""

    @property
    def chars(self) -> int:
        return sum(map(len, self.train)) + sum(map(len, self.heldout))

    def describe(self) -> dict[str, object]:
        return {"name": "python-docs" if self.part == "all" else f"python-docs-{self.part}",
                "text": (f"{PARTS[self.part]}, Python "
                         f"{sys.version_info.major}.{sys.version_info.minor}"),
                "documents": len(self.train) + len(self.heldout),
                "heldout_documents": len(self.heldout), "chars": self.chars,
                "sha256_16": self.fingerprint}


@functools.lru_cache(maxsize=None)
def load_corpus(part: str = "all") -> Corpus:
    """The corpus of this Python installation, or one of its ``PARTS`` (about 2 s with
    the docstrings: it parses the stdlib; once per process, the corpus is immutable)."""
    if part not in PARTS:
        raise ValueError(f"corpus part {part!r}: use one of {', '.join(PARTS)}")
    docs = [*(_reference_topics() if part != "docstrings" else []),
            *(_stdlib_docstrings() if part != "reference" else [])]
    digest = hashlib.sha256("\x00".join(docs).encode()).hexdigest()[:16]
    heldout = tuple(d for i, d in enumerate(docs) if i % EVAL_EVERY == EVAL_EVERY - 1)
    train = tuple(d for i, d in enumerate(docs) if i % EVAL_EVERY != EVAL_EVERY - 1)
    return Corpus(train=train, heldout=heldout, fingerprint=digest, part=part)


def _reference_topics() -> list[str]:
    from pydoc_data.topics import topics
    return [topics[key].strip() for key in sorted(topics)]


def _stdlib_docstrings() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue  # a few test-data files are deliberately broken
        docs.extend(_docstrings(tree))
    return docs


def _docstrings(tree: ast.Module) -> list[str]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds))
    return [doc for doc in found if doc and len(doc) >= MIN_DOCSTRING]
