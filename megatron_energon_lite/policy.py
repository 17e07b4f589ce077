"""What differs when a loader runs as Energon (``import megatron_energon_lite.as_energon``).

Where Energon's behaviour and ours differ on principle (it unpickles dataset parts, runs dataset
code and reads shards listed outside the dataset folder without asking, and restores a state into
a loader with another task encoder, decoder or micro batch size), the plain import follows ours
and raises an error that names the opt-in, while the one-line switch follows Energon and logs
once.  A :class:`Policy` says which: ``loader/api.py`` decides it once, when it plans a dataset,
from the switch's state (``energon_mode.py``); the spec carries it, and the code that reads
metadata, dataset code, pickles or states is handed it.  Code called without one follows ours
(:data:`PLAIN`).  The environment variables opt in whatever the policy (read on every call, so
setting one after import works).
"""

from __future__ import annotations

import dataclasses
import logging
import os

__all__ = ["ENERGON", "PLAIN", "Policy", "env_flag", "log_once"]

# The name users configure, unchanged since these messages came from energon_mode.py.
logger = logging.getLogger("megatron_energon_lite.energon_mode")

# Process-wide, not per run: a message is logged once per kind in a process, whichever loader
# gave it.
_logged: set[str] = set()


def log_once(key: str, message: str, *args: object) -> None:
    """Logs ``message`` (a warning) the first time ``key`` is seen in this process."""
    if key not in _logged:
        _logged.add(key)
        logger.warning(message, *args)


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1, true, yes or on (any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Policy:
    """Our behaviour (:data:`PLAIN`) or Energon's where they differ on principle (:data:`ENERGON`)."""

    #: Energon's behaviour: the opt-ins are granted (each logged once), and a state restores into
    #: a loader with another task encoder, decoder or micro batch size.
    as_energon: bool = False

    def opted_in(self, env_var: str, log_key: str | None = None, what: str = "") -> bool:
        """Whether the caller opted in without an argument: ``env_var`` is set, or this policy
        is Energon's.  With ``log_key``, the first opt-in per key logs which one applied and
        ``what`` it allows (nobody asked for it in the call)."""
        if env_flag(env_var):
            if log_key is not None:
                log_once(f"{log_key}:env", "%s is set: %s", env_var, what)
            return True
        if self.as_energon:
            if log_key is not None:
                log_once(f"{log_key}:energon", "%s, as Energon does (import megatron_energon_lite.as_energon)", what)
            return True
        return False


#: This package's own behaviour.
PLAIN = Policy()
#: Energon's, under ``import megatron_energon_lite.as_energon``.
ENERGON = Policy(as_energon=True)
