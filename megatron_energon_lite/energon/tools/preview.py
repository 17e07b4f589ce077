"""Energon's ``megatron.energon.tools.preview``: ``command`` is ``energon-lite preview``."""

from ...cli.preview import preview as command

__all__ = ["command"]
