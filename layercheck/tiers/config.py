"""TierConfig: where the memory tier lives, how much host memory it may take, which node it is on.

Importable without torch (the simulator and the dashboard read it).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from ..contract.config import ConfigError

__all__ = ["TierConfig", "NODE_ENV", "RACK_ENV"]

NODE_ENV = "LAYERCHECK_NODE"
"""The environment variable naming this process's node where ``TierConfig.node`` is None
(then the host name)."""
RACK_ENV = "LAYERCHECK_RACK"
"""The environment variable naming this process's rack where ``TierConfig.rack`` is None."""


@dataclass(frozen=True, kw_only=True)
class TierConfig:
    """The memory tier (and its buddy replica) over LayerCheck's durable tier.

    Every step, every layer's tensors and the training state go into files
    under ``folder`` (two slots: the newest committed step is never the one being
    written); with ``buddy``, each rank also sends its newest committed slot to a
    rank on another node, which keeps it under its own ``folder``. A restore takes
    each layer's freshest intact copy: this node's memory, the buddy's, storage.
    """

    folder: str | None = None
    """The memory tier's folder on this node: a tmpfs that outlives the training
    process (default: ``/dev/shm/layercheck-<hash of the checkpoint directory>/<node>``).
    Never a folder that dies with the process or its pod (a Pod-scoped emptyDir)."""

    budget_bytes: int = 8 << 30
    """Host memory the tier may take on this rank: two slots of its own shard, plus
    two of the shard it keeps for its ward (``buddy``). A job that needs more is
    refused at its first step, before anything is written (never an OOM)."""

    buddy: bool = True
    """Send each committed slot to a buddy rank on another node (a job with
    torch.distributed initialised and ranks on at least two nodes); ignored in one
    process."""

    node: str | None = None
    """This process's node (default: ``$LAYERCHECK_NODE``, else the host name). The
    buddy is never on the same node."""

    rack: str | None = None
    """This process's rack (default: ``$LAYERCHECK_RACK``, else none): where told,
    the buddy is placed on another rack when one exists."""

    timeout_s: float = 600.0
    """How long a buddy exchange or a restore's transfer may wait for its peer."""

    def __post_init__(self) -> None:
        if isinstance(self.budget_bytes, bool) or not isinstance(self.budget_bytes, int) \
                or self.budget_bytes <= 0:
            raise ConfigError(f"budget_bytes={self.budget_bytes!r} must be a positive integer "
                              "number of bytes (e.g. 8 << 30 for 8 GiB)")
        if not isinstance(self.buddy, bool):
            raise ConfigError(f"buddy={self.buddy!r}: use True or False")
        for name in ("folder", "node", "rack"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name}={value!r} must be a non-empty string, or None "
                                  "for the default")
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ConfigError(f"timeout_s={self.timeout_s!r} must be a positive number of seconds")

    def node_name(self) -> str:
        return self.node or os.environ.get(NODE_ENV) or os.uname().nodename

    def rack_name(self) -> str | None:
        return self.rack or os.environ.get(RACK_ENV) or None

    def folder_for(self, url: str) -> str:
        """The folder this node's tier uses for the checkpoint directory ``url``."""
        if self.folder is not None:
            return self.folder
        key = hashlib.sha1(url.encode()).hexdigest()[:12]
        return os.path.join("/dev/shm", f"layercheck-{key}", self.node_name())
