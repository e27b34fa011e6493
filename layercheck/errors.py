"""The library's errors. Each message says what went wrong and what to do."""
from __future__ import annotations

__all__ = ["one_line", "LayerCheckError", "CheckpointNotFound", "ModelMismatch", "CorruptVersion",
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
