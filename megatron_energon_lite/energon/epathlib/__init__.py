"""Energon's ``megatron.energon.epathlib``: :class:`EPath`, one path type for local and remote data."""

from .epath import DEFAULT_PROFILE_NAME, EPath

__all__ = ["DEFAULT_PROFILE_NAME", "EPath"]
