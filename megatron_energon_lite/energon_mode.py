"""Whether this process runs as Energon (``import megatron_energon_lite.as_energon``).

Where Energon's behaviour and ours differ on principle (it unpickles dataset parts and runs
dataset code without asking), the plain ``megatron_energon_lite`` import follows ours and raises
an error that names the opt-in, while the one-line switch follows Energon and logs once.
Forked dataloader workers inherit the flag with the rest of the process.
"""

from __future__ import annotations

import logging

__all__ = ["enable", "enabled", "log_once"]

logger = logging.getLogger(__name__)

_enabled = False
_logged: set[str] = set()


def enable() -> None:
    """Switches this process to Energon's behaviour (called by ``megatron_energon_lite.as_energon``)."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    """True once ``megatron_energon_lite.as_energon`` was imported in this process."""
    return _enabled


def log_once(key: str, message: str, *args: object) -> None:
    """Logs ``message`` (a warning) the first time ``key`` is seen in this process."""
    if key not in _logged:
        _logged.add(key)
        logger.warning(message, *args)
