"""One leaf dataset, by random access: split index -> decoded, typed sample.

This is the "load" step every pipeline starts from: read the sample's bytes (one read), keep
only the parts the dataset.yaml needs, decode them, and build the sample.  Works for prepared
WebDataset folders, prepared ``.jsonl`` files and Megatron ``.bin/.idx`` token datasets.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from typing import Any, Callable, Mapping

import numpy as np

from ..decode import SampleDecoder
from ..errors import ConfigError, DatasetError, NotSupportedError, format_message
from ..format.dataset_config import (
    TRUST_DATASET_CODE_ENV,
    DatasetConfig,
    dataset_code_trusted,
    load_dataset_config,
    make_sample,
    sample_class,
)
from ..format.indexed import indexed_prefix
from ..format.indexed_samples import IndexedSamples
from ..format.join import join_index
from ..format.jsonl import JsonlReader
from ..format.metadata import require_prepared
from ..format.metadataset import JoinSpec
from ..format.recorded_keys import key_mismatch_error
from ..format.resolved import ResolvedDataset
from ..format.split_reader import SplitReader
from ..policy import PLAIN, Policy
from ..samples import CrudeSample, Sample, SourceInfo, TokensSample
from ..storage import as_path
from ..worker import WorkerConfig
from .node import set_restore_key
from .runtime import Runtime

RESTORE_TAG = "Webdataset"  # Energon's tag for a raw sample's restore key
#: The tag a blend puts before its source index in an item's restore key (BlendNode.tag).
BLEND_TAG = "Blend"


def source_index(restore_key: tuple) -> int | None:
    """The split index of the one raw sample an item was made from, or None when it was made
    from several or a part of one (a generator's output, a join, a batch): the key is
    ``(tag, index)`` pairs of one-to-one stages ending with ``(RESTORE_TAG, index)``."""
    key = tuple(restore_key)
    if len(key) < 2 or len(key) % 2 or key[-2] != RESTORE_TAG:
        return None
    if not all(isinstance(key[i], str) and isinstance(key[i + 1], int) and not isinstance(key[i + 1], bool) for i in range(0, len(key), 2)):
        return None
    return key[-1]


def waiting_samples(keys: list, stage: str) -> list[tuple[int, int]]:
    """``(dataset, split index)`` of each sample a buffer holds (their JSON restore keys), for
    elastic resume: the dataset is the blend's source index in the key (0 without a blend); a
    buffered item that is not one whole sample cannot be moved."""
    samples = []
    for key in keys:
        key = tuple(key)
        index = source_index(key)
        if index is None:
            raise NotSupportedError(
                format_message(
                    f"the {stage} stage holds an item that is not one whole sample; it cannot be moved to another topology yet",
                    found=f"restore key {key!r}",
                    fix="restore on the topology the state was saved with",
                )
            )
        # source_index checked that the key is (tag, int) pairs.
        dataset = next((key[i + 1] for i in range(0, len(key), 2) if key[i] == BLEND_TAG), 0)
        samples.append((dataset, index))
    return samples


class SampleLoader:
    """Loads samples of one split of one dataset (a prepared folder, a ``.jsonl`` file or a
    Megatron ``.bin/.idx`` dataset)."""

    def __init__(
        self,
        path: str | os.PathLike,
        split_part: str = "train",
        *,
        dataset_config: str | None = None,
        split_config: str | None = None,
        decoder: SampleDecoder | None = None,
        subflavors: dict[str, Any] | None = None,
        trust_dataset_code: bool = False,
        policy: Policy = PLAIN,
        sample_factory: Any = None,
        factory_arguments: Mapping[str, Any] | None = None,
        resolved: ResolvedDataset | None = None,
        sequence_length: int | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        """``sample_factory``: a dataset factory whose ``load_sample`` builds the samples (one the
        user constructed). Without it, a ``dataset.yaml`` that names the user's own factory class
        gets an instance, made with ``factory_arguments`` (the loader's ``training``,
        ``worker_config`` ...; default: not training, one process). ``resolved``: the dataset's
        metadata as the loader read it (then none is read here). ``sequence_length``: a ``.bin/.idx``
        dataset's samples are token windows of this length (plus one) instead of documents.
        ``policy``: the loader's (``policy.py``: dataset code and shards outside the folder as
        Energon allows them). ``runtime``: the worker pipeline's (its clock times the decode
        apart from the read)."""
        self.runtime = Runtime() if runtime is None else runtime
        self.path = as_path(path)
        self.split_part = split_part
        self.decoder = decoder
        self.subflavors = dict(subflavors or {})
        self._jsonl: JsonlReader | None = None
        self._tokens: IndexedSamples | None = None
        self._reader: SplitReader | None = None
        self.config: DatasetConfig | None = None
        if self.path.suffix == ".jsonl" and self.path.is_file():
            self._jsonl = JsonlReader(self.path)  # a JSONL file is one split, always crude
            return
        prefix = resolved.indexed_prefix if resolved is not None else indexed_prefix(self.path)
        if prefix is not None:
            self._tokens = IndexedSamples(prefix, sequence_length)  # one split, typed TokensSamples
            return
        if (resolved is None or resolved.split is None) and self.path.is_file():  # resolved: it was a folder
            raise DatasetError(
                format_message(
                    "not a dataset",
                    where=str(self.path),
                    expected="a prepared dataset folder, a .jsonl file, a Megatron .bin/.idx dataset or a metadataset .yaml",
                )
            )
        if resolved is None:
            require_prepared(self.path)
            config = load_dataset_config(self.path, dataset_config, trust_dataset_code=trust_dataset_code, policy=policy)
            split_config = split_config or config.loader_options.get("split_config")
            split = None
        else:
            config, split_config, split = resolved.config, resolved.split_config, resolved.split
        self.config = config
        if sample_factory is not None:
            self.config = sample_factory.sample_config()  # its arguments may name other parts
        elif self.config.factory_class is not None:
            arguments = dict(factory_arguments or {"training": False, "worker_config": WorkerConfig(rank=0, world_size=1, num_workers=0)})
            sample_factory = self.config.make_factory(self.path, subflavors=self.subflavors, split_part=split_part, split_config=split_config, dataset_config=dataset_config, decoder=decoder, trust_dataset_code=trust_dataset_code, **arguments)
        self.sample_factory = sample_factory
        self._reader = SplitReader(self.path, split_part, split_config=split_config, split=split, policy=policy)

    def __len__(self) -> int:
        if self._jsonl is not None:
            return len(self._jsonl)
        return len(self._tokens) if self._tokens is not None else len(self._reader)

    @property
    def crude(self) -> bool:
        """Whether its samples are crude dicts that a cooker must turn into samples (JSONL always)."""
        return self._tokens is None and (self.config is None or self.config.kind == "crude")

    @property
    def reader(self) -> SplitReader | None:
        return self._reader

    def load(self, index: int, read_until: int | None = None, about: dict | None = None, *, check_key: bool = False) -> Sample | CrudeSample | None:
        """The sample at split index ``index``; None if ``split.yaml`` excludes its key.

        ``read_until``: the caller reads the samples up to this split index next (a hint that
        lets a remote read fetch them in the same request).  ``about``: filled with the sample's
        ``__key__`` and ``__sources__`` once its parts are read, so that an error handler told of
        a failure after that (a part that does not decode) can name the sample and its shard.
        ``check_key``: a read by random access, which must find the key the index recorded.
        """
        if self._jsonl is not None:
            return self._load_jsonl(index)
        if self._tokens is not None:
            return self._load_tokens(index, read_until, about)
        config = self.config
        raw = self._reader.read(index, wanted=config.wanted_parts, read_until=read_until, check_key=check_key)
        if raw is None:
            return None
        parts = raw.parts if config.wanted_parts is not None else {p: v for p, v in raw.parts.items() if config.keep_part(p)}
        source = SourceInfo(
            dataset_path=str(self.path),
            index=index,
            shard_name=raw.shard,
            file_names=tuple(f"{raw.key}.{p}" for p in parts),
        )
        if about is not None:
            about["__key__"], about["__sources__"] = raw.key, (source,)
        if self.sample_factory is not None:  # Energon's raw sample dict, parts undecoded
            raw_sample = {"__key__": raw.key, "__shard__": raw.shard, "__restore_key__": (RESTORE_TAG, index), "__sources__": (source,), **parts}
            return set_restore_key(self.sample_factory.load_sample(raw_sample), (RESTORE_TAG, index))
        clock = self.runtime.clock  # the loader's stall report times this item: time the decode apart from the read
        decoded = self._decode(parts, raw.key, raw.shard) if clock is None else clock.run("decode", None, self._decode, parts, raw.key, raw.shard)
        return make_sample(config, key=raw.key, decoded=decoded, restore_key=(RESTORE_TAG, index), source=source, subflavors=self.subflavors)

    @property
    def prefetch_depth(self) -> int:
        """Slices ahead a source should hand to :meth:`prefetch` (0: a local or non-tar dataset)."""
        return self._reader.prefetch_depth if self._reader is not None else 0

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """The split ranges read next, in order (see :meth:`SplitReader.prefetch`)."""
        if self._reader is not None:
            self._reader.prefetch(ranges)

    def discard_prefetched(self) -> None:
        if self._reader is not None:
            self._reader.discard_prefetched()

    def _decode(self, parts: dict[str, bytes], key: str, shard: str) -> dict[str, Any]:
        return self.decoder.decode(parts, key=key, dataset=str(self.path), shard=shard) if self.decoder is not None else dict(parts)

    def _load_jsonl(self, index: int) -> CrudeSample:
        sample = CrudeSample(json=self._jsonl.read(index))
        sample.update(
            __key__=str(index),
            __shard__=self.path.name,
            __restore_key__=(RESTORE_TAG, index),
            __sources__=(SourceInfo(str(self.path), index, self.path.name, (f"{index}.json",)),),
            __subflavors__=dict(self.subflavors) or None,  # as Energon: None without subflavors
        )
        return sample

    def _load_tokens(self, index: int, read_until: int | None, about: dict | None) -> TokensSample:
        import torch

        source = SourceInfo(str(self._tokens.reader.prefix), index, self._tokens.reader.bin_path.name, (str(index),))
        if about is not None:
            about["__key__"], about["__sources__"] = str(index), (source,)
        tokens = torch.from_numpy(self._tokens.tokens(index, read_until).astype(np.int64))
        return TokensSample(
            __key__=str(index),
            __restore_key__=(RESTORE_TAG, index),
            __sources__=(source,),
            __subflavors__=dict(self.subflavors) or None,
            tokens=tokens,
        )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._tokens is not None:
            self._tokens.close()


def resolve_joiner(spec: JoinSpec, where: str, *, trust_dataset_code: bool = False, policy: Policy = PLAIN) -> Callable[..., Any]:
    """The join's ``joiner``: a Sample type (its ``from_joined``) or a function.

    As for sample types in dataset.yaml, a module other than ours must already be imported by
    the program: a data file never makes us import code. A function must also come from the
    program's own code, not from the standard library or an installed package (a YAML file could
    otherwise call ``os.system`` with sample arguments), unless the caller trusts the dataset.
    """
    module, kind, name = spec.joiner
    if kind == "__class__":
        return sample_class(module, name, where=f"{where}.joiner").from_joined
    function = getattr(sys.modules.get(module), name, None)
    library = _library_module(module) if callable(function) else None
    if library is not None and not dataset_code_trusted(trust_dataset_code, dataset=where, policy=policy):
        raise ConfigError(
            format_message(
                f"joiner function {module}.{name} comes from {'the standard library' if library == 'stdlib' else 'an installed package'}",
                where=f"{where}.joiner",
                expected="a Sample class with from_joined, or a function of your program's own modules",
                found=f"{module}.{name}",
                fix=f"write a joiner function in your own code (or use __class__ of a Sample type); if you trust this metadataset, "
                f"pass trust_dataset_code=True or set {TRUST_DATASET_CODE_ENV}=1",
            )
        )
    if not callable(function):
        raise ConfigError(
            format_message(
                f"joiner function {module}.{name} is not available",
                where=f"{where}.joiner",
                expected="a function in a module your program has imported",
                found="module not imported" if module not in sys.modules else f"no callable {name!r}",
                fix=f"import {module} in your training script before loading the dataset",
            )
        )
    return function


def _library_module(module: str) -> str | None:
    """"stdlib" or "package" when ``module`` is part of Python or of an installed distribution
    (site-packages), else None (the program's own code)."""
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return "stdlib"
    file = getattr(sys.modules.get(module), "__file__", None)
    if file is None:
        return None
    resolved = os.path.realpath(file)
    libraries = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages()) | {site.getusersitepackages()}
    return "package" if any(resolved.startswith(os.path.realpath(lib) + os.sep) for lib in libraries) else None


class JoinLoader:
    """Loads the rows of a join: the primary sample and its matches, combined by the joiner.

    Row ``r`` is the ``r``-th primary sample that has its matches (see ``format/join.py``); its
    restore key is ``("Webdataset", r)``, so a join slots into the pipeline like one dataset.
    """

    #: Its samples are its joiner's, never crude (crude members are refused).
    crude = False

    def __init__(
        self,
        spec: JoinSpec,
        *,
        where: str,
        decoder: SampleDecoder | None = None,
        subflavors: dict[str, Any] | None = None,
        trust_dataset_code: bool = False,
        policy: Policy = PLAIN,
    ) -> None:
        self.spec = spec
        self.index = join_index(spec, policy=policy)
        self.loaders = [
            SampleLoader(m.path, m.split_part, dataset_config=m.dataset_config, split_config=m.split_config, decoder=decoder, subflavors=m.sample_subflavors(subflavors), trust_dataset_code=trust_dataset_code, policy=policy)
            for m in spec.members
        ]
        for member, loader in zip(spec.members, self.loaders):
            if loader.crude:
                raise ConfigError(format_message("crude datasets cannot be joined", where=member.where, expected="datasets with a typed dataset.yaml (sample_type and field_map)", fix="join typed datasets, or combine the parts in your cooker"))
        self.config = self.loaders[0].config
        self.joiner = resolve_joiner(spec, where, trust_dataset_code=trust_dataset_code, policy=policy)

    def __len__(self) -> int:
        return len(self.index)

    #: Rows map to scattered samples of each member: nothing to read ahead by slice.
    prefetch_depth = 0

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        pass

    def discard_prefetched(self) -> None:
        pass

    def load(self, row: int, read_until: int | None = None, about: dict | None = None, *, check_key: bool = False) -> Sample | None:
        samples = []  # rows map to scattered samples of each member: no read-ahead hint
        for m, (loader, index) in enumerate(zip(self.loaders, self.index.rows[row])):
            sample = loader.load(int(index), about=about if m == 0 else None, check_key=check_key) if index >= 0 else None
            if sample is None and m == 0:
                return None  # the primary sample is excluded by key
            if sample is not None and m > 0:
                self._check_key(m, sample, samples[0])
            samples.append(sample)
        if self.spec.names is not None:
            joined = self.joiner(**dict(zip(self.spec.names, samples)))
        else:
            joined = self.joiner(*samples)
        return set_restore_key(joined, (RESTORE_TAG, row))

    def _check_key(self, m: int, sample: Any, primary: Any) -> None:
        """The index pairs samples by key from ``index.sqlite``; the shard is read through its
        ``.tar.idx``. Both go stale when a shard is rewritten: compare the keys actually read."""
        expected, found = getattr(primary, "__key__", None), getattr(sample, "__key__", None)
        if found != expected:
            member = self.spec.members[m]
            source = (getattr(sample, "__sources__", None) or (None,))[0]
            raise key_mismatch_error(
                member.path,
                what="a joined dataset's sample does not have the primary sample's key: its index no longer matches its shards",
                where=f"{member.where}: {member.path}" + (f" shard {source.shard_name}" if source is not None else ""),
                expected=f"key {expected!r}",
                found=f"key {found!r}",
            )

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()
