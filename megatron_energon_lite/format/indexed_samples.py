"""The samples a Megatron ``.bin/.idx`` dataset gives a blend: its documents, or token windows.

Without ``sequence_length`` a sample is one document (all its sequences).  With it, the
documents are read back to back, in file order, as one token stream, and sample ``k`` is the
window ``[k * S, k * S + S + 1)`` of that stream: ``S + 1`` tokens, so that inputs and next-token
labels both have ``S`` (consecutive windows share one token, as Megatron's GPT samples do).  The
last window holds what is left and may be shorter; no token is dropped.  Unlike Megatron's
``GPTDataset``, documents are not shuffled before windowing: the loader shuffles the windows.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError, DatasetError, format_message
from .indexed import IndexedReader

__all__ = ["IndexedSamples", "check_sequence_length"]


def check_sequence_length(value: object, where: str) -> int | None:
    """A leaf's ``sequence_length``: None (one sample per document) or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            format_message(
                "invalid sequence_length",
                where=where,
                expected="an integer >= 1 (tokens per sample; each sample holds one more, for the labels)",
                found=repr(value),
            )
        )
    return value


class IndexedSamples:
    """Random access to the samples of one indexed dataset (documents or windows)."""

    def __init__(self, prefix: str | os.PathLike, sequence_length: int | None = None, *, reader: IndexedReader | None = None) -> None:
        self.reader = reader if reader is not None else IndexedReader(prefix)
        self.sequence_length = sequence_length
        if sequence_length is None:
            self._count = self.reader.num_documents
        else:
            # Windows start every S tokens; one that would start on the last token has no label.
            self._count = max(0, -(-(self.reader.num_tokens - 1) // sequence_length))

    def __len__(self) -> int:
        return self._count

    def tokens(self, index: int, read_until: int | None = None) -> np.ndarray:
        """Sample ``index``'s tokens, in the file's dtype. ``read_until``: the samples up to this
        index (exclusive) are read next, so a remote read may fetch their tokens with these."""
        if self.sequence_length is None:
            stop = None if read_until is None else int(self.reader.document_starts[min(read_until, self._count)])
            return self.reader.document(index, readahead_stop=stop)
        if not 0 <= index < self._count:
            raise DatasetError(
                format_message(
                    "token window index out of range",
                    where=str(self.reader.bin_path),
                    expected=f"0 <= index < {self._count} (windows of {self.sequence_length} + 1 tokens over {self.reader.num_tokens} tokens)",
                    found=str(index),
                )
            )
        start = index * self.sequence_length
        stop = None if read_until is None else min(read_until * self.sequence_length + 1, self.reader.num_tokens)
        return self.reader.read_tokens(start, min(start + self.sequence_length + 1, self.reader.num_tokens), readahead_stop=stop)

    def close(self) -> None:
        self.reader.close()
