"""megatron_energon_lite: Megatron Energon's data format and API, faster and exactly resumable.

Only the public names live here; everything else is internal and may change.
"""

from ._version import __version__
from .decode import SampleDecoder
from .errors import (
    ConfigError,
    DatasetError,
    DecodeError,
    EmptyDatasetError,
    EnergonLiteError,
    FatalSampleError,
    MissingDependencyError,
    SkipSample,
    StateError,
)
from .samples import (
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    SourceInfo,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
    register_sample_type,
)

__all__ = [
    "CaptioningSample",
    "ConfigError",
    "CrudeSample",
    "DatasetError",
    "DecodeError",
    "EmptyDatasetError",
    "EnergonLiteError",
    "FatalSampleError",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MissingDependencyError",
    "MultiChoiceVQASample",
    "OCRSample",
    "Sample",
    "SampleDecoder",
    "SimilarityInterleavedSample",
    "SkipSample",
    "SourceInfo",
    "StateError",
    "TextSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
    "__version__",
    "register_sample_type",
]
