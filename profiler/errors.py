"""The profiler's one error type: bad input, with a message that says the fix."""
from __future__ import annotations

__all__ = ["ProfilerError"]


class ProfilerError(ValueError):
    """A bad option, model or path. The CLI prints the message on one line and exits 2."""
