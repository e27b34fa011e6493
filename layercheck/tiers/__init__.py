"""The tiers over LayerCheck's durable directory: memory (this node), buddy (another node), storage.

``TierConfig`` (torch-free) is what a user passes: ``LayerCheck(..., tiers=TierConfig())``.
``tiered.Tiers`` is what the LayerCheck then holds; ``memory`` and ``slots`` the memory
tier, ``buddy`` the replica on another node, ``choice`` which copy a restore takes,
``inventory`` what an offline reader (``python -m layercheck plan``) sees.
"""
from __future__ import annotations

from .config import TierConfig

__all__ = ["TierConfig"]
