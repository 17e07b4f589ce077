"""Which samples a preview shows, loaded and turned into views, section by section.

A section is one split of one dataset: a prepared folder, a ``.jsonl`` file, or one leaf of a
metadataset YAML (headed by the leaf's entry and its weight). A sample that cannot be loaded
keeps its place with the error instead of its fields, and the preview goes on. Crude datasets
(no sample_type) are decoded part by part here, so a broken part shows its error next to the
parts that decoded.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..decode import SampleDecoder
from ..errors import EmptyDatasetError, EnergonLiteError
from ..format.metadataset import LeafDataset, is_metadataset_path, load_blend_plan
from ..pipeline.load import JoinLoader, SampleLoader
from ..samples import CrudeSample
from ..storage import AnyPath
from .views import ErrorView, View, view_of

__all__ = ["PreviewField", "PreviewSample", "Section", "collect", "collect_indexed", "sample_fields"]

#: Fields Energon's preview leaves out: bookkeeping, not data.
HIDDEN_FIELDS = ("__restore_key__", "__subflavors__", "__sources__")


@dataclasses.dataclass(frozen=True)
class PreviewField:
    name: str
    type_name: str | None  # the annotation of a typed sample's field; None for crude parts
    view: View


@dataclasses.dataclass(frozen=True)
class PreviewSample:
    index: int  # in the split
    key: str | None
    shard: str | None
    fields: tuple[PreviewField, ...] = ()
    error: str | None = None  # the whole sample failed to load
    excluded: bool = False  # split.yaml excludes its key


@dataclasses.dataclass(frozen=True)
class Section:
    """``title``: what the terminal prints above the samples; ``leaf``: the metadataset entry and
    its weight, when the section is one leaf of a blend; ``note``: instead of samples."""

    title: str
    samples: tuple[PreviewSample, ...] = ()
    note: str | None = None
    leaf: str | None = None


def collect(
    path: AnyPath,
    splits: list[str],
    *,
    num_samples: int,
    offset: int = 0,
    dataset_config: str | None = None,
    trust_dataset_code: bool = False,
) -> Iterator[Section]:
    """The sections of ``path`` (a dataset folder, a ``.jsonl`` file or a metadataset YAML), one
    per split (per leaf of each split for a YAML), each with up to ``num_samples`` samples from
    ``offset``. Raises for what stops the whole preview: an unprepared folder, a bad YAML."""
    # Images as PIL (what the renderers draw), video and audio as lazy AVDecoders.
    decoder = SampleDecoder(image_decode="pil", untrusted_pickle="bytes")
    metadataset = is_metadataset_path(path)
    for split in splits:
        if metadataset:
            yield from _metadataset_sections(path, split, decoder, num_samples, offset, dataset_config, trust_dataset_code)
            continue
        try:
            loader = SampleLoader(path, split, dataset_config=dataset_config, decoder=decoder, trust_dataset_code=trust_dataset_code)
        except EmptyDatasetError:
            yield Section(f"{path} split {split}", note=f"Dataset {split} is empty. Skipping.")  # as energon preview
            continue
        try:
            yield _section(loader, f"{path} split {split}", decoder, range(len(loader)), num_samples, offset)
        finally:
            loader.close()


def collect_indexed(groups: Iterable[tuple[str, Sequence[tuple[str, str, int | None]]]]) -> Iterator[Section]:
    """One section per ``(title, samples)`` group, each sample named by ``(dataset path, split,
    split index)`` (the samples of a manifest step; index None: a sample the manifest does not
    name alone, shown as an error).  Each dataset is opened once."""
    decoder = SampleDecoder(image_decode="pil", untrusted_pickle="bytes")
    loaders: dict[tuple[str, str], SampleLoader | str] = {}
    try:
        for title, samples in groups:
            shown = []
            for path, split, index in samples:
                if index is None:
                    shown.append(PreviewSample(-1, None, None, error="not one sample of a dataset (a packed or grouped item's key): see its restore key"))
                    continue
                loader = loaders.get((path, split))
                if loader is None:
                    try:
                        loader = SampleLoader(path, split, decoder=decoder)
                        if _decodes_parts_itself(loader):
                            loader.decoder = None  # raw parts: decoded one by one, as collect() does
                    except EnergonLiteError as exc:  # a dataset gone or not readable here
                        loader = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                    loaders[(path, split)] = loader
                if isinstance(loader, str):
                    shown.append(PreviewSample(index, None, None, error=loader))
                else:
                    shown.append(_load(loader, index, decoder if loader.decoder is None else None))
            yield Section(title, tuple(shown))
    finally:
        for loader in loaders.values():
            if not isinstance(loader, str):
                loader.close()


def _metadataset_sections(path: AnyPath, split: str, decoder: SampleDecoder, num_samples: int, offset: int, dataset_config: str | None, trust: bool) -> Iterator[Section]:
    plan = load_blend_plan(path, split, training=True)  # training: weights as the loader blends them
    yield Section(f"Metadataset {path} split {split}: {plan.kind}, {len(plan.leaves)} dataset{'s' if len(plan.leaves) != 1 else ''}")
    for leaf in plan.leaves:
        share = {"blend": f"weight {float(leaf.weight):.1%}", "blend_epochized": f"repetitions x{float(leaf.repetitions):g}"}.get(plan.kind)
        label = leaf.where + (f", {share}" if share else "")
        title = f"{leaf.path} split {leaf.split_part}"
        try:
            loader = _leaf_loader(leaf, decoder, dataset_config, trust)
        except EmptyDatasetError:
            yield Section(title, note=f"Dataset {leaf.split_part} is empty. Skipping.", leaf=label)
            continue
        except EnergonLiteError as exc:  # one unreadable leaf does not hide the others
            yield Section(title, note=f"error: {exc}", leaf=label)
            continue
        try:
            start, end = leaf.sample_range(len(loader))
            yield _section(loader, title, decoder, range(start, end), num_samples, offset, leaf=label)
        except EnergonLiteError as exc:
            yield Section(title, note=f"error: {exc}", leaf=label)
        finally:
            loader.close()


def _leaf_loader(leaf: LeafDataset, decoder: SampleDecoder, dataset_config: str | None, trust: bool) -> SampleLoader | JoinLoader:
    if leaf.join is not None:
        return JoinLoader(leaf.join, where=leaf.where, decoder=decoder, subflavors=dict(leaf.subflavors), trust_dataset_code=trust)
    return SampleLoader(
        leaf.path,
        leaf.split_part,
        dataset_config=leaf.dataset_config or dataset_config,
        split_config=leaf.split_config,
        decoder=decoder,
        subflavors=dict(leaf.subflavors),
        trust_dataset_code=trust,
    )


def _section(loader: SampleLoader | JoinLoader, title: str, decoder: SampleDecoder, indices: range, num_samples: int, offset: int, leaf: str | None = None) -> Section:
    shown = indices[offset : offset + num_samples]
    span = f"samples {shown[0]}..{shown[-1]}" if shown else "no samples"
    crude = _decodes_parts_itself(loader)
    if crude:
        loader.decoder = None  # raw parts: decoded one by one below, so one bad part keeps the rest
    samples = tuple(_load(loader, index, decoder if crude else None) for index in shown)
    return Section(f"{title}: {span} of {len(indices)}", samples, leaf=leaf)


def _decodes_parts_itself(loader: SampleLoader | JoinLoader) -> bool:
    """Whether the samples are crude dicts of parts that we may decode ourselves."""
    return isinstance(loader, SampleLoader) and loader.config is not None and loader.config.kind == "crude" and loader.sample_factory is None


def _load(loader: SampleLoader | JoinLoader, index: int, part_decoder: SampleDecoder | None) -> PreviewSample:
    try:
        sample = loader.load(index)
    except Exception as exc:  # noqa: BLE001 - the sample shows its error; the preview goes on
        key, shard = _where(loader, index)
        return PreviewSample(index, key, shard, error=f"{type(exc).__name__}: {exc}")
    if sample is None:
        key, shard = _where(loader, index)
        return PreviewSample(index, key, shard, excluded=True)
    key, shard = _sample_key(sample), _sample_shard(sample)
    return PreviewSample(index, key, shard, sample_fields(sample, part_decoder))


def _where(loader: SampleLoader | JoinLoader, index: int) -> tuple[str | None, str | None]:
    """The key and shard of a sample that did not load, where the tar still gives them."""
    reader = getattr(loader, "reader", None)
    if reader is None:
        return None, None
    try:
        raw = reader.read(index, wanted=frozenset())
    except Exception:  # noqa: BLE001 - the tar itself is broken there: the error says so already
        return None, None
    return (raw.key, raw.shard) if raw is not None else (None, None)


def _sample_key(sample: Any) -> str | None:
    key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
    return None if key is None else str(key)


def _sample_shard(sample: Any) -> str | None:
    if isinstance(sample, dict) and sample.get("__shard__") is not None:
        return str(sample["__shard__"])
    sources = sample.get("__sources__") if isinstance(sample, dict) else getattr(sample, "__sources__", None)
    return getattr(sources[0], "shard_name", None) if sources else None


def _field_types(sample_type: type) -> dict[str, Any]:
    """Resolved annotations of a sample class (the written ones where they cannot be resolved)."""
    try:
        return typing.get_type_hints(sample_type)
    except Exception:  # noqa: BLE001 - a forward reference we cannot resolve: show it as written
        return {f.name: f.type for f in dataclasses.fields(sample_type)}


def sample_fields(sample: Any, part_decoder: SampleDecoder | None = None) -> tuple[PreviewField, ...]:
    """The shown fields of a sample: a crude dict's parts (decoded with ``part_decoder`` when
    given), or a typed sample's fields with their annotations."""
    if isinstance(sample, (CrudeSample, dict)):
        key = str(sample.get("__key__", "?"))
        return tuple(PreviewField(name, None, _part_view(name, value, key, part_decoder)) for name, value in sample.items() if name not in HIDDEN_FIELDS)
    if not dataclasses.is_dataclass(sample):
        return (PreviewField("sample", type(sample).__name__, view_of(sample)),)
    types = _field_types(type(sample))
    return tuple(
        PreviewField(field.name, _type_label(types.get(field.name, field.type)), view_of(getattr(sample, field.name)))
        for field in dataclasses.fields(sample)
        if field.name not in HIDDEN_FIELDS
    )


def _type_label(annotation: Any) -> str | None:
    """A field's annotation as shown; ``Any`` says nothing (and the preview's decoded value, e.g. a
    PIL image, is not what the loader hands out), so it is not shown."""
    return None if annotation is typing.Any or annotation == "Any" else str(annotation)


def _part_view(name: str, value: Any, key: str, decoder: SampleDecoder | None) -> View:
    if decoder is None or name.startswith("__"):
        return view_of(value)
    try:
        value = decoder.decode_part(name, value, key=key)
    except Exception as exc:  # noqa: BLE001 - this part shows its error, the others their values
        return ErrorView(f"{type(exc).__name__}: {exc}")
    return view_of(value)
