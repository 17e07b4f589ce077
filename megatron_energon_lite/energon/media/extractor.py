"""Which parts are media, and their metadata: Energon's ``megatron.energon.media.extractor``.

:class:`MediaFilterConfig` is the filter ``prepare`` takes (``--media-metadata-by-extension``,
``--media-metadata-by-glob PATTERNS`` or ``--media-metadata-by-header``); it is this package's
:class:`~megatron_energon_lite.format.media_metadata.MediaFilter` with Energon's names, so it can
be passed wherever a ``MediaFilter`` is expected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import IO

from ...errors import ConfigError, format_message
from ...format.media_metadata import MediaFilter, MediaStrategy
from ..epathlib import EPath
from .metadata import MediaMetadataBase, extract_media_metadata

__all__ = ["MediaFilterConfig", "MediaFilterStrategy", "SourceData"]

logger = logging.getLogger(__name__)

#: How media parts are recognised: ``EXTENSION``, ``GLOB`` or ``HEADER``.
MediaFilterStrategy = MediaStrategy

#: What :meth:`MediaFilterConfig.extract_metadata` reads: bytes, a path or a binary file.
SourceData = bytes | str | os.PathLike | IO[bytes]


@dataclasses.dataclass(frozen=True)
class MediaFilterConfig(MediaFilter):
    """A media filter built the Energon way: ``MediaFilterConfig(strategy=..., patterns=[...])``."""

    def __post_init__(self) -> None:
        if isinstance(self.patterns, str):
            object.__setattr__(self, "patterns", tuple(p.strip() for p in self.patterns.split(",") if p.strip()))
        elif not isinstance(self.patterns, tuple):
            object.__setattr__(self, "patterns", tuple(self.patterns))
        if not isinstance(self.strategy, MediaStrategy):
            object.__setattr__(self, "strategy", MediaStrategy(self.strategy))

    @classmethod
    def parse(cls, glob: str | None, header: bool, extension: bool) -> MediaFilterConfig:
        """The filter of exactly one of the three ``--media-metadata-by-*`` options."""
        chosen = MediaFilter.from_options(glob=glob or None, header=header, extension=extension)
        if chosen is None:
            raise ConfigError(
                format_message(
                    "no media filter chosen",
                    expected="one of --media-metadata-by-extension, --media-metadata-by-glob, --media-metadata-by-header",
                    fix="several glob patterns go into one option, separated by commas",
                )
            )
        return cls(strategy=chosen.strategy, patterns=chosen.patterns)

    def should_consider_all(self) -> bool:
        """Whether every part must be read to decide (only by header)."""
        return self.strategy is MediaStrategy.HEADER

    def should_consider_media(self, name: str) -> bool:
        """Whether a part of this name may be media (checked before its bytes are read)."""
        return self.wants(name)

    def extract_metadata(self, source: SourceData, filename: str | None = None) -> MediaMetadataBase | None:
        """The metadata of one part, or None when it is not media under this filter or cannot be parsed."""
        if isinstance(source, bytes):
            data = source
        elif isinstance(source, (str, os.PathLike)) or hasattr(source, "read_bytes"):
            path = source if isinstance(source, EPath) else EPath(source)
            data, filename = path.read_bytes(), filename or path.name
        else:
            data = source.read()
        name = filename or ""
        media_type = self.media_type(name, data)
        if media_type is None:
            return None
        try:
            return extract_media_metadata(media_type, data)
        except Exception as exc:  # noqa: BLE001 - a part that does not parse gets no metadata, as in Energon
            logger.warning("no %s metadata for %r: %s: %s", media_type, name, type(exc).__name__, exc)
            return None
