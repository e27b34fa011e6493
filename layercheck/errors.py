"""The library's errors. Each message says what went wrong and what to do. Torch-free."""
from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["one_line", "OneLineParser", "LayerCheckError", "CheckpointNotFound", "ModelMismatch", "CorruptVersion",
           "WriteFailed", "DirectoryLocked"]


class LayerCheckError(RuntimeError):
    """Base class of every error layercheck raises on purpose."""


class CheckpointNotFound(LayerCheckError):
    """The directory holds no layercheck checkpoint, or none at the asked step."""


class ModelMismatch(LayerCheckError):
    """The checkpoint was written for a model with other layers or shapes."""


class CorruptVersion(LayerCheckError):
    """A layer version failed its checksum or could not be parsed."""


class WriteFailed(LayerCheckError):
    """A background write failed; nothing of it was committed."""


class DirectoryLocked(LayerCheckError):
    """Another process holds the checkpoint directory."""


def one_line(text: str) -> str:
    """``text`` with line breaks escaped, for the project's one-line CLI errors: an
    echoed argument or path may hold one. Torch-free, shared by every CLI."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class OneLineParser(argparse.ArgumentParser):
    """argparse for the project's command lines: a bad argument is one line on
    stderr (``<prog>: error: <message> (see --help)``, line breaks escaped) and
    exit status 2, without the usage block. Pass it on as ``parser_class`` to
    ``add_subparsers`` so that subcommands answer alike."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")
