"""Energon's ``StandardWebdatasetFactory``: the decoded-parts factory for a sample type given as an argument."""

from __future__ import annotations

from typing import Any, TypeVar

from ....errors import ConfigError, format_message
from .default_decoder_webdataset import DefaultDecoderWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["StandardWebdatasetFactory"]


class StandardWebdatasetFactory(DefaultDecoderWebdatasetFactory[T_sample]):
    """``StandardWebdatasetFactory(path, sample_type=CaptioningSample, ...)``."""

    def __init__(self, path: Any, *, sample_type: type, **kwargs: Any) -> None:
        if not isinstance(sample_type, type):
            raise ConfigError(format_message("sample_type must be a class", found=repr(sample_type)[:80], fix="pass e.g. sample_type=CaptioningSample"))
        self.__sample_type__ = sample_type
        super().__init__(path, **kwargs)
