"""Ready-made task encoders for the common cases: text packing and aspect-ratio grouping.

:class:`TextPackingTaskEncoder` tokenizes text samples with the tokenizer you pass, packs them
first-fit-decreasing into sequences of ``seq_length`` tokens and returns, per pack, the tokens,
next-token labels, a loss mask that is 0 on padding and on each sample's last token (its label
would be the next sample's first token), position ids that restart for every sample, and
``cu_seqlens`` (sample boundaries, as flash-attention's variable-length kernels take them).
A batch flattens the boundaries over the batch (``cu_seqlens`` of the ``(batch * seq_length)``
token stream).  ``sample_cost`` reports a sample's token count, so a blend with
``blend_mode="cost"`` balances tokens instead of samples.

:class:`AspectRatioGroupingTaskEncoder` batches image samples by aspect-ratio bucket, with one
batch size per bucket.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Hashable, Sequence

import numpy as np
import torch

from .errors import ConfigError, format_message
from .samples import Sample
from .task_encoder import DefaultTaskEncoder, stateless

__all__ = ["AspectRatioGroupingTaskEncoder", "PackedTextSample", "TextPackingTaskEncoder", "TokenizedSample"]


@dataclasses.dataclass
class TokenizedSample(Sample):
    """One text sample as token ids (at most ``seq_length`` of them)."""

    tokens: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PackedTextSample(Sample):
    """Several samples in one sequence of ``seq_length`` tokens (batched: one more dimension)."""

    tokens: Any = None  # int64 (seq_length,)
    labels: Any = None  # int64 (seq_length,): tokens shifted left by one, pad_id at the end
    loss_mask: Any = None  # float32 (seq_length,)
    position_ids: Any = None  # int64 (seq_length,), restarting at 0 for every sample
    cu_seqlens: Any = None  # int32 (samples + 1,): sample boundaries; batched: over the flat batch
    sample_keys: Any = None  # the packed samples' __key__ values


def _base_fields(sample: Sample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}


class TextPackingTaskEncoder(DefaultTaskEncoder):
    """Packs text samples into fixed-length token sequences.

    ``tokenizer(text) -> list[int]``; ``text_field`` names the field holding the text (``text``
    for TextSample, ``caption`` for CaptioningSample).  Longer samples are cut to ``seq_length``
    tokens (say ``truncate=False`` to make them an error instead).  Use with
    ``get_train_dataset(..., packing_buffer_size=N)``: the larger the buffer, the less padding.
    """

    def __init__(self, tokenizer: Callable[[str], Sequence[int]], seq_length: int, *, pad_id: int = 0, text_field: str = "text", truncate: bool = True) -> None:
        super().__init__()
        if not isinstance(seq_length, int) or isinstance(seq_length, bool) or seq_length < 2:
            raise ConfigError(format_message("invalid seq_length", expected="an integer >= 2", found=repr(seq_length)))
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        self.pad_id = pad_id
        self.text_field = text_field
        self.truncate = truncate

    def _tokens(self, sample: Any) -> list[int]:
        text = sample.get(self.text_field) if isinstance(sample, dict) else getattr(sample, self.text_field, None)
        if not isinstance(text, str):
            raise ConfigError(format_message(f"sample has no text in field {self.text_field!r}", where=f"sample {getattr(sample, '__key__', '?')}", found=type(text).__name__, fix="pass text_field= naming the field with the text"))
        tokens = list(self.tokenizer(text))
        if len(tokens) > self.seq_length:
            if not self.truncate:
                raise ConfigError(format_message("sample is longer than seq_length", where=f"sample {getattr(sample, '__key__', '?')}", found=f"{len(tokens)} tokens", expected=f"<= {self.seq_length}"))
            tokens = tokens[: self.seq_length]
        return tokens

    def sample_cost(self, sample: Any) -> int:
        """Tokens this sample will take in a pack (for ``blend_mode="cost"``)."""
        return len(self._tokens(sample))

    @stateless
    def encode_sample(self, sample: Any) -> TokenizedSample:
        return TokenizedSample(**_base_fields(sample), tokens=self._tokens(sample))

    def select_samples_to_pack(self, samples: list[TokenizedSample]) -> list[list[TokenizedSample]]:
        """First fit decreasing: longest samples first, each into the first pack it fits."""
        packs: list[list[TokenizedSample]] = []
        room: list[int] = []
        for sample in sorted(samples, key=lambda s: -len(s.tokens)):
            size = len(sample.tokens)
            for i, free in enumerate(room):
                if size <= free:
                    packs[i].append(sample)
                    room[i] -= size
                    break
            else:
                packs.append([sample])
                room.append(self.seq_length - size)
        return packs

    @stateless
    def pack_selected_samples(self, samples: list[TokenizedSample]) -> PackedTextSample:
        length = self.seq_length
        lengths = np.array([len(s.tokens) for s in samples], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        used = int(bounds[-1])
        # One conversion for the whole pack: list -> numpy is several times cheaper than torch.tensor.
        tokens = np.full(length, self.pad_id, dtype=np.int64)
        tokens[:used] = np.fromiter(itertools.chain.from_iterable(s.tokens for s in samples), dtype=np.int64, count=used)
        labels = np.full(length, self.pad_id, dtype=np.int64)
        labels[: used - 1] = tokens[1:used]
        loss_mask = np.zeros(length, dtype=np.float32)
        loss_mask[:used] = 1.0
        ends = bounds[1:][lengths > 0] - 1  # empty samples have no last token
        loss_mask[ends] = 0.0  # a sample's last token predicts no token of its own sample
        labels[ends] = self.pad_id
        position_ids = np.zeros(length, dtype=np.int64)
        position_ids[:used] = np.arange(used) - np.repeat(bounds[:-1], lengths)
        if used < length:
            bounds = np.append(bounds, length)  # the padding as one last segment, so cu_seqlens covers the pack
        return PackedTextSample(
            **_base_fields(samples[0]),
            tokens=torch.from_numpy(tokens),
            labels=torch.from_numpy(labels),
            loss_mask=torch.from_numpy(loss_mask),
            position_ids=torch.from_numpy(position_ids),
            cu_seqlens=torch.from_numpy(bounds.astype(np.int32)),
            sample_keys=[s.__key__ for s in samples],
        )

    def batch(self, samples: list[PackedTextSample]) -> PackedTextSample:
        stacked = {name: torch.stack([getattr(s, name) for s in samples]) for name in ("tokens", "labels", "loss_mask", "position_ids")}
        # One boundary list over the flattened (batch * seq_length) stream.
        bounds = [samples[0].cu_seqlens[:1]] + [s.cu_seqlens[1:] + i * self.seq_length for i, s in enumerate(samples)]
        return PackedTextSample(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            __subflavors__=[s.__subflavors__ for s in samples],
            __sources__=[src for s in samples for src in (s.__sources__ or ())],
            cu_seqlens=torch.cat(bounds),
            sample_keys=[s.sample_keys for s in samples],
            **stacked,
        )


class AspectRatioGroupingTaskEncoder(DefaultTaskEncoder):
    """Batches images of similar aspect ratio together.

    ``buckets`` are the width/height ratios to snap to (e.g. ``(0.5, 0.75, 1.0, 1.33, 2.0)``);
    an image goes to the bucket nearest its own ratio.  ``batch_sizes`` maps a bucket to its
    batch size (e.g. smaller batches for extreme ratios); buckets not in it use the loader's
    ``batch_size``.  ``image_field`` names the image tensor field (CHW).
    """

    def __init__(self, buckets: Sequence[float], *, batch_sizes: dict[float, int] | None = None, image_field: str = "image") -> None:
        super().__init__()
        if not buckets or any(not isinstance(b, (int, float)) or b <= 0 for b in buckets):
            raise ConfigError(format_message("invalid aspect-ratio buckets", expected="positive width/height ratios", found=repr(buckets)))
        self.buckets = tuple(float(b) for b in buckets)
        self.batch_sizes = {float(k): v for k, v in (batch_sizes or {}).items()}
        unknown = sorted(set(self.batch_sizes) - set(self.buckets))
        if unknown:
            raise ConfigError(format_message("batch_sizes names buckets that do not exist", expected=f"some of {self.buckets}", found=repr(unknown)))
        self.image_field = image_field

    def bucket_of(self, width: int, height: int) -> float:
        ratio = width / height
        return min(self.buckets, key=lambda b: abs(b - ratio))

    @stateless
    def batch_group_criterion(self, sample: Any) -> tuple[Hashable, int | None]:
        image = getattr(sample, self.image_field)
        height, width = image.shape[-2], image.shape[-1]
        bucket = self.bucket_of(width, height)
        return bucket, self.batch_sizes.get(bucket)
