"""Energon's ``megatron.energon.tools.checkpoint``: ``command`` is the ``energon-lite checkpoint``
group, ``command_redist`` and ``command_info`` its ``redist`` and ``info`` subcommands."""

from ...cli.checkpoint import checkpoint as command
from ...cli.checkpoint import info as command_info
from ...cli.checkpoint import redist as command_redist

__all__ = ["command", "command_info", "command_redist"]
