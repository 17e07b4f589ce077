"""Loader settings read from environment variables, checked, with an error that names the variable."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError, format_message
from ..policy import env_flag

__all__ = ["DATA_CHANGE_ENV", "JOIN_NEW_SHARDS_ENV", "SKIPS_ENV", "WEIGHT_EDIT_ENV", "nonnegative_number", "opt_in", "skips_from_env", "weight_edit_allowed"]

#: Set to 1 to restore states into a blend whose weights or datasets changed (``reweight.py``),
#: for programs that call ``restore_state_rank(state)`` without ``allow_weight_edit``.
WEIGHT_EDIT_ENV = "ENERGON_LITE_ALLOW_WEIGHT_EDIT"
#: Set to 1 to let shards appended since the save join the running epoch (``changed_data.py``),
#: for programs that call ``restore_state_rank(state)`` without ``join_new_shards``.
JOIN_NEW_SHARDS_ENV = "ENERGON_LITE_JOIN_NEW_SHARDS"
#: Set to 1 to restore states into data whose shards changed, vanished or moved since the save,
#: continuing by shard (``changed_data.py``), for programs that cannot pass ``allow_data_change``.
DATA_CHANGE_ENV = "ENERGON_LITE_ALLOW_DATA_CHANGE"


def opt_in(argument: bool | None, name: str, env: str) -> bool:
    """A restore's opt-in argument ``name``, else (None) the environment's flag ``env``."""
    if argument is None:
        return env_flag(env)
    if not isinstance(argument, bool):
        raise ConfigError(format_message(f"{name} must be True, False or None", found=repr(argument)[:80], fix=f"pass True to allow, or leave it None to read {env}"))
    return argument


def weight_edit_allowed(argument: bool | None) -> bool:
    """The ``allow_weight_edit`` argument of a restore, else (None) the environment's flag."""
    return opt_in(argument, "allow_weight_edit", WEIGHT_EDIT_ENV)


#: A JSON file with a skip list for code that cannot pass ``skip_samples`` (``sample_skips.py``).
SKIPS_ENV = "ENERGON_LITE_SKIP_SAMPLES"


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


def skips_from_env() -> tuple[list[Any], bool] | None:
    """``(entries, ignore_unknown)`` of the file ``ENERGON_LITE_SKIP_SAMPLES`` names (a JSON list
    of entries, or ``{"samples": [...], "ignore_unknown": bool}``); None when unset."""
    path = os.environ.get(SKIPS_ENV, "").strip()
    if not path:
        return None
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(format_message(f"{SKIPS_ENV} names a file that cannot be read as JSON", where=path, found=f"{type(exc).__name__}: {exc}", fix="point it at a JSON list of samples to skip, or unset it")) from exc
    if isinstance(value, dict) and isinstance(value.get("samples"), list):
        return value["samples"], bool(value.get("ignore_unknown", False))
    if isinstance(value, list):
        return value, False
    raise ConfigError(format_message(f"{SKIPS_ENV}: the file holds no skip list", where=path, expected='a JSON list of samples, or {"samples": [...], "ignore_unknown": false}', found=type(value).__name__))
