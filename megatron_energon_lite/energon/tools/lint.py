"""Energon's ``megatron.energon.tools.lint``: ``command`` is ``energon-lite lint``."""

from ...cli.lint import lint as command

__all__ = ["command"]
