"""IterMapDataset: not supported yet (its outputs have no restore keys here)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, format_message

__all__ = ["IterMapDataset"]


class IterMapDataset:
    """Energon's ``IterMapDataset`` (a function from an iterator of samples to an iterator of
    outputs). Not supported yet: constructing one raises a :class:`ConfigError` that says what to
    use instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            format_message(
                "IterMapDataset is not supported by megatron_energon_lite yet",
                fix="use MapDataset with a generator function (one input, 0..n outputs), PackingDataset to combine "
                "several samples into one, or GroupBatchDataset / BatchDataset to group them",
            )
        )
