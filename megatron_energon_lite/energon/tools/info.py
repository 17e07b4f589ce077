"""Energon's ``megatron.energon.tools.info``: ``command`` is ``energon-lite info``."""

from ...cli.info import info as command

__all__ = ["command"]
