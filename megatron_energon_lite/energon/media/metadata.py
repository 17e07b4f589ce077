"""Energon's ``megatron.energon.media.metadata``: the core's typed media metadata
(:mod:`megatron_energon_lite.format.media_types`) under Energon's module name."""

from ...format.media_types import (
    AVMetadata,
    ImageMetadata,
    MediaMetadataBase,
    MediaMetadataType,
    deserialize_media_metadata,
    extract_media_metadata,
    serialize_media_metadata,
)

__all__ = [
    "AVMetadata",
    "ImageMetadata",
    "MediaMetadataBase",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "extract_media_metadata",
    "serialize_media_metadata",
]
