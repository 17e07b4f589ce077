"""Loader settings read from environment variables, checked, with an error that names the variable."""

from __future__ import annotations

import math
import os

from ..errors import ConfigError, format_message
from ..policy import env_flag

__all__ = ["WEIGHT_EDIT_ENV", "nonnegative_number", "weight_edit_allowed"]

#: Set to 1 to restore states into a blend whose weights or datasets changed (``reweight.py``),
#: for programs that call ``restore_state_rank(state)`` without ``allow_weight_edit``.
WEIGHT_EDIT_ENV = "ENERGON_LITE_ALLOW_WEIGHT_EDIT"


def weight_edit_allowed(argument: bool | None) -> bool:
    """The ``allow_weight_edit`` argument of a restore, else (None) the environment's flag."""
    if argument is None:
        return env_flag(WEIGHT_EDIT_ENV)
    if not isinstance(argument, bool):
        raise ConfigError(format_message("allow_weight_edit must be True, False or None", found=repr(argument)[:80], fix=f"pass True to allow, or leave it None to read {WEIGHT_EDIT_ENV}"))
    return argument


def nonnegative_number(name: str, default: float, *, unit: str, zero_means: str) -> float:
    """The finite number >= 0 in the environment variable ``name`` (``default`` when unset or
    empty); anything else is a :class:`ConfigError` that says what ``unit`` it takes and what 0
    does."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):  # also NaN
        raise ConfigError(format_message(f"{name} must be a finite number of {unit} >= 0", found=repr(raw), fix=f"unset it (default {default:g}) or set 0 to {zero_means}"))
    return value
