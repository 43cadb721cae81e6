"""Reward sources beyond the engines' own (rule functions, local reward models): the remote HTTP reward model."""
from __future__ import annotations

from .remote import REQUEST_FORMATS, RemoteRewardModel, parse_scores

__all__ = ["RemoteRewardModel", "REQUEST_FORMATS", "parse_scores"]
