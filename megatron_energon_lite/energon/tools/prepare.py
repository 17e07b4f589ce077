"""Energon's ``megatron.energon.tools.prepare``: ``command`` is ``energon-lite prepare``."""

from ...cli.prepare import prepare as command

__all__ = ["command"]
