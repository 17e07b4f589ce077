"""Energon's ``media.filesystem_prepare``: media metadata for a plain folder (``aux:`` sources),
not supported yet (it belongs with auxiliary data)."""

from __future__ import annotations

from typing import Any

from ..errors import NotSupportedError, format_message

__all__ = ["prepare_filesystem_dataset"]


def prepare_filesystem_dataset(root: Any, *args: Any, **kwargs: Any) -> Any:
    """Energon: scans the media files under ``root`` and stores their metadata."""
    raise NotSupportedError(
        format_message(
            "media metadata for a plain folder (prepare-media) is not supported yet",
            where=str(root),
            fix="media metadata of prepared tar datasets works: energon-lite prepare --media-metadata-by-extension; folders come with auxiliary data",
        )
    )
