"""The simulator's one error type: bad input, with a message that says the fix."""
from __future__ import annotations

__all__ = ["SimError"]


class SimError(ValueError):
    """A scenario, duration, strategy or failure log is invalid; the message says what to change.

    The CLI prints it as one line and exits with status 2."""
