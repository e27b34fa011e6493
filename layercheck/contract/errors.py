"""The library's errors. Each message says what went wrong and what to do. Torch-free."""
from __future__ import annotations

import argparse
import os
import select
import sys
from typing import NoReturn

__all__ = ["retryable", "one_line", "OneLineParser", "stdout_gone", "LayerCheckError", "CheckpointNotFound", "ModelMismatch", "CorruptVersion",
           "WriteFailed", "ReadFailed", "RestoreIncomplete", "TimelineNotRecorded", "DirectoryLocked",
           "NotARegularFile"]


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


class ReadFailed(LayerCheckError):
    """Reading a committed file failed with an I/O error: not damage, so nothing was
    passed over in its favour; try again once the storage answers."""


class RestoreIncomplete(LayerCheckError):
    """A restore failed after it had begun copying layers in (a file read again at
    the apply failed for good): the message names the layers that hold the
    checkpoint's values and those that still hold their own; ``restore()`` again
    completes it. Nothing in the directory changed."""

    @classmethod
    def copying(cls, url: str, step: int, cause: object, done: list[str],
                left: list[str]) -> "RestoreIncomplete":
        """Copying step ``step`` in stopped at ``cause``: ``done`` layers hold it, ``left``
        their own."""
        return cls(f"restore of step {step} stopped while copying it in: {cause}. The weights "
                   f"and optimizer state of {len(done)} layers now hold step {step}'s versions "
                   f"({', '.join(done)}); {len(left)} layers still hold their own "
                   f"({', '.join(left)}); the optimizer's hyper-parameters, the LR scheduler, "
                   f"the RNGs and {url} are unchanged. (A model this large is not copied aside "
                   "first: that takes the memory that reading files again saves.) Train "
                   "nothing from this state: call restore() again once the storage answers; it "
                   "starts over and copies every layer (step() refuses until then)")

    @classmethod
    def elsewhere(cls, step: int) -> "RestoreIncomplete":
        """What a rank whose own copy succeeded raises when another's failed."""
        return cls(f"another rank failed while copying step {step} in (its error names the "
                   f"layers it holds); this rank's model, optimizer, scheduler and RNGs hold "
                   f"step {step}: call restore() again on every rank once the storage answers")


class TimelineNotRecorded(LayerCheckError):
    """A restore could not record its new timeline (the ``resume`` record, written
    after the apply so that a failed restore abandons nothing): the live objects hold
    the restored step (or, starting at 0, are untouched), the directory is as it
    was; ``restore()`` again once the storage takes writes."""

    @classmethod
    def at(cls, url: str, step: int, cause: object, applied: bool) -> "TimelineNotRecorded":
        """``url``'s record of the timeline starting at ``step`` failed with ``cause``;
        ``applied``: a restore of ``step`` was copied into the live objects."""
        held = (f"the model, optimizer, scheduler and RNGs hold step {step} completely, as "
                "a restore leaves them" if applied else "nothing was restored")
        return cls(f"{url}: the manifest could not record the timeline that starts at step "
                   f"{step} ({cause}): {held}; the directory is as it was. Free space or fix "
                   "the storage, then call restore() again before training (it restores the "
                   "same step and records it; step() refuses until then)")


class DirectoryLocked(LayerCheckError):
    """Another process, or another open LayerCheck of this one, holds the checkpoint directory."""


class NotARegularFile(LayerCheckError):
    """A symbolic link, FIFO, device or folder stands where the checkpoint has a regular
    file; layercheck neither follows nor reads it."""


def retryable(exc: BaseException) -> bool:
    """Whether a failed write may succeed if tried again: a storage error (OSError: a
    full disk, a lost mount) or a peer rank's (WriteFailed). Anything else fails the
    same way at every try; ``on_error="warn"`` retries only what this says."""
    return isinstance(exc, (OSError, WriteFailed))


def one_line(text: str) -> str:
    """``text`` with line breaks escaped, for the project's one-line CLI errors: an
    echoed argument or path may hold one. Torch-free, shared by every CLI."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def stdout_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to stdout whose reader went away (``cmd | head -1``,
    ``cmd | true``): then a command stops quietly with exit status 0, as a pipeline
    expects. It first points stdout at /dev/null, so that the interpreter's last
    flush has nowhere left to fail (Python's recipe for SIGPIPE). False for any
    other error, a broken pipe elsewhere (a remote store's connection) included:
    stdout must be a pipe that polls as having no reader. Shared by every CLI."""
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR is reported whatever the mask: a pipe without reader
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no stdout descriptor, or no poll()
        return False
    return True


class OneLineParser(argparse.ArgumentParser):
    """argparse for the project's command lines: a bad argument is one line on
    stderr (``<prog>: error: <message> (see --help)``, line breaks escaped) and
    exit status 2, without the usage block. Pass it on as ``parser_class`` to
    ``add_subparsers`` so that subcommands answer alike."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")
