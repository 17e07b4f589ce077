"""Loader settings read from environment variables, checked, with an error that names the variable."""

from __future__ import annotations

import math
import os

from ..errors import ConfigError, format_message

__all__ = ["nonnegative_number"]


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
