"""Energon's ``DefaultDecoderWebdatasetFactory``: like the generic factory, with decoded parts."""

from __future__ import annotations

from typing import Any, TypeVar

from ....decode import SampleDecoder
from .base_webdataset import DEFAULT_DECODER
from .default_generic_webdataset import DefaultGenericWebdatasetFactory

T_sample = TypeVar("T_sample")

__all__ = ["DefaultDecoderWebdatasetFactory"]


class DefaultDecoderWebdatasetFactory(DefaultGenericWebdatasetFactory[T_sample]):
    """Parts decoded by ``decoder`` (default ``SampleDecoder()``: images as float RGB tensors,
    text, JSON; None: raw bytes) before the sample is built.

    As in Energon, the decoder is the attribute ``_decoder``: a subclass may set it after
    ``super().__init__`` to any callable that takes and returns a raw sample dict (e.g. a
    ``webdataset.autodecode.Decoder``); ``load_sample`` applies it.
    """

    def __init__(self, path: Any, *, decoder: SampleDecoder | None = DEFAULT_DECODER, **kwargs: Any) -> None:
        self._decoder = SampleDecoder() if decoder is DEFAULT_DECODER else decoder
        super().__init__(path, **kwargs)

    def builds_own_samples(self) -> bool:
        return super().builds_own_samples() or not (self._decoder is None or isinstance(self._decoder, SampleDecoder))

    def _spec_decoder(self) -> SampleDecoder | None:
        return self._decoder

    def load_sample(self, raw_data: dict[str, Any]) -> T_sample:
        decoder = self._decoder
        if isinstance(decoder, SampleDecoder):  # ours: errors name the dataset too
            raw_data = decoder.decode(raw_data, key=str(raw_data.get("__key__", "?")), dataset=str(self.path), shard=raw_data.get("__shard__"))
        elif decoder is not None:
            raw_data = decoder(raw_data)
        return super().load_sample(raw_data)
