"""Energon's ``megatron.energon.tools.analyze_debug``: ``command`` is ``energon-lite analyze-debug``."""

from ...cli.analyze_debug import analyze_debug as command

__all__ = ["command"]
