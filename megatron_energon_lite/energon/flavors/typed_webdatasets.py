"""Energon's factory classes per sample type (``CaptioningWebdataset`` and the others).

Each is a :class:`StandardWebdatasetFactory` whose sample type is fixed by the class, as a
``dataset.yaml`` naming ``__class__: CaptioningWebdataset`` means.
"""

from __future__ import annotations

from typing import Any

from ...samples import (
    CaptioningSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
)
from .webdataset.default_decoder_webdataset import DefaultDecoderWebdatasetFactory

__all__ = [
    "CaptioningWebdataset",
    "ImageClassificationWebdataset",
    "ImageWebdataset",
    "InterleavedWebdataset",
    "MultiChoiceVQAWebdataset",
    "OCRWebdataset",
    "SimilarityInterleavedWebdataset",
    "TextWebdataset",
    "VQAOCRWebdataset",
    "VQAWebdataset",
    "VidQAWebdataset",
]


class _TypedWebdataset(DefaultDecoderWebdatasetFactory[Any]):
    """A decoded-parts factory whose class names the sample type."""


class CaptioningWebdataset(_TypedWebdataset):
    __sample_type__ = CaptioningSample


class ImageWebdataset(_TypedWebdataset):
    __sample_type__ = ImageSample


class ImageClassificationWebdataset(_TypedWebdataset):
    __sample_type__ = ImageClassificationSample


class InterleavedWebdataset(_TypedWebdataset):
    __sample_type__ = InterleavedSample


class MultiChoiceVQAWebdataset(_TypedWebdataset):
    __sample_type__ = MultiChoiceVQASample


class OCRWebdataset(_TypedWebdataset):
    __sample_type__ = OCRSample


class SimilarityInterleavedWebdataset(_TypedWebdataset):
    __sample_type__ = SimilarityInterleavedSample


class TextWebdataset(_TypedWebdataset):
    __sample_type__ = TextSample


class VidQAWebdataset(_TypedWebdataset):
    __sample_type__ = VidQASample


class VQAWebdataset(_TypedWebdataset):
    __sample_type__ = VQASample


class VQAOCRWebdataset(_TypedWebdataset):
    __sample_type__ = VQAOCRSample
