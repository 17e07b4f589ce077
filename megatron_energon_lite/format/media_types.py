"""Typed media metadata (Energon's ``megatron.energon.media.metadata`` names these classes).

``prepare --media-metadata-by-*`` stores one JSON row per media part in ``index.sqlite``
(:mod:`megatron_energon_lite.format.media_metadata` writes and reads the rows as dicts). These
classes are the typed view of a row: :class:`ImageMetadata` (Pillow's width, height, format and
mode) and :class:`AVMetadata` (durations, frame and sample counts, rates and sizes of the first
video and audio stream, ``None`` where unknown). :func:`serialize_media_metadata` and
:func:`deserialize_media_metadata` convert between them and the stored ``(type, json)`` pair.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from ..edataclass import edataclass
from ..errors import DatasetError, format_message
from .media_metadata import AV, IMAGE, extract_metadata

__all__ = [
    "AVMetadata",
    "ImageMetadata",
    "MediaMetadataBase",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "extract_media_metadata",
    "serialize_media_metadata",
]

T = TypeVar("T", bound="MediaMetadataBase")


class MediaMetadataType(str, enum.Enum):
    """The kind of a metadata row, as ``media_metadata.metadata_type`` stores it."""

    AV = AV
    IMAGE = IMAGE

    @classmethod
    def from_string(cls, value: str) -> MediaMetadataType:
        try:
            return cls(value)
        except ValueError:
            raise DatasetError(
                format_message(
                    "unknown media metadata type",
                    expected=" or ".join(repr(t.value) for t in cls),
                    found=repr(value),
                    fix="prepare the dataset again with this version",
                )
            ) from None


@edataclass
class MediaMetadataBase:
    """What every metadata payload shares: conversion to and from its JSON dict."""

    metadata_type: ClassVar[MediaMetadataType]

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set (``None`` fields are left out, as in the stored JSON)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls: type[T], payload: Mapping[str, Any]) -> T:  # noqa: PYI019 - typing.Self needs Python 3.11
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise DatasetError(
                format_message(
                    f"media metadata has fields {cls.__name__} does not know",
                    expected=", ".join(sorted(known)),
                    found=", ".join(unknown),
                    fix="prepare the dataset again with this version",
                )
            )
        return cls(**payload)


@edataclass
class AVMetadata(MediaMetadataBase):
    """A video or audio file: its first video stream and its first audio stream."""

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.AV

    video_duration: float | None = None
    video_num_frames: int | None = None
    video_fps: float | None = None
    video_width: int | None = None
    video_height: int | None = None

    audio_duration: float | None = None
    audio_channels: int | None = None
    audio_sample_rate: int | None = None
    audio_num_samples: int | None = None


@edataclass
class ImageMetadata(MediaMetadataBase):
    """An encoded image, as Pillow sees it."""

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.IMAGE

    width: int
    height: int
    format: str
    mode: str


_CLASSES: dict[MediaMetadataType, type[MediaMetadataBase]] = {
    MediaMetadataType.AV: AVMetadata,
    MediaMetadataType.IMAGE: ImageMetadata,
}


def serialize_media_metadata(metadata: MediaMetadataBase) -> tuple[MediaMetadataType, str]:
    """``(type, compact JSON)``, the two columns a row stores."""
    return metadata.metadata_type, json.dumps(metadata.to_dict(), separators=(",", ":"))


def deserialize_media_metadata(metadata_type: str | MediaMetadataType, metadata_json: str) -> MediaMetadataBase:
    """The typed metadata of a stored row."""
    kind = metadata_type if isinstance(metadata_type, MediaMetadataType) else MediaMetadataType.from_string(metadata_type)
    return _CLASSES[kind].from_dict(json.loads(metadata_json) if metadata_json else {})


def extract_media_metadata(metadata_type: str | MediaMetadataType, data: bytes) -> MediaMetadataBase:
    """Reads the metadata of an encoded image (``"image"``) or audio/video file (``"av"``)."""
    kind = metadata_type if isinstance(metadata_type, MediaMetadataType) else MediaMetadataType.from_string(metadata_type)
    return _CLASSES[kind].from_dict(extract_metadata(kind.value, data))
