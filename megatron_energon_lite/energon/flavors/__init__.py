"""Energon's ``megatron.energon.flavors``: dataset factories and sample types by flavor.

The sample types live in :mod:`megatron_energon_lite.samples`; they are here under Energon's names.
"""

from ...samples import (
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQASample,
)
from ..wrappers.base import SavableDataset
from .base_dataset import BaseCoreDatasetFactory, PinMemoryMixin
from .crude import CrudeWebdataset
from .jsonl import CrudeJsonlDatasetFactory, DefaultCrudeJsonlDatasetFactory
from .typed_webdatasets import (
    CaptioningWebdataset,
    ImageClassificationWebdataset,
    ImageWebdataset,
    InterleavedWebdataset,
    MultiChoiceVQAWebdataset,
    OCRWebdataset,
    SimilarityInterleavedWebdataset,
    TextWebdataset,
    VidQAWebdataset,
    VQAOCRWebdataset,
    VQAWebdataset,
)
from .webdataset import (
    AVData,
    AVDecoder,
    BaseWebdatasetFactory,
    DefaultDecoderWebdatasetFactory,
    DefaultGenericWebdatasetFactory,
    EmptyDatasetError,
    JoinedWebdatasetFactory,
    SampleDecoder,
    StandardWebdatasetFactory,
)

__all__ = [
    "AVData",
    "AVDecoder",
    "BaseCoreDatasetFactory",
    "BaseWebdatasetFactory",
    "CaptioningSample",
    "CaptioningWebdataset",
    "CrudeJsonlDatasetFactory",
    "CrudeSample",
    "CrudeWebdataset",
    "DefaultCrudeJsonlDatasetFactory",
    "DefaultDecoderWebdatasetFactory",
    "DefaultGenericWebdatasetFactory",
    "EmptyDatasetError",
    "ImageClassificationSample",
    "ImageClassificationWebdataset",
    "ImageSample",
    "ImageWebdataset",
    "InterleavedSample",
    "InterleavedWebdataset",
    "JoinedWebdatasetFactory",
    "MultiChoiceVQASample",
    "MultiChoiceVQAWebdataset",
    "OCRSample",
    "OCRWebdataset",
    "PinMemoryMixin",
    "Sample",
    "SampleDecoder",
    "SavableDataset",
    "SimilarityInterleavedSample",
    "SimilarityInterleavedWebdataset",
    "StandardWebdatasetFactory",
    "TextSample",
    "TextWebdataset",
    "VQAOCRWebdataset",
    "VQASample",
    "VQAWebdataset",
    "VidQASample",
    "VidQAWebdataset",
]
