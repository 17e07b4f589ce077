"""Whether this process runs as Energon (``import megatron_energon_lite.as_energon``).

Where Energon's behaviour and ours differ on principle (it unpickles dataset parts and runs
dataset code without asking), the plain ``megatron_energon_lite`` import follows ours and raises
an error that names the opt-in, while the one-line switch follows Energon and logs once.
Forked dataloader workers inherit the flag with the rest of the process.
"""

from __future__ import annotations

import logging
import os

__all__ = ["disable", "enable", "enabled", "env_flag", "log_once", "opted_in"]

logger = logging.getLogger(__name__)

_enabled = False
_logged: set[str] = set()


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


def log_once(key: str, message: str, *args: object) -> None:
    """Logs ``message`` (a warning) the first time ``key`` is seen in this process."""
    if key not in _logged:
        _logged.add(key)
        logger.warning(message, *args)


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1, true, yes or on (any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def opted_in(env_var: str, log_key: str | None = None, what: str = "") -> bool:
    """Whether the caller opted in without an argument: ``env_var`` is set, or Energon mode is on.

    Read on every call, so setting the variable after import works. With ``log_key``, the first
    opt-in per key logs which one applied and ``what`` it allows (nobody asked for it in the call).
    """
    if env_flag(env_var):
        if log_key is not None:
            log_once(f"{log_key}:env", "%s is set: %s", env_var, what)
        return True
    if enabled():
        if log_key is not None:
            log_once(f"{log_key}:energon", "%s, as Energon does (import megatron_energon_lite.as_energon)", what)
        return True
    return False
