"""``.nv-meta/dataset.yaml`` -> a sample factory: which parts to read and how to build a sample.

Three forms, as in Energon 7.4 (research/energon.md 2.1-2.6):

* field map: ``sample_type: {__module__, __class__}`` and ``field_map: {field: expression}``
  where an expression is ``part``, ``part[key][0]`` (JSON access) or alternatives ``jpg,png``;
* crude: ``__class__: CrudeWebdataset`` -> a plain dict of decoded parts;
* sample loader (legacy): ``sample_loader: file.py:function``.  This executes code shipped with
  the dataset, so it only runs when the caller trusts it: ``trust_dataset_code=True`` (CLI:
  ``--trust-dataset-code``), ``ENERGON_LITE_TRUST_DATASET_CODE=1`` in the environment (for
  programs you cannot edit), or Energon mode (``import megatron_energon_lite.as_energon``),
  which runs it as Energon does and logs once per dataset.

Class names under ``__module__: megatron.energon`` (or ``megatron_energon_lite``) are looked up
in our sample registry; other modules must already be imported by the user's program (we never
import a module because a data file names it, unless the caller trusts the dataset's code).

A fourth form names the user's own factory class (``__module__: my.pkg``, ``__class__:
MyWebdataset``, a subclass of one of Energon's ``*WebdatasetFactory`` classes): the other keys are
its constructor's keyword arguments, and its ``load_sample`` builds each sample.  Energon's factory
classes live in the Energon layer above this module; they derive from :class:`DatasetFactory`,
which is how a class named here is told to be a factory, and offer what the loader calls on one
(:class:`SampleFactory`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol

import yaml

from ..errors import ConfigError, DecodeError, format_message
from ..policy import PLAIN, Policy
from ..samples import (
    CrudeSample,
    Sample,
    SourceInfo,
    registered_sample_types,
    sample_type_by_name,
)
from .metadata import DATASET_YAML, check_mapping, load_structured, meta_dir

logger = logging.getLogger(__name__)

#: Set to 1 to run a dataset's ``sample_loader.py`` without editing the program.
TRUST_DATASET_CODE_ENV = "ENERGON_LITE_TRUST_DATASET_CODE"

_OUR_MODULES = ("megatron.energon", "megatron_energon_lite")
_CRUDE_CLASSES = ("CrudeWebdataset", "DefaultCrudeJsonlDatasetFactory", "CrudeJsonlDatasetFactory")
_STANDARD_FACTORIES = ("StandardWebdatasetFactory", "DefaultDecoderWebdatasetFactory")
# Legacy Energon factories: the class name implies the sample type.
_LEGACY_FACTORIES = {
    "CaptioningWebdataset": "CaptioningSample",
    "ImageWebdataset": "ImageSample",
    "TextWebdataset": "TextSample",
    "VQAWebdataset": "VQASample",
    "OCRWebdataset": "OCRSample",
    "VidQAWebdataset": "VidQASample",
    "InterleavedWebdataset": "InterleavedSample",
    "MultiChoiceVQAWebdataset": "MultiChoiceVQASample",
    "SimilarityInterleavedWebdataset": "SimilarityInterleavedSample",
    "ImageClassificationWebdataset": "ImageClassificationSample",
    "VQAOCRWebdataset": "VQAOCRSample",
}
# Keys every factory accepts besides its own; the loader reads them as defaults.
_LOADER_KEYS = ("split_config", "shuffle_over_epochs", "parallel_shard_iters", "max_samples_per_sequence")

_ACCESS_STEP = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class FieldAccess:
    """One parsed field-map expression: alternatives of ``(part, path...)``."""

    expression: str
    alternatives: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, expression: str, *, where: str) -> "FieldAccess":
        alternatives = []
        for alternative in expression.split(","):
            alternative = alternative.strip()
            part, _, rest = alternative.partition("[")
            rest = "[" + rest if rest else ""
            steps = tuple(_ACCESS_STEP.findall(rest))
            if not part or _ACCESS_STEP.sub("", rest):
                raise ConfigError(
                    format_message(
                        "invalid field_map expression",
                        where=where,
                        expected="PART, PART[key][0] or alternatives PART1,PART2",
                        found=repr(expression),
                    )
                )
            alternatives.append((part, steps))
        return cls(expression, tuple(alternatives))

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(part for part, _ in self.alternatives)

    def get(self, decoded: Mapping[str, Any]) -> Any:
        """The value from the first alternative that exists; raises KeyError when none does."""
        last_error: Exception | None = None
        for part, steps in self.alternatives:
            try:
                value = decoded[part]
                for step in steps:
                    value = value[int(step)] if isinstance(value, (list, tuple)) else value[step]
                return value
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                last_error = exc
        raise KeyError(f"{self.expression!r}: {last_error!r}")


class DatasetFactory:
    """A dataset factory class that a ``dataset.yaml`` may name with ``__module__``/``__class__``.

    Energon's ``BaseCoreDatasetFactory`` (:mod:`megatron_energon_lite.energon.flavors`, built on this
    module) derives from it, so every Energon factory class and a user's subclass of one is a
    ``DatasetFactory``; any other class a data file names is refused.
    """

    #: Its ``dataset.yaml`` is a crude one (parts decoded into a :class:`CrudeSample` for the
    #: cookers, whatever ``__sample_type__`` says): Energon's ``CrudeWebdataset`` and subclasses.
    yields_crude_samples: ClassVar[bool] = False


class SampleFactory(Protocol):
    """What the loader uses of a user's factory whose ``load_sample`` builds the samples (made by
    :meth:`DatasetConfig.make_factory`, or constructed by the user)."""

    subflavors: dict[str, Any]

    def sample_config(self) -> DatasetConfig:
        """Which parts to read and how samples are filled (its ``dataset.yaml``, or its arguments)."""

    def load_sample(self, raw: dict[str, Any]) -> Any:
        """The sample from Energon's raw sample dict (``__key__``, ``__restore_key__``, parts)."""


@dataclass
class DatasetConfig:
    """A parsed ``dataset.yaml``."""

    path: Path
    kind: str  # "field_map" | "crude" | "sample_loader" | "custom" (a user factory's own load_sample)
    sample_type: type | None = None
    field_map: dict[str, FieldAccess] = field(default_factory=dict)
    subflavors: dict[str, Any] = field(default_factory=dict)
    part_filter: frozenset[str] | Callable[[str], bool] | None = None
    sample_loader: Callable[[dict], dict] | None = None
    loader_options: dict[str, Any] = field(default_factory=dict)
    #: The user's factory class named by ``__module__``/``__class__`` (None: one of ours), and
    #: the other keys of the file: its constructor's keyword arguments.
    factory_class: type[DatasetFactory] | None = None
    factory_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def yields(self) -> type | None:
        """The type of the samples, before cooking: :class:`CrudeSample` for a crude dataset."""
        return CrudeSample if self.kind == "crude" else self.sample_type

    def make_factory(self, root: Any, *, subflavors: Mapping[str, Any] | None = None, **arguments: Any) -> SampleFactory:
        """An instance of the user's factory class for the dataset at ``root``, as Energon makes it:
        the loader's ``arguments`` (split_part, training, worker_config, decoder, ...) overridden
        by the file's keys; then the caller's ``subflavors`` (a metadataset's) merged over the
        file's."""
        try:
            factory = self.factory_class(root, **{**arguments, **self.factory_kwargs})
        except TypeError as exc:
            raise ConfigError(
                format_message(
                    f"cannot construct the dataset factory {self.factory_class.__module__}.{self.factory_class.__qualname__}",
                    where=str(self.path),
                    expected=f"keys its __init__ accepts (besides the loader's {', '.join(sorted(arguments))})",
                    found=str(exc),
                    fix="fix the keys of dataset.yaml, or the factory's __init__ (accept **kwargs and pass them to super().__init__)",
                )
            ) from None
        factory.subflavors.update(subflavors or {})
        return factory

    @property
    def wanted_parts(self) -> frozenset[str] | None:
        """Parts to copy out of the tar (None = all); parts nothing needs are never decoded."""
        if isinstance(self.part_filter, frozenset) or self.part_filter is None:
            return self.part_filter
        return None

    def keep_part(self, part: str) -> bool:
        if self.part_filter is None:
            return True
        if isinstance(self.part_filter, frozenset):
            return part in self.part_filter
        return bool(self.part_filter(part))


def resolve_class(spec: Any, *, file: str, key_path: str) -> tuple[str, str]:
    """``{__module__, __class__}`` -> (module, class name), checked for shape."""
    check_mapping(spec, file=file, key_path=key_path, allowed=("__module__", "__class__"), required=("__class__",))
    return str(spec.get("__module__", "megatron.energon")), str(spec["__class__"])


def sample_class(module: str, name: str, *, where: str) -> type:
    if _is_ours(module):
        found = sample_type_by_name(name)
        if found is None:
            raise ConfigError(
                format_message(
                    f"unknown sample type {name!r}",
                    where=where,
                    expected=f"one of {', '.join(registered_sample_types())}",
                    found=name,
                    fix="fix the class name, or register your own type with register_sample_type",
                )
            )
        return found
    user_module = sys.modules.get(module)
    cls = getattr(user_module, name, None) if user_module is not None else None
    if not (isinstance(cls, type) and issubclass(cls, Sample)):
        raise ConfigError(
            format_message(
                f"sample type {module}.{name} is not available",
                where=where,
                expected="a Sample subclass in a module your program has imported",
                found="module not imported" if user_module is None else f"{name} is not a Sample subclass",
                fix=f"import {module} in your training script before loading the dataset",
            )
        )
    return cls


def load_dataset_config(
    root: str | Path,
    name: str | None = None,
    *,
    trust_dataset_code: bool = False,
    policy: Policy = PLAIN,
) -> DatasetConfig:
    """Parses ``.nv-meta/<name or dataset.yaml>`` of the dataset at ``root`` (``policy``: whether
    dataset code may also run as Energon runs it, see :func:`dataset_code_trusted`)."""
    path = meta_dir(root) / (name or DATASET_YAML)
    raw = load_structured(path)
    file = str(path)
    if not isinstance(raw, Mapping):
        raise ConfigError(format_message("expected a mapping", where=file, found=repr(raw)[:80]))
    factory_module, factory = str(raw.get("__module__", "megatron.energon")), raw.get("__class__")
    if factory in _CRUDE_CLASSES:
        check_mapping(raw, file=file, key_path="", allowed=("__module__", "__class__", "subflavors", "part_filter", *_LOADER_KEYS))
        return DatasetConfig(
            path=path,
            kind="crude",
            subflavors=_subflavors(raw, file),
            part_filter=_part_filter(raw.get("part_filter"), path, trust_dataset_code, policy),
            loader_options=_loader_options(raw),
        )
    if factory is not None and not _is_ours(factory_module):
        return _user_factory_config(raw, path, factory_module, str(factory), trust_dataset_code, policy)
    if factory is not None and factory not in _STANDARD_FACTORIES and factory not in _LEGACY_FACTORIES:
        raise ConfigError(
            format_message(
                f"unknown dataset factory {factory_module}.{factory}",
                where=f"{file}: __class__",
                expected=f"CrudeWebdataset, {', '.join(_STANDARD_FACTORIES)}, or a legacy XxxWebdataset",
                found=str(factory),
            )
        )
    allowed = ["__module__", "__class__", "sample_type", "field_map", "sample_loader", "part_filter", "subflavors", *_LOADER_KEYS]
    if factory in _LEGACY_FACTORIES:
        check_mapping(raw, file=file, key_path="", allowed=allowed, required=())
        sample_type = sample_type_by_name(_LEGACY_FACTORIES[factory])
    else:
        check_mapping(raw, file=file, key_path="", allowed=allowed, required=("sample_type",))
        module, name_ = resolve_class(raw["sample_type"], file=file, key_path="sample_type")
        sample_type = sample_class(module, name_, where=f"{file}: sample_type")
    return sample_fields_config(raw, sample_type, path, trust_dataset_code=trust_dataset_code, policy=policy)


def sample_fields_config(
    raw: Mapping[str, Any],
    sample_type: type,
    path: Path,
    *,
    trust_dataset_code: bool = False,
    optional: bool = False,
    policy: Policy = PLAIN,
) -> DatasetConfig:
    """How to fill ``sample_type`` from a sample's parts: exactly one of ``raw["field_map"]`` and
    ``raw["sample_loader"]`` (a ``FILE.py:FUNCTION`` in ``.nv-meta/``, or a function given in code),
    with ``part_filter`` and ``subflavors`` (the keys of a ``dataset.yaml``, or a factory's
    arguments). ``optional``: neither is fine (kind ``custom``: the factory's ``load_sample``
    builds the sample; parts: ``part_filter``, else all)."""
    file = str(path)
    has_map, has_loader = raw.get("field_map") is not None, raw.get("sample_loader") is not None
    common = dict(path=path, sample_type=sample_type, subflavors=_subflavors(raw, file), loader_options=_loader_options(raw))
    if optional and not has_map and not has_loader:
        return DatasetConfig(kind="custom", part_filter=_part_filter(raw.get("part_filter"), path, trust_dataset_code, policy), **common)
    if has_map == has_loader:
        raise ConfigError(
            format_message(
                "dataset.yaml needs exactly one of field_map and sample_loader",
                where=file,
                found="both" if has_map else "neither",
                fix="add a field_map such as {image: jpg, caption: txt}",
            )
        )
    if has_map:
        field_map = _field_map(raw["field_map"], sample_type, file)
        parts = frozenset(p for access in field_map.values() for p in access.parts)
        return DatasetConfig(kind="field_map", field_map=field_map, part_filter=parts, **common)
    if raw.get("part_filter") is None:
        raise ConfigError(
            format_message(
                "a sample_loader needs a part_filter",
                where=file,
                fix="add part_filter: [jpg, txt] or part_filter: sample_loader.py:part_filter",
            )
        )
    loader = raw["sample_loader"]
    return DatasetConfig(
        kind="sample_loader",
        sample_loader=loader if callable(loader) else _load_function(loader, path, trust_dataset_code, "sample_loader", policy),
        part_filter=_part_filter(raw["part_filter"], path, trust_dataset_code, policy),
        **common,
    )


def _is_ours(module: str) -> bool:
    return module in _OUR_MODULES or module.startswith(tuple(m + "." for m in _OUR_MODULES))


def _user_factory_config(raw: Mapping[str, Any], path: Path, module: str, name: str, trust_dataset_code: bool, policy: Policy) -> DatasetConfig:
    """``__module__: my.pkg`` / ``__class__: MyWebdataset``: the user's factory class, taken from a
    module the program imported (or imported here when the caller trusts the dataset's code)."""
    file = str(path)
    where = f"{file}: __class__"
    if module not in sys.modules and dataset_code_trusted(trust_dataset_code, dataset=str(path.parent.parent), policy=policy):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(format_message(f"cannot import module {module!r} named by dataset.yaml", where=f"{file}: __module__", found=str(exc), fix=f"install the package that provides {module}, or fix __module__")) from None
    cls = getattr(sys.modules.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, DatasetFactory)):
        raise ConfigError(
            format_message(
                f"dataset factory {module}.{name} is not available",
                where=where,
                expected="a subclass of one of Energon's dataset factories (e.g. DefaultDecoderWebdatasetFactory) in a module your program has imported",
                found="module not imported" if module not in sys.modules else f"{name} is {'missing' if cls is None else 'not a dataset factory'}",
                fix=f"import {module} in your training script before loading the dataset (importing it because a data file names it runs code: "
                f"trust_dataset_code=True or {TRUST_DATASET_CODE_ENV}=1 allows that)",
            )
        )
    kwargs = {k: v for k, v in raw.items() if k not in ("__module__", "__class__")}
    if cls.yields_crude_samples:
        config = DatasetConfig(path=path, kind="crude", subflavors=_subflavors(raw, file), part_filter=_part_filter(raw.get("part_filter"), path, trust_dataset_code, policy), loader_options=_loader_options(raw))
    else:
        sample_type = getattr(cls, "__sample_type__", None)
        if raw.get("field_map") is not None and not dataclasses.is_dataclass(sample_type):
            raise ConfigError(format_message(f"{module}.{name} has a field_map but no sample type", where=f"{file}: field_map", expected="__sample_type__ = a Sample dataclass on the factory class", found=repr(sample_type)))
        config = sample_fields_config(raw, sample_type, path, trust_dataset_code=trust_dataset_code, optional=True, policy=policy)
    config.factory_class = cls
    config.factory_kwargs = kwargs
    return config


def _subflavors(raw: Mapping, file: str) -> dict[str, Any]:
    value = raw.get("subflavors") or {}
    check_mapping(value, file=file, key_path="subflavors", allowed=None)
    return dict(value)


def _loader_options(raw: Mapping) -> dict[str, Any]:
    return {k: raw[k] for k in _LOADER_KEYS if k in raw}


def _field_map(raw: Any, sample_type: type, file: str) -> dict[str, FieldAccess]:
    names = [f.name for f in dataclasses.fields(sample_type) if not f.name.startswith("__")]
    check_mapping(raw, file=file, key_path="field_map", allowed=names)
    result = {}
    for field_name, expression in raw.items():
        if not isinstance(expression, str):
            raise ConfigError(
                format_message(
                    "field_map values must be strings",
                    where=f"{file}: field_map.{field_name}",
                    found=repr(expression),
                )
            )
        result[field_name] = FieldAccess.parse(expression, where=f"{file}: field_map.{field_name}")
    return result


def _part_filter(value: Any, path: Path, trust: bool, policy: Policy) -> frozenset[str] | Callable[[str], bool] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    if isinstance(value, str):
        return _load_function(value, path, trust, "part_filter", policy)
    if callable(value):  # given in code (a factory's argument)
        return value
    raise ConfigError(
        format_message(
            "invalid part_filter",
            where=f"{path}: part_filter",
            expected="a list of part names or FILE.py:FUNCTION",
            found=repr(value),
        )
    )


def dataset_code_trusted(trust_dataset_code: bool, *, dataset: str, policy: Policy = PLAIN) -> bool:
    """Whether a dataset's own Python code may run: the argument, ``ENERGON_LITE_TRUST_DATASET_CODE=1``
    or Energon's ``policy`` (the last two log once per dataset, since nobody asked in the call)."""
    return trust_dataset_code or policy.opted_in(TRUST_DATASET_CODE_ENV, f"dataset-code:{dataset}", f"running the Python code of dataset {dataset}")


def _load_function(spec: Any, path: Path, trust: bool, key: str, policy: Policy) -> Callable:
    if not isinstance(spec, str):
        raise ConfigError(format_message(f"invalid {key}", where=f"{path}: {key}", expected="FILE.py:FUNCTION", found=repr(spec)))
    file_name, _, function = spec.partition(":")
    function = function or key
    if not dataset_code_trusted(trust, dataset=str(path.parent.parent), policy=policy):
        raise ConfigError(
            format_message(
                f"dataset.yaml uses {key} from {file_name}, which runs Python code shipped with the dataset",
                where=f"{path}: {key}",
                fix=f"if you trust this dataset, pass trust_dataset_code=True to get_train_dataset / get_val_dataset "
                f"(CLI: --trust-dataset-code), or set {TRUST_DATASET_CODE_ENV}=1 in the environment for a program "
                "you cannot edit; otherwise convert it to a field_map",
            )
        )
    module_path = path.parent / file_name
    module_spec = importlib.util.spec_from_file_location(f"_dataset_code_{abs(hash(module_path))}", module_path)
    if module_spec is None or not module_path.is_file():
        raise ConfigError(format_message(f"{key} file not found", where=str(module_path)))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(format_message(f"{module_path} has no function {function!r}", where=f"{path}: {key}"))
    return fn


def make_sample(
    config: DatasetConfig,
    *,
    key: str,
    decoded: dict[str, Any],
    restore_key: tuple,
    source: SourceInfo,
    subflavors: dict[str, Any] | None = None,
) -> Sample | CrudeSample:
    """Builds the typed (or crude) sample from decoded parts."""
    flavors = {**config.subflavors, **(subflavors or {})}
    if config.kind == "crude":
        sample = CrudeSample(decoded)
        sample.update(
            __key__=key, __shard__=source.shard_name, __restore_key__=restore_key, __sources__=(source,), __subflavors__=flavors
        )
        return sample
    if config.kind == "sample_loader":
        raw = {"__key__": key, "__shard__": source.shard_name, "__restore_key__": restore_key, **decoded}
        fields = {"__key__": key, **config.sample_loader(raw), "__restore_key__": restore_key}
    else:
        fields = {"__key__": key, "__restore_key__": restore_key}
        for name, access in config.field_map.items():
            try:
                fields[name] = access.get(decoded)
            except KeyError as exc:
                raise DecodeError(
                    format_message(
                        f"field {name!r} cannot be filled",
                        where=f"{source.dataset_path} shard {source.shard_name} sample {key!r}",
                        expected=f"field_map {name}: {access.expression}",
                        # Only the parts field_map reads are loaded: say so, lest the list read as the sample's all.
                        found=f"{exc.args[0]} (of the parts field_map reads, the sample has: {', '.join(sorted(decoded)) or 'none'})",
                        fix="fix field_map in dataset.yaml (`energon-lite info` lists the part types the shards hold) or exclude the sample in split.yaml",
                    )
                ) from None
    fields["__subflavors__"] = flavors
    fields["__sources__"] = (source,)
    try:
        return config.sample_type(**fields)
    except TypeError as exc:
        raise DecodeError(
            format_message(
                f"cannot build {config.sample_type.__name__}",
                where=f"{source.dataset_path} shard {source.shard_name} sample {key!r}",
                found=str(exc),
                fix="map every required field in field_map",
            )
        ) from None


def dataset_sample_type(root: str | Path, name: str | None = None, *, trust_dataset_code: bool = False, policy: Policy = PLAIN) -> type:
    """The type of the samples a dataset yields before cooking: :class:`CrudeSample` for a crude
    dataset or a ``.jsonl`` file, else the ``sample_type`` its ``dataset.yaml`` names."""
    if str(root).endswith(".jsonl"):
        return CrudeSample
    return load_dataset_config(root, name, trust_dataset_code=trust_dataset_code, policy=policy).yields


def require_sample_type(found: type, wanted: type, *, where: str, reader: str | None = None) -> None:
    """Refuses a dataset yielding ``found`` where ``wanted`` (or a subclass) is needed; ``reader``
    names the factory class that needs it (default: the ``sample_type`` argument)."""
    if not isinstance(wanted, type):
        raise ConfigError(format_message("sample_type must be a class", where=where, found=repr(wanted)[:80], fix="pass e.g. sample_type=CaptioningSample"))
    if isinstance(found, type) and issubclass(found, wanted):
        return
    name = getattr(found, "__name__", repr(found))
    raise ConfigError(
        format_message(
            f"{reader} reads {wanted.__name__} samples, but the dataset yields {name}" if reader else f"the dataset yields {name}, not the sample_type {wanted.__name__}",
            where=where,
            expected=f"{wanted.__name__} or a subclass",
            found=f"{getattr(found, '__module__', '?')}.{getattr(found, '__qualname__', name)}",
            fix="use the factory class of the dataset's sample type (get_dataset_from_config picks it from dataset.yaml), or fix dataset.yaml"
            if reader
            else "pass the dataset's sample type, or fix sample_type in its .nv-meta/dataset.yaml",
        )
    )


def render_dataset_yaml(sample_type: str, field_map: Mapping[str, str] | None) -> str:
    """The text of a ``dataset.yaml`` that both Energon and we load."""
    if sample_type in _CRUDE_CLASSES:
        return yaml.safe_dump({"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}, sort_keys=False)
    data: dict[str, Any] = {"sample_type": {"__module__": "megatron.energon", "__class__": sample_type}}
    if field_map is not None:
        data["field_map"] = dict(field_map)
    return yaml.safe_dump(data, sort_keys=False)
