"""Sample types, as Megatron Energon 7.4 defines them, and their registry.

Every sample is a ``kw_only`` + ``slots`` dataclass deriving from :class:`Sample`, with Energon's
class names, field names, field order and defaults, so user code written for Energon keeps
working. Types are found by class name through an explicit registry
(:func:`register_sample_type`, :func:`sample_type_by_name`): that is what ``dataset.yaml``'s
``sample_type: {__module__, __class__}`` resolves against.

Batches: :class:`Batch` is the base of user batch dataclasses, and :func:`generic_batch`,
:func:`batch_pad_stack`, :func:`batch_stack` and :func:`batch_list` are Energon's batching helpers,
with Energon's results.

Importing this module does not import torch; tensor fields are typed ``Tensor``, which is
``torch.Tensor`` for type checkers and ``Any`` at runtime.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import BatchMismatchError, ConfigError, format_message
from .worker_slabs import slab_empty

if TYPE_CHECKING:
    from torch import Tensor
else:
    Tensor = Any

__all__ = [
    "Batch",
    "CaptioningSample",
    "CrudeSample",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "Sample",
    "SimilarityInterleavedSample",
    "SourceInfo",
    "TextSample",
    "TokensSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "format_value",
    "generic_batch",
    "register_sample_type",
    "registered_sample_types",
    "sample_type_by_name",
]

T_sample = TypeVar("T_sample", bound="Sample")

# A preview line stays readable: long strings and containers are cut to these sizes.
_MAX_STR = 80
_MAX_ITEMS = 8


# init=False: the generated __init__ of a frozen class sets each field through
# object.__setattr__ (~0.5 us per object); the slot setters below take ~0.2 us.  Every sample
# makes one in its worker and every sample of a batch rebuilds one in the main process, which
# made them about half the main process's CPU per text batch with workers.
@dataclasses.dataclass(frozen=True, slots=True, init=False)
class SourceInfo:
    """Where a sample was loaded from (Energon's ``SourceInfo``; here also positional)."""

    #: The path of the dataset (a string; Energon uses its ``EPath``).
    dataset_path: str
    #: The index of the sample in the dataset (or a key for non-indexed sources).
    index: int | str
    #: The name of the shard file that holds the sample.
    shard_name: str
    #: The names of the files in the shard that make up the sample.
    file_names: tuple[str, ...]

    def __init__(self, dataset_path: str, index: int | str, shard_name: str, file_names: tuple[str, ...]) -> None:
        _set_dataset_path(self, dataset_path)
        _set_index(self, index)
        _set_shard_name(self, shard_name)
        _set_file_names(self, file_names)

    def __reduce__(self) -> tuple:
        # The dataclass's own pickling of a frozen slots class goes through Python-level
        # __getstate__/__setstate__ (~2 us per object each way).
        return SourceInfo, (self.dataset_path, self.index, self.shard_name, self.file_names)


_set_dataset_path = SourceInfo.dataset_path.__set__
_set_index = SourceInfo.index.__set__
_set_shard_name = SourceInfo.shard_name.__set__
_set_file_names = SourceInfo.file_names.__set__


def _is_tensor_like(value: Any) -> bool:
    module = type(value).__module__
    return (module.startswith("torch") or module.startswith("numpy")) and hasattr(value, "shape") and hasattr(value, "dtype")


def format_value(value: Any) -> str:
    """A short, readable rendering of a field value for previews and reprs.

    Tensors and arrays show as shape and dtype, PIL images as size and mode, bytes as their
    length; long strings and containers are cut short.
    """
    if isinstance(value, str):
        if len(value) > _MAX_STR:
            return repr(value[:_MAX_STR]) + f"...({len(value)} chars)"
        return repr(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{type(value).__name__}(len={len(value) if not isinstance(value, memoryview) else value.nbytes})"
    if _is_tensor_like(value):
        if tuple(value.shape) == ():
            return repr(value)
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{type(value).__name__}(shape={tuple(value.shape)}, dtype={dtype})"
    if type(value).__module__.startswith("PIL.") and hasattr(value, "size") and hasattr(value, "mode"):
        return f"PIL.Image(size={tuple(value.size)}, mode={value.mode})"
    if isinstance(value, Sample):
        return str(value)
    if isinstance(value, Mapping):
        items = [f"{k!r}: {format_value(v)}" for k, v in list(value.items())[:_MAX_ITEMS]]
        if len(value) > _MAX_ITEMS:
            items.append(f"...({len(value)} items)")
        text = "{" + ", ".join(items) + "}"
        return text if type(value) is dict else f"{type(value).__name__}({text})"
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = [format_value(v) for v in value[:_MAX_ITEMS]]
        if len(value) > _MAX_ITEMS:
            items.append(f"...({len(value)} items)")
        if isinstance(value, tuple):
            return "(" + ", ".join(items) + ("," if len(value) == 1 else "") + ")"
        return "[" + ", ".join(items) + "]"
    text = repr(value)
    return text if len(text) <= 2 * _MAX_STR else text[: 2 * _MAX_STR] + "..."


def _format_fields(obj: Any) -> str:
    return ", ".join(f"{f.name}={format_value(getattr(obj, f.name))}" for f in dataclasses.fields(obj) if f.repr)


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


class _Fields:
    """What samples and batches share: ``extend``, access by field name, pinning and a compact repr."""

    __slots__ = ()

    #: Not iterable: ``__getitem__`` takes field names, not positions.
    __iter__ = None

    def __getitem__(self, name: str) -> Any:
        """The field called ``name`` (``batch["image"]`` is ``batch.image``); ``KeyError`` listing
        the fields for any other name."""
        if isinstance(name, str) and name in _field_names(type(self)):
            return getattr(self, name)
        raise KeyError(f"{type(self).__name__} has no field {name!r}; its fields are {', '.join(_field_names(type(self)))}")

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is one of the fields."""
        return isinstance(name, str) and name in _field_names(type(self))

    @classmethod
    def extend(cls, src: Any, **new_fields: Any) -> Any:
        """A ``cls`` (a subclass of ``type(src)``) with all of ``src``'s fields plus ``new_fields``."""
        if not isinstance(src, _Fields) or not issubclass(cls, type(src)):
            raise ConfigError(
                format_message(
                    f"{cls.__name__}.extend needs an instance of {cls.__name__} or of one of its base classes",
                    found=type(src).__name__,
                    fix=f"derive {cls.__name__} from {type(src).__name__}, or use derive_from",
                )
            )
        for f in dataclasses.fields(src):
            if f.init and f.name not in new_fields:
                new_fields[f.name] = getattr(src, f.name)
        return cls(**new_fields)

    def pin_memory(self) -> Any:
        """A copy whose tensors (also inside lists, tuples, dicts and dataclasses) are in pinned memory."""
        return _pin(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_format_fields(self)})"

    def __str__(self) -> str:
        # Also compact for user subclasses whose @dataclass generated a full __repr__.
        return f"{type(self).__name__}({_format_fields(self)})"


@dataclasses.dataclass(kw_only=True, slots=True, repr=False)
class Sample(_Fields):
    """The base of every sample: identity and provenance fields shared by all sample types.

    Subclasses are ``@dataclasses.dataclass(kw_only=True, slots=True)`` classes that add fields.
    """

    #: Uniquely identifies the sample in its dataset.
    __key__: str
    #: A (nested) tuple of strings and ints that finds the sample again, for checkpoint restore.
    __restore_key__: tuple = ()
    #: Free-form labels set per dataset in the metadataset, to tell datasets of one type apart.
    __subflavors__: dict[str, Any] | None = None
    #: Where the sample's data was read from; joined samples have one entry per source.
    __sources__: tuple[SourceInfo, ...] | None = None

    @classmethod
    def derive_from(cls: type[T_sample], base_sample: Sample, **fields: Any) -> T_sample:
        """A new ``cls`` with ``base_sample``'s key, restore key, subflavors and sources, plus ``fields``.

        A base field given in ``fields`` wins over the one of ``base_sample``.
        """
        base = {name: getattr(base_sample, name) for name in _BASE_FIELDS if name not in fields}
        return cls(**base, **fields)

    @classmethod
    def from_joined(cls: type[T_sample], *samples: Sample | None, **overrides: Any) -> T_sample:
        """Joins samples (of joined datasets) into one ``cls``.

        Fields are merged in order, a later sample overriding an earlier one; key, restore key
        and subflavors come from the first sample; ``__sources__`` concatenates every sample's
        sources (each once, in order). ``None`` samples after the first are skipped.
        ``overrides`` are field values that win over all samples.
        """
        if not samples or samples[0] is None:
            raise ConfigError(
                format_message(
                    f"{cls.__name__}.from_joined needs a primary sample",
                    expected="at least one sample, the first one not None",
                    found=f"{len(samples)} samples" + (", the first is None" if samples else ""),
                    fix="pass the joined samples positionally, the primary dataset's sample first",
                )
            )
        bad = [name for name, value in overrides.items() if isinstance(value, Sample)]
        if bad:
            raise ConfigError(
                format_message(
                    f"{cls.__name__}.from_joined got samples as keyword arguments",
                    found=", ".join(bad),
                    fix="pass the joined samples positionally; keyword arguments are field values",
                )
            )
        primary = samples[0]
        init = {f.name: getattr(primary, f.name) for f in dataclasses.fields(primary) if f.init}
        sources: list[SourceInfo] = []
        for sample in samples:
            if sample is None:
                continue
            sources.extend(sample.__sources__ or ())
            for f in dataclasses.fields(sample):
                if f.init and f.name not in _BASE_FIELDS:
                    init[f.name] = getattr(sample, f.name)
        init["__sources__"] = tuple(sources)
        init.update(overrides)
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(init) - known)
        if unknown:
            raise ConfigError(
                format_message(
                    f"cannot join into {cls.__name__}: the joined samples have fields it lacks",
                    expected=f"fields of {cls.__name__}: {', '.join(sorted(known))}",
                    found=", ".join(unknown),
                    fix=f"add the fields to {cls.__name__}, or override {cls.__name__}.from_joined",
                )
            )
        return cls(**init)


_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))


def _pin(value: Any) -> Any:
    module = type(value).__module__
    if module.startswith("torch") and hasattr(value, "pin_memory"):
        return value.pin_memory()
    if isinstance(value, dict):
        return type(value)({k: _pin(v) for k, v in value.items()})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(**{f.name: _pin(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_pin(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_pin(v) for v in value)
    return value


class CrudeSample(dict):
    """A plain dict of decoded parts plus ``__key__``, ``__restore_key__``, ... (not a :class:`Sample`).

    Crude datasets hand these to the task encoder's cookers.
    """

    __slots__ = ()


_sample_dataclass = dataclasses.dataclass(kw_only=True, slots=True, repr=False)


@_sample_dataclass
class TextSample(Sample):
    """Plain text."""

    text: str


@_sample_dataclass
class CaptioningSample(Sample):
    """An image and its caption."""

    #: The image, e.g. a (C, H, W) tensor.
    image: Tensor
    caption: str


@_sample_dataclass
class ImageSample(Sample):
    """An image alone, e.g. for reconstruction."""

    #: The image, e.g. a (C, H, W) tensor.
    image: Tensor


@_sample_dataclass
class ImageClassificationSample(Sample):
    """An image and its class."""

    image: Tensor
    label: int | None = None
    label_name: str | None = None


@_sample_dataclass
class VQASample(Sample):
    """Visual question answering: an image, a question and the possible answers."""

    image: Tensor
    context: str
    answers: list[str] | None = None
    answer_weights: Tensor | None = None


@_sample_dataclass
class VidQASample(Sample):
    """Video question answering: a video, a question and the possible answers."""

    #: The video (a lazy decoder once video decoding exists; typed ``Any`` until then).
    video: Any
    context: str
    answers: list[str] | None = None
    answer_weights: Tensor | None = None


@_sample_dataclass
class MultiChoiceVQASample(Sample):
    """Multiple-choice visual question answering."""

    image: Tensor
    context: str
    choices: list[str] | None = None
    correct_choice_idx: int = 0


@_sample_dataclass
class OCRSample(Sample):
    """Optical character recognition: an image, its text and optional boxes per level."""

    image: Tensor
    text: str
    #: Block boxes, float (N, 4|5): x, y, w, h[, confidence].
    block_boxes: Tensor | None = None
    block_classes: Tensor | list[str] | None = None
    block_text: list[str] | None = None
    lines_boxes: Tensor | None = None
    lines_text: list[str] | None = None
    words_boxes: Tensor | None = None
    words_text: list[str] | None = None
    chars_boxes: Tensor | None = None
    chars_text: list[str] | None = None


@_sample_dataclass
class InterleavedSample(Sample):
    """Interleaved media: a sequence of images (tensors) and texts."""

    sequence: list[Tensor | str]


@_sample_dataclass
class SimilarityInterleavedSample(Sample):
    """Images and texts without alignment; a similarity matrix relates them."""

    images: list[Tensor]
    texts: list[str]
    audio: list[Tensor] | None = None
    video: list[Tensor] | None = None
    similarity_matrix: Tensor | None = None
    matched_text_indices: list[int] | None = None


@_sample_dataclass
class VQAOCRSample(Sample):
    """Visual question answering combined with OCR text and word boxes."""

    image: Tensor
    context: str
    text: str
    answers: list[str] | None = None
    answer_weights: Tensor | None = None
    words_boxes: Tensor | None = None
    words_text: list[str] | None = None


@_sample_dataclass
class TokensSample(Sample):
    """Token ids read from a Megatron ``.bin/.idx`` dataset (ours; Energon has no such type).

    A whole document, or a window of ``sequence_length + 1`` tokens when the dataset entry sets
    ``sequence_length`` (consecutive windows share one token, as Megatron's GPT samples do).
    """

    #: int64 (n,)
    tokens: Tensor


_SAMPLE_TYPES: dict[str, type[Sample]] = {}

SampleTypeT = TypeVar("SampleTypeT", bound=type)


def register_sample_type(cls: SampleTypeT, *, replace: bool = False) -> SampleTypeT:
    """Registers a :class:`Sample` subclass under its class name; usable as a decorator.

    Registering the same class again is a no-op; another class under a taken name is a
    :class:`ConfigError` unless ``replace=True``.
    """
    if not isinstance(cls, type) or not issubclass(cls, Sample) or not dataclasses.is_dataclass(cls):
        raise ConfigError(
            format_message(
                "only Sample dataclasses can be registered as sample types",
                found=repr(cls),
                fix="derive the class from megatron_energon_lite.samples.Sample and decorate it with "
                "@dataclasses.dataclass(kw_only=True)",
            )
        )
    name = cls.__name__
    existing = _SAMPLE_TYPES.get(name)
    if existing is not None and existing is not cls and not replace:
        raise ConfigError(
            format_message(
                f"a different sample type named {name!r} is already registered",
                expected=f"{existing.__module__}.{existing.__qualname__}",
                found=f"{cls.__module__}.{cls.__qualname__}",
                fix="rename your class, or pass replace=True to register_sample_type",
            )
        )
    _SAMPLE_TYPES[name] = cls
    return cls


def sample_type_by_name(name: str) -> type[Sample] | None:
    """The registered sample type called ``name``, or None."""
    return _SAMPLE_TYPES.get(name)


def registered_sample_types() -> dict[str, type[Sample]]:
    """All registered sample types by class name, sorted by name (a copy)."""
    return dict(sorted(_SAMPLE_TYPES.items()))


for _cls in (
    TextSample,
    CaptioningSample,
    ImageSample,
    ImageClassificationSample,
    VQASample,
    VidQASample,
    MultiChoiceVQASample,
    OCRSample,
    InterleavedSample,
    SimilarityInterleavedSample,
    VQAOCRSample,
    TokensSample,
):
    register_sample_type(_cls)
del _cls


# --------------------------------------------------------------------------------------------
# Batching: Energon's helpers and Batch base class. torch is imported only when a tensor is
# actually batched (a value can only be a torch.Tensor if torch is already imported).


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _check_not_empty(values: Sequence[Any], what: str) -> None:
    if len(values) == 0:
        raise ConfigError(
            format_message(
                f"{what} got no values to batch",
                expected="at least one value",
                found="an empty list",
                fix="batch at least one sample (the loader never calls the batcher with an empty list)",
            )
        )


def _declared(value: Any) -> bool:
    """Whether ``value`` is an instance of a class the code declares (a dataclass or namedtuple),
    not data (dicts, lists, scalars, tensors)."""
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)) or _is_namedtuple(value)


def batch_column(values: Sequence[Any], name: str, get: Callable[[Any, str], Any]) -> list[Any]:
    """``[get(value, name) for value in values]``, or an error naming the field if a value lacks it:
    :class:`ConfigError` when the values are all of declared classes (samples of different types:
    the code made them so), else :class:`BatchMismatchError` (the data differ between samples,
    e.g. a JSON part that is a list in one sample and an object in another), which the loader's
    error policy handles like a sample that does not decode."""
    try:
        return [get(value, name) for value in values]
    except (KeyError, AttributeError, TypeError, IndexError) as exc:
        declared = all(_declared(value) for value in values)
        error = ConfigError if declared else BatchMismatchError
        raise error(
            format_message(
                f"cannot batch field {name!r}: not every value of the batch has it",
                expected=f"{len(values)} values shaped like the first one ({type(values[0]).__name__})",
                found="types " + ", ".join(sorted({type(v).__name__ for v in values})) + f" ({type(exc).__name__}: {exc})",
                fix="give every sample of a batch the same type and keys, or override the task encoder's batch()"
                if declared
                else "the samples' data differ in shape, so this batch is skipped by the loader's error policy; to "
                "keep such samples, make the field uniform in encode_sample or override the task encoder's batch()",
            )
        ) from exc


def batch_stack(values: Sequence[Any]) -> Any:
    """Stacks equally shaped tensors along a new first dimension (the result of ``torch.stack``).

    Plain CPU tensors are copied by numpy in the calling thread: torch's intra-op threads make
    ``torch.stack`` of a few MB of uint8 images 10-100x slower when the cores are busy (a batch of
    32 256x256 RGB images: 0.7 ms single-threaded, 16-120 ms with 2 busy threads).  In a loader
    worker the result is made in the worker's shared-memory slab, so handing it to the main
    process copies nothing more (``loader/handover/slabs.py``).
    """
    import torch

    values = list(values)
    first = values[0] if values else None
    if (
        isinstance(first, torch.Tensor)
        and first.device.type == "cpu"
        and first.dtype in _NUMPY_DTYPES
        and all(
            isinstance(v, torch.Tensor) and v.dtype == first.dtype and v.device.type == "cpu"
            and not v.requires_grad and v.shape == first.shape
            for v in values
        )
    ):
        import numpy as np

        arrays = [v.numpy() for v in values]
        out = slab_empty((len(values), *first.shape), first.dtype)
        if out is None:
            # Contiguous whatever the values' strides (np.stack alone would keep those of views).
            out = torch.from_numpy(np.empty((len(values), *arrays[0].shape), arrays[0].dtype))
        np.stack(arrays, out=out.numpy())
        return out
    return torch.stack(values, dim=0)


def _numpy_dtypes() -> frozenset:
    import torch

    return frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64, torch.bool})


class _LazyDtypes:
    """torch dtypes numpy can hold, computed on first use (importing samples stays torch-free)."""

    _value: frozenset | None = None

    def __contains__(self, dtype: Any) -> bool:
        if _LazyDtypes._value is None:
            _LazyDtypes._value = _numpy_dtypes()
        return dtype in _LazyDtypes._value


_NUMPY_DTYPES = _LazyDtypes()


def batch_pad_stack(values: Sequence[Any]) -> Any:
    """Stacks tensors of any shapes (of equal rank), zero-padding each to the largest size per dimension.

    The result has the dtype and device of the first tensor; each tensor sits at the start
    (low indices) of its slot.
    """
    _check_not_empty(values, "batch_pad_stack")
    first = values[0]
    if not all(_is_tensor(v) for v in values):
        raise BatchMismatchError(
            format_message(
                "batch_pad_stack needs tensors, and not every value of the batch is one",
                expected=f"{len(values)} tensors",
                found="types " + ", ".join(sorted({type(v).__name__ for v in values})),
                fix="the samples' data differ, so this batch is skipped by the loader's error policy; to keep "
                "such samples, make the field uniform in encode_sample, or batch it with batch_list",
            )
        )
    shapes = [tuple(v.shape) for v in values]
    if any(len(shape) != len(shapes[0]) for shape in shapes):
        raise BatchMismatchError(
            format_message(
                "batch_pad_stack needs tensors with the same number of dimensions",
                expected=f"{len(shapes[0])} dimensions, like the first tensor",
                found="shapes " + ", ".join(str(shape) for shape in shapes),
                fix="the samples' data differ, so this batch is skipped by the loader's error policy; to keep "
                "such samples, reshape the values in encode_sample, or batch this field with batch_list",
            )
        )
    if all(shape == shapes[0] for shape in shapes) and all(
        v.dtype == first.dtype and v.device == first.device for v in values
    ):
        return batch_stack(values)
    max_size = [max(shape[dim] for shape in shapes) for dim in range(len(shapes[0]))]
    out = first.new_zeros((len(values), *max_size))
    for i, (value, shape) in enumerate(zip(values, shapes)):
        out[(i, *(slice(0, n) for n in shape))] = value
    return out


def batch_list(values: Sequence[Any]) -> list[Any]:
    """The values as a list (the list itself when given one, as in Energon)."""
    return values if isinstance(values, list) else list(values)


def generic_batch(values: Sequence[Any]) -> Any:
    """Batches values by the type of the first one, as Energon does.

    * tensors -> :func:`batch_pad_stack`;
    * dicts -> a dict of batched columns (keys of the first value);
    * dataclasses -> ``type(first).from_samples(values)`` if it has ``from_samples`` (e.g. a
      :class:`Batch`), else an instance of the same class with batched fields (so a batch of
      :class:`Sample` instances is a sample whose fields hold lists or stacked tensors);
    * namedtuples -> the same namedtuple with batched fields;
    * anything else (str, int, numpy arrays, None, ...) -> a list.
    """
    _check_not_empty(values, "generic_batch")
    first = values[0]
    if _is_tensor(first):
        return batch_pad_stack(values)
    if isinstance(first, dict):
        return {key: generic_batch(batch_column(values, key, operator.getitem)) for key in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        from_samples = getattr(first, "from_samples", None)
        if from_samples is not None:
            return from_samples(values)
        return type(first)(
            **{f.name: generic_batch(batch_column(values, f.name, getattr)) for f in dataclasses.fields(first) if f.init}
        )
    if _is_namedtuple(first):
        return type(first)(**{name: generic_batch(batch_column(values, name, getattr)) for name in first._fields})
    return batch_list(values)


T_batch = TypeVar("T_batch", bound="Batch")


@dataclasses.dataclass(kw_only=True, slots=True, repr=False)
class Batch(_Fields):
    """The base of batch dataclasses (Energon's ``Batch``): a sample's identity fields, one entry per sample.

    Subclass it with ``@dataclasses.dataclass(kw_only=True, slots=True)`` and add the batched
    fields; build instances with :meth:`from_samples` in ``TaskEncoder.batch`` and with
    :meth:`derive_from` in ``encode_batch``.
    """

    #: The key of every sample of the batch.
    __key__: list[str]
    #: Finds the batch again; the loader's batching stage sets it.
    __restore_key__: tuple = ()
    #: The subflavors of the samples that have any (see :meth:`from_samples`).
    __subflavors__: list[dict[str, Any] | None] | None = None
    #: The sources of all samples, concatenated.
    __sources__: tuple[SourceInfo, ...] | None = None

    @classmethod
    def derive_from(cls: type[T_batch], base_batch: Batch, **fields: Any) -> T_batch:
        """A new ``cls`` with ``base_batch``'s key, restore key, subflavors and sources, plus ``fields``.

        A base field given in ``fields`` wins over the one of ``base_batch``.
        """
        base = {name: getattr(base_batch, name) for name in _BATCH_BASE_FIELDS if name not in fields}
        return cls(**base, **fields)

    @classmethod
    def from_samples(cls: type[T_batch], samples: Sequence[Any], **overrides: Any) -> T_batch:
        """Builds a ``cls`` from sample dataclasses, with Energon 7.4's exact results.

        For each field of ``cls``: a value in ``overrides`` wins; ``__sources__`` concatenates
        the samples' sources (left at its default if no sample has any); ``__subflavors__`` lists
        the subflavors of the samples that have non-empty ones (so it may be shorter than the
        batch; left at its default if every sample has None); every other field, tensors
        included, becomes the list of the samples' values. (Energon's docstring promises padded
        and stacked tensors, but its code lists them; we keep its results, so task encoders
        written for it keep working. Pad-stack a field yourself with :func:`batch_pad_stack`, or
        use :func:`generic_batch`.)
        """
        bad = [type(s).__name__ for s in samples if not dataclasses.is_dataclass(s) or isinstance(s, type)]
        if bad:
            raise ConfigError(
                format_message(
                    f"{cls.__name__}.from_samples needs sample dataclasses",
                    found="values of type " + ", ".join(sorted(set(bad))),
                    fix="batch Sample instances (or other dataclasses), or build the batch with generic_batch",
                )
            )
        init: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            name = f.name
            if name in overrides:
                init[name] = overrides[name]
            elif name == "__sources__":
                if any(s.__sources__ is not None for s in samples):
                    init[name] = tuple(src for s in samples if s.__sources__ for src in s.__sources__)
            elif name == "__subflavors__":
                if any(s.__subflavors__ is not None for s in samples):
                    init[name] = [s.__subflavors__ for s in samples if s.__subflavors__]
            else:
                init[name] = batch_column(samples, name, getattr)
        unknown = sorted(set(overrides) - set(init))
        if unknown:
            raise ConfigError(
                format_message(
                    f"{cls.__name__}.from_samples got values for fields it does not have",
                    expected=f"fields of {cls.__name__}: " + ", ".join(f.name for f in dataclasses.fields(cls) if f.init),
                    found=", ".join(unknown),
                    fix=f"add the fields to {cls.__name__}, or drop them from the call",
                )
            )
        return cls(**init)


_BATCH_BASE_FIELDS = tuple(f.name for f in dataclasses.fields(Batch))
