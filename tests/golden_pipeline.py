"""The golden pipeline record: shared by ``tests/data/make_golden_pipeline.py`` (which writes
``tests/data/golden_pipeline.json``) and ``tests/test_golden_pipeline.py`` (which checks today's
code against it).

:func:`make_data` writes small synthetic datasets (fixed seeds: the same bytes every run);
:func:`run_config` runs one of :data:`CONFIGS` with 0 or 2 workers and returns, as plain JSON,
what the loader did: per batch its keys, restore key and a digest of its content, the state
saved after the steps in :data:`SAVE_AFTER`, and the batches a fresh loader restored from the
state after step :data:`RESTORE_FROM` reads.  Machine-specific values are replaced by
placeholders (:func:`normalise`): the temporary data folder by ``<DATA>`` and the installed PyAV
version in the decoder fingerprint by ``<AV_BACKEND>``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from energon_lite_dev.synthetic import prepared_text_dataset

import megatron_energon_lite
from megatron_energon_lite import (
    DefaultTaskEncoder,
    SavableDataLoader,
    TextSample,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    stateless,
)
from megatron_energon_lite.encoders import TextPackingTaskEncoder

__all__ = [
    "CONFIGS",
    "GOLDEN",
    "RESTORE_FROM",
    "RESTORE_STEPS",
    "SAVE_AFTER",
    "STEPS",
    "WORKERS",
    "data_digests",
    "make_data",
    "normalise",
    "record",
    "run_config",
]

#: The recorded behaviour, next to the script that writes it.
GOLDEN = Path(__file__).parent / "data" / "golden_pipeline.json"
#: Batches read per configuration.
STEPS = 12
#: Steps (0-based batch indices) after which the loader's state is saved.
SAVE_AFTER = (0, 3, 8)
#: The saved state a fresh loader restores, and how many batches it then reads (4..7).
RESTORE_FROM = 3
RESTORE_STEPS = 4
#: Dataloader worker counts every configuration runs with.
WORKERS = (0, 2)

DATA_PLACEHOLDER = "<DATA>"
AV_BACKEND_PLACEHOLDER = "<AV_BACKEND>"
#: A state's ``writer`` (our version) is who wrote it, not what the loader does.
WRITER_PLACEHOLDER = "<WRITER>"

BLEND_HEADER = "__module__: megatron.energon\n__class__: MetadatasetV2\n"
PACK_LENGTH = 48


# -- data ----------------------------------------------------------------------------------------


def _blend_yaml(mode: str) -> str:
    """A metadataset blending datasets A and B 2:1 in ``blend_mode`` ``mode``."""
    entries = "".join(f"      - weight: {weight}\n        path: ./{name}\n        split_part: train\n" for name, weight in (("A", 2), ("B", 1)))
    return f"{BLEND_HEADER}splits:\n  train:\n    blend_mode: {mode}\n    blend:\n{entries}"


def make_data(root: Path) -> Path:
    """Writes the datasets every configuration reads under ``root`` and returns ``root``.

    ``text``: 6 shards of 10 samples (1-12 words), split 2:1:0 by shard into train and val;
    ``A`` (3 shards of 8) and ``B`` (2 shards of 7): train-only text datasets whose keys start
    with their name; ``blend_exact.yaml`` and ``blend_random.yaml`` blend them 2:1.
    """
    root = Path(root)
    prepared_text_dataset(root / "text", split_ratio=(2, 1, 0), num_shards=6, samples_per_shard=10, min_words=1, max_words=12, seed=20)
    prepared_text_dataset(root / "A", num_shards=3, samples_per_shard=8, min_words=1, max_words=8, seed=21, key_pattern="A{shard:02d}_{index:03d}")
    prepared_text_dataset(root / "B", num_shards=2, samples_per_shard=7, min_words=1, max_words=8, seed=22, key_pattern="B{shard:02d}_{index:03d}")
    for mode in ("exact", "random"):
        (root / f"blend_{mode}.yaml").write_text(_blend_yaml(mode))
    return root


def data_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every shard and YAML file :func:`make_data` wrote (relative path -> hex digest),
    so that a change of the synthetic data is not mistaken for a change of the loader."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".tar", ".yaml") and ".nv-meta" not in p.parts)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# -- task encoders -------------------------------------------------------------------------------


def byte_tokens(text: str) -> list[int]:
    """A byte-level tokenizer: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


class LengthGroupingEncoder(DefaultTaskEncoder):
    """Batches texts by length: under 6 words in batches of the loader's ``batch_size``, longer
    ones in batches of 2."""

    @stateless
    def batch_group_criterion(self, sample: TextSample) -> tuple[str, int | None]:
        return ("short", None) if len(sample.text.split()) < 6 else ("long", 2)


# -- configurations ------------------------------------------------------------------------------


def _config(workers: int) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def _plain(root: Path, workers: int) -> SavableDataLoader:
    ds = get_train_dataset(root / "text", batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=2, worker_config=_config(workers))
    return get_savable_loader(ds)


def _blend(mode: str) -> Callable[[Path, int], SavableDataLoader]:
    def make(root: Path, workers: int) -> SavableDataLoader:
        ds = get_train_dataset(root / f"blend_{mode}.yaml", batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=3, worker_config=_config(workers))
        return get_savable_loader(ds)

    return make


def _packing(root: Path, workers: int) -> SavableDataLoader:
    ds = get_train_dataset(
        root / "text",
        batch_size=2,
        shuffle_buffer_size=4,
        max_samples_per_sequence=3,
        packing_buffer_size=6,
        task_encoder=TextPackingTaskEncoder(byte_tokens, PACK_LENGTH),
        worker_config=_config(workers),
    )
    return get_savable_loader(ds)


def _grouping(root: Path, workers: int) -> SavableDataLoader:
    ds = get_train_dataset(
        root / "text", batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=2, task_encoder=LengthGroupingEncoder(), worker_config=_config(workers)
    )
    return get_savable_loader(ds)


def _val(root: Path, workers: int) -> SavableDataLoader:
    """The val split (20 samples): 12 batches of 3 run into its second pass."""
    return get_loader(get_val_dataset(root / "text", batch_size=3, worker_config=_config(workers)))


#: Configuration name -> a function of (data root, workers) that makes its loader.
CONFIGS: dict[str, Callable[[Path, int], SavableDataLoader]] = {
    "plain_text": _plain,
    "blend_exact": _blend("exact"),
    "blend_random": _blend("random"),
    "text_packing": _packing,
    "length_grouping": _grouping,
    "val_get_loader": _val,
}


# -- recording -----------------------------------------------------------------------------------


def _plain_json(value: Any) -> Any:
    """Tuples (restore keys) as lists, so that a value compares equal after a JSON round trip."""
    return json.loads(json.dumps(value))


def normalise(value: Any, root: Path) -> Any:
    """``value`` (plain JSON) with the data folder ``root`` written as ``<DATA>`` in every string
    the decoder's ``av_backend`` (the installed PyAV version) as ``<AV_BACKEND>`` and a state's
    ``writer`` (our version) as ``<WRITER>``."""
    prefix = str(root)
    if isinstance(value, dict):
        placeholders = {"av_backend": AV_BACKEND_PLACEHOLDER, "writer": WRITER_PLACEHOLDER}
        return {k: placeholders[k] if k in placeholders else normalise(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(prefix, DATA_PLACEHOLDER)
    return value


def _content(value: Any, root: Path) -> Any:
    """A batch as plain JSON for its digest: fields in declaration order, tensors and arrays as
    dtype, shape and the SHA-256 of their bytes, the data folder as ``<DATA>``."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {"dtype": str(array.dtype), "shape": list(array.shape), "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **{f.name: _content(getattr(value, f.name), root) for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):
        return {str(k): _content(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_content(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(str(root), DATA_PLACEHOLDER)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"no golden record for a {type(value).__name__} in a batch")


def _digest(batch: Any, root: Path) -> str:
    text = json.dumps(_content(batch, root), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _identity(batch: Any, pass_index: int, root: Path) -> dict[str, Any]:
    """What identifies a batch: the loader pass it came in, its keys (a packed batch: also its
    packs' sample keys), its restore key and a digest of its whole content."""
    out: dict[str, Any] = {"pass": pass_index, "keys": _plain_json(batch.__key__)}
    sample_keys = getattr(batch, "sample_keys", None)
    if sample_keys is not None:
        out["sample_keys"] = _plain_json(sample_keys)
    out["restore_key"] = normalise(_plain_json(batch.__restore_key__), root)
    out["digest"] = _digest(batch, root)
    return out


def _read(
    loader: SavableDataLoader, steps: int, root: Path, *, save_after: Iterable[int] = (), first_pass: int = 0
) -> tuple[list[dict[str, Any]], dict[int, dict]]:
    """``steps`` batches of ``loader``, going on into the next pass when one ends, and the raw
    states (through JSON) saved after the steps in ``save_after``."""
    save_after = set(save_after)
    batches: list[dict[str, Any]] = []
    states: dict[int, dict] = {}
    pass_index = first_pass
    while len(batches) < steps:
        before = len(batches)
        for batch in loader:
            batches.append(_identity(batch, pass_index, root))
            if len(batches) - 1 in save_after:
                states[len(batches) - 1] = _plain_json(loader.save_state_rank())
            if len(batches) == steps:
                break
        else:
            if len(batches) == before:
                raise RuntimeError(f"a pass of the loader was empty after {before} batches")
            pass_index += 1
    return batches, states


def run_config(name: str, workers: int, root: Path) -> dict[str, Any]:
    """Runs configuration ``name`` with ``workers`` workers on the data :func:`make_data` wrote at
    ``root``: the batches, the normalised states (by step, as strings) and the batches restored."""
    make = CONFIGS[name]
    root = Path(root)
    batches, states = _read(make(root, workers), STEPS, root, save_after=SAVE_AFTER)
    fresh = make(root, workers)
    fresh.restore_state_rank(states[RESTORE_FROM])
    restored, _ = _read(fresh, RESTORE_STEPS, root, first_pass=batches[RESTORE_FROM]["pass"])
    return {
        "batches": batches,
        "states": {str(step): normalise(state, root) for step, state in sorted(states.items())},
        f"restored_from_{RESTORE_FROM}": restored,
    }


def record(root: Path) -> dict[str, Any]:
    """Every configuration with every worker count on the data at ``root`` (see :func:`make_data`)."""
    return {
        "about": (
            "Iteration order and checkpoint shape of today's loader (tests/test_golden_pipeline.py); "
            "regenerate only for a deliberate, announced change: python tests/data/make_golden_pipeline.py"
        ),
        "writer": f"megatron-energon-lite {megatron_energon_lite.__version__}",
        "data": data_digests(root),
        "configs": {f"{name}/{workers}": run_config(name, workers, root) for name in CONFIGS for workers in WORKERS},
    }
