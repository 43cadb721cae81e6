"""Re-exports for the seed article's imports (``from hybridflow.utils import RemoteRewardModel``); nothing is defined here."""
from __future__ import annotations

from .rewards.remote import RemoteRewardModel

__all__ = ["RemoteRewardModel"]
