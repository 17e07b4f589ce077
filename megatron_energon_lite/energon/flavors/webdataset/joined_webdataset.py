"""Energon's ``JoinedWebdatasetFactory``: several datasets joined by sample key (``join:``)."""

from __future__ import annotations

from typing import Any, TypeVar

from ....errors import NotSupportedError, format_message
from .base_webdataset import BaseWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["JoinedWebdatasetFactory"]


class JoinedWebdatasetFactory(BaseWebdatasetFactory[T_sample]):
    """The factory of a ``join:`` of a metadataset (made by the loader from the metadataset)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(
            format_message(
                "JoinedWebdatasetFactory cannot be built directly here",
                fix="describe the join in a metadataset (splits: train: join: [...]) and load it with get_train_dataset / load_dataset",
            )
        )
