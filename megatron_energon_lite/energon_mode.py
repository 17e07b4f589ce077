"""Whether this process runs as Energon (``import megatron_energon_lite.as_energon``): the switch's flag.

``loader/api.py`` reads it once when it plans a dataset and hands the loader a
:class:`~megatron_energon_lite.policy.Policy` (``policy.py`` says what differs); nothing below
reads the flag.  Forked dataloader workers inherit it with the rest of the process.
"""

from __future__ import annotations

from .policy import ENERGON, PLAIN, Policy

__all__ = ["current_policy", "disable", "enable", "enabled"]

# Process-wide, not per run: the switch is imported once for the whole program.
_enabled = False


def enable() -> None:
    """Switches this process to Energon's behaviour (called by ``megatron_energon_lite.as_energon``)."""
    global _enabled
    _enabled = True


def disable() -> None:
    """Back to this package's own behaviour (``megatron_energon_lite.as_energon.uninstall()``)."""
    global _enabled
    _enabled = False


def enabled() -> bool:
    """True once ``megatron_energon_lite.as_energon`` was imported in this process."""
    return _enabled


def current_policy() -> Policy:
    """The policy of a dataset planned now: Energon's under the switch, else ours."""
    return ENERGON if _enabled else PLAIN
