"""Where a sample came from: :class:`SourceInfo` (Energon's ``megatron.energon.source_info``).

Every sample carries ``__sources__``, a tuple of :class:`SourceInfo` (one per dataset a joined
sample was read from). :func:`get_source_info` reads them from a sample, a crude dict or a list
of either; :func:`add_source_info` appends to them.
"""

from __future__ import annotations

from typing import Any

from .samples import SourceInfo

__all__ = ["SourceInfo", "add_source_info", "get_source_info"]


def add_source_info(sample: Any, *source_infos: SourceInfo) -> Any:
    """Appends ``source_infos`` to ``sample.__sources__`` (or ``sample["__sources__"]``); returns ``sample``."""
    if isinstance(sample, dict):
        sample["__sources__"] = (*(sample.get("__sources__") or ()), *source_infos)
    elif hasattr(sample, "__sources__"):
        sample.__sources__ = (*(sample.__sources__ or ()), *source_infos)
    return sample


def _sources_of(item: Any) -> tuple:
    if isinstance(item, dict):
        return tuple(item.get("__sources__") or ())
    return tuple(getattr(item, "__sources__", None) or ())


def get_source_info(sample: Any) -> list[SourceInfo] | None:
    """The sources of a sample, a crude dict, or every member of a list of them; None if there are none."""
    members = sample if isinstance(sample, list) else [sample]
    found = [source for member in members for source in _sources_of(member)]
    return found or None
