"""Ready-made task encoders for the common cases: text packing, GPT windows and aspect-ratio grouping.

:class:`TextPackingTaskEncoder` tokenizes text samples with the tokenizer you pass (samples that
already carry token ids, such as :class:`~megatron_energon_lite.samples.TokensSample` from a
Megatron ``.bin/.idx`` dataset, skip the tokenizer), packs them first-fit-decreasing into
sequences of ``seq_length`` tokens and returns, per pack, the tokens, next-token labels, a loss
mask that is 0 on padding and on each sample's last token (its label would be the next sample's
first token), position ids that restart for every sample, and ``cu_seqlens`` (sample boundaries,
as flash-attention's variable-length kernels take them).  A batch flattens the boundaries over
the batch (``cu_seqlens`` of the ``(batch * seq_length)`` token stream).  ``sample_cost`` reports
a sample's token count, so a blend with ``blend_mode="cost"`` balances tokens instead of samples.
With ``attention_mask=True`` a pack also gets Megatron's boolean attention mask (see
:func:`block_causal_mask`).

:class:`GPTWindowTaskEncoder` turns windows of ``seq_length + 1`` token ids into Megatron
GPTDataset-style samples (tokens, labels, loss mask, attention mask, position ids).

:class:`AspectRatioGroupingTaskEncoder` batches image samples by aspect-ratio bucket, with one
batch size per bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Hashable, Sequence

import numpy as np
import torch

from .errors import ConfigError, format_message
from .samples import Sample
from .energon.task_encoder import DefaultTaskEncoder, stateless

__all__ = [
    "AspectRatioGroupingTaskEncoder",
    "GPTWindowTaskEncoder",
    "PackedTextSample",
    "TextPackingTaskEncoder",
    "TokenizedSample",
    "block_causal_mask",
]


@dataclasses.dataclass
class TokenizedSample(Sample):
    """One sample as token ids (at most ``seq_length`` of them): a list from the tokenizer, or an
    int64 numpy array for samples that came with token ids."""

    tokens: Any = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PackedTextSample(Sample):
    """Several samples in one sequence of ``seq_length`` tokens (batched: one more dimension)."""

    tokens: Any = None  # int64 (seq_length,)
    labels: Any = None  # int64 (seq_length,): tokens shifted left by one, pad_id at the end
    loss_mask: Any = None  # float32 (seq_length,)
    position_ids: Any = None  # int64 (seq_length,), restarting at 0 for every sample
    cu_seqlens: Any = None  # int32 (samples + 1,): sample boundaries; batched: over the flat batch
    sample_keys: Any = None  # the packed samples' __key__ values
    attention_mask: Any = None  # bool (1, seq_length, seq_length), True = masked; batched (B, 1, S, S)


def _base_fields(sample: Sample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in ("__key__", "__restore_key__", "__subflavors__", "__sources__")}


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def _key(sample: Any) -> str:
    return str(_field(sample, "__key__") or "?")


def _token_ids(tokens: Any, sample: Any) -> np.ndarray:
    """A sample's token ids as a 1-D integer array, in their own dtype (a view of CPU tensors)."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ConfigError(format_message("sample's tokens are not a 1-D array of integer token ids", where=f"sample {_key(sample)}", found=f"shape {array.shape}, dtype {array.dtype}", fix="store token ids as a 1-D integer tensor or numpy array"))
    return array


@functools.lru_cache(maxsize=8)
def _future_mask(length: int) -> np.ndarray:
    future = np.triu(np.ones((length, length), dtype=bool), k=1)
    future.flags.writeable = False  # shared by every pack of this length
    return future


def block_causal_mask(cu_seqlens: Sequence[int], length: int) -> np.ndarray:
    """Megatron's boolean attention mask for one pack: ``(1, length, length)``, True = masked.

    Token i may attend to token j only if j <= i and both lie in the same segment
    ``[cu_seqlens[k], cu_seqlens[k + 1])``, so no token sees another sample of its pack.  Padding
    is one more segment (as in ``cu_seqlens``): padded rows attend causally among the padding,
    never to a real token, and no row is fully masked, which would give NaN in a softmax that
    masks with -inf (the padded rows' outputs are ignored: their loss mask is 0).
    """
    bounds = [int(b) for b in cu_seqlens]
    if bounds[-1] < length:
        bounds.append(length)
    future = _future_mask(length)
    masked = np.ones((length, length), dtype=bool)
    for start, end in zip(bounds[:-1], bounds[1:]):
        masked[start:end, start:end] = future[: end - start, : end - start]
    return masked[None]


def _stack(samples: list[PackedTextSample], seq_length: int) -> PackedTextSample:
    """Stacks packs (or windows) into a batch; ``cu_seqlens`` becomes one boundary list over the
    flattened ``(batch * seq_length)`` stream."""
    names = ["tokens", "labels", "loss_mask", "position_ids"]
    if samples[0].attention_mask is not None:
        names.append("attention_mask")
    stacked = {name: torch.stack([getattr(s, name) for s in samples]) for name in names}
    bounds = [samples[0].cu_seqlens[:1]] + [s.cu_seqlens[1:] + i * seq_length for i, s in enumerate(samples)]
    return PackedTextSample(
        __key__=[s.__key__ for s in samples],
        __restore_key__=(),
        __subflavors__=[s.__subflavors__ for s in samples],
        __sources__=[src for s in samples for src in (s.__sources__ or ())],
        cu_seqlens=torch.cat(bounds),
        sample_keys=[s.sample_keys for s in samples],
        **stacked,
    )


class TextPackingTaskEncoder(DefaultTaskEncoder):
    """Packs text samples, or samples that carry token ids, into fixed-length token sequences.

    ``tokenizer(text) -> list[int]``; ``text_field`` names the field holding the text (``text``
    for TextSample, ``caption`` for CaptioningSample).  A sample with a ``tokens`` field (a 1-D
    integer tensor or array, e.g. a ``TokensSample``) is packed from those ids without the
    tokenizer, which may then be None.  Longer samples are cut to ``seq_length`` tokens (say
    ``truncate=False`` to make them an error instead).  ``attention_mask=True`` adds Megatron's
    boolean mask to every pack (causal within each sample; see :func:`block_causal_mask`); it
    takes ``seq_length ** 2`` bytes per pack.  Use with
    ``get_train_dataset(..., packing_buffer_size=N)``: the larger the buffer, the less padding.
    """

    def __init__(self, tokenizer: Callable[[str], Sequence[int]] | None, seq_length: int, *, pad_id: int = 0, text_field: str = "text", truncate: bool = True, attention_mask: bool = False) -> None:
        super().__init__()
        _check_seq_length(seq_length)
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        self.pad_id = pad_id
        self.text_field = text_field
        self.truncate = truncate
        self.attention_mask = attention_mask

    def _tokens(self, sample: Any) -> list[int] | np.ndarray:
        tokens: list[int] | np.ndarray
        token_ids = _field(sample, "tokens")
        if token_ids is not None:
            tokens = _token_ids(token_ids, sample)
        else:
            text = _field(sample, self.text_field)
            if not isinstance(text, str):
                raise ConfigError(format_message(f"sample has no text in field {self.text_field!r} and no tokens", where=f"sample {_key(sample)}", found=type(text).__name__, fix="pass text_field= naming the field with the text"))
            if self.tokenizer is None:
                raise ConfigError(format_message("a text sample reached TextPackingTaskEncoder, which has no tokenizer", where=f"sample {_key(sample)}", expected="samples with token ids (a tokens field), or a tokenizer", found=f"text in field {self.text_field!r}", fix="pass TextPackingTaskEncoder(tokenizer, ...) a text -> list[int] function"))
            tokens = list(self.tokenizer(text))
        if len(tokens) > self.seq_length:
            if not self.truncate:
                raise ConfigError(format_message("sample is longer than seq_length", where=f"sample {_key(sample)}", found=f"{len(tokens)} tokens", expected=f"<= {self.seq_length}"))
            tokens = tokens[: self.seq_length]
        if isinstance(tokens, np.ndarray):
            tokens = tokens.astype(np.int64, copy=False)  # after the cut: converts at most seq_length ids
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
        tokens = np.full(length, self.pad_id, dtype=np.int64)
        if all(isinstance(s.tokens, list) for s in samples):
            # One conversion for the whole pack: list -> numpy is several times cheaper than torch.tensor.
            tokens[:used] = np.fromiter(itertools.chain.from_iterable(s.tokens for s in samples), dtype=np.int64, count=used)
        else:
            for s, start, end in zip(samples, bounds[:-1], bounds[1:]):
                tokens[start:end] = s.tokens
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
            attention_mask=torch.from_numpy(block_causal_mask(bounds, length)) if self.attention_mask else None,
        )

    def batch(self, samples: list[PackedTextSample]) -> PackedTextSample:
        return _stack(samples, self.seq_length)


class GPTWindowTaskEncoder(DefaultTaskEncoder):
    """Megatron GPTDataset-style samples from windows of ``seq_length + 1`` token ids.

    For ``TokensSample`` windows (what a ``.bin/.idx`` dataset with ``sequence_length: S``
    yields): ``tokens = t[:-1]``, ``labels = t[1:]``, ``position_ids = arange(S)``, ``loss_mask``
    1 on every real label, and with ``attention_mask=True`` the causal mask ``(1, S, S)``, True =
    masked.  A shorter window (the last one of a dataset) is padded with ``pad_id``; its padded
    positions get loss 0 and form their own causal segment, as in :func:`block_causal_mask`.
    Returns :class:`PackedTextSample` (one window, ``sample_keys`` of length 1); ``batch`` stacks.
    Full windows share their ``loss_mask``, ``position_ids`` and ``cu_seqlens`` tensors (batches
    get copies): clone them before changing one in place in ``postencode_sample``.
    """

    def __init__(self, seq_length: int, *, pad_id: int = 0, attention_mask: bool = True) -> None:
        super().__init__()
        _check_seq_length(seq_length)
        self.seq_length = seq_length
        self.pad_id = pad_id
        self.attention_mask = attention_mask
        self._full_loss_mask = torch.ones(seq_length, dtype=torch.float32)
        self._positions = torch.arange(seq_length, dtype=torch.int64)
        self._full_bounds = torch.tensor([0, seq_length], dtype=torch.int32)

    @stateless
    def encode_sample(self, sample: Any) -> PackedTextSample:
        length = self.seq_length
        window = _field(sample, "tokens")
        if window is None:
            raise ConfigError(format_message("GPTWindowTaskEncoder needs samples with token ids", where=f"sample {_key(sample)}", found=type(sample).__name__, fix="load a Megatron .bin/.idx dataset (TokensSample), or use TextPackingTaskEncoder for text"))
        window = _token_ids(window, sample)
        if len(window) > length + 1:
            raise ConfigError(format_message("token window is longer than seq_length + 1", where=f"sample {_key(sample)}", expected=f"<= {length + 1} tokens", found=f"{len(window)} tokens", fix=f"set the dataset's sequence_length to {length}, or seq_length to the dataset's"))
        if len(window) == length + 1:  # every window but a dataset's last: views, no padding
            stream = torch.from_numpy(np.asarray(window, dtype=np.int64))
            return PackedTextSample(
                **_base_fields(sample),
                tokens=stream[:-1],
                labels=stream[1:],
                # The same tensors for every full window: batch() copies them (a third of the time of
                # a window was making them); clone before changing one in place in a later hook.
                loss_mask=self._full_loss_mask,
                position_ids=self._positions,
                cu_seqlens=self._full_bounds,
                sample_keys=[_field(sample, "__key__")],
                attention_mask=torch.from_numpy(block_causal_mask((0, length), length)) if self.attention_mask else None,
            )
        real = max(len(window) - 1, 0)  # positions that have a label
        tokens = np.full(length, self.pad_id, dtype=np.int64)
        labels = np.full(length, self.pad_id, dtype=np.int64)
        tokens[:real] = window[:real]
        labels[:real] = window[1:]
        loss_mask = np.zeros(length, dtype=np.float32)
        loss_mask[:real] = 1.0
        bounds = np.array([0, real, length] if real < length else [0, length], dtype=np.int32)
        return PackedTextSample(
            **_base_fields(sample),
            tokens=torch.from_numpy(tokens),
            labels=torch.from_numpy(labels),
            loss_mask=torch.from_numpy(loss_mask),
            position_ids=torch.arange(length, dtype=torch.int64),
            cu_seqlens=torch.from_numpy(bounds),
            sample_keys=[_field(sample, "__key__")],
            attention_mask=torch.from_numpy(block_causal_mask(bounds, length)) if self.attention_mask else None,
        )

    def batch(self, samples: list[PackedTextSample]) -> PackedTextSample:
        return _stack(samples, self.seq_length)


def _check_seq_length(seq_length: Any) -> None:
    if not isinstance(seq_length, int) or isinstance(seq_length, bool) or seq_length < 2:
        raise ConfigError(format_message("invalid seq_length", expected="an integer >= 2", found=repr(seq_length)))


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
