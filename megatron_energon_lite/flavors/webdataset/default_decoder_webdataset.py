"""Energon's ``DefaultDecoderWebdatasetFactory``: like the generic factory, with decoded parts."""

from __future__ import annotations

from typing import Any, TypeVar

from ...decode import SampleDecoder
from .base_webdataset import DEFAULT_DECODER
from .default_generic_webdataset import DefaultGenericWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["DefaultDecoderWebdatasetFactory"]


class DefaultDecoderWebdatasetFactory(DefaultGenericWebdatasetFactory[T_sample]):
    """Parts decoded by ``decoder`` (default ``SampleDecoder()``: images as float RGB tensors,
    text, JSON; None: raw bytes) before the sample is built."""

    def __init__(self, path: Any, *, decoder: SampleDecoder | None = DEFAULT_DECODER, **kwargs: Any) -> None:
        self.decoder = SampleDecoder() if decoder is DEFAULT_DECODER else decoder
        super().__init__(path, **kwargs)

    def _decoder(self) -> SampleDecoder | None:
        return self.decoder
