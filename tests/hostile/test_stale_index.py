"""Every random-access read checks that it read what it asked for. A shard rewritten in another
order after prepare keeps every offset valid (members of one block each), so only the names can
tell: an aux member, a restored sample and a map-view index handed out other data silently."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from megatron_energon_lite import DatasetError, WorkerConfig, get_loader, get_savable_loader, get_val_dataset
from megatron_energon_lite.cache import WebdatasetFileStore
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.map_view import get_map_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
KEYS = [f"k{i:03d}" for i in range(10)]
PAX_PREFIX = "long/" * 25  # a name past 100 bytes: a PAX header in front of the member


def write_shard(path: Path, keys: list[str], *, tar_format: int = tarfile.USTAR_FORMAT) -> None:
    """Every member's data fits one block, so any order of the same members has the same layout."""
    with tarfile.open(path, "w", format=tar_format) as tar:
        for key in keys:
            data = f"text of {key}".encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def prepared(root: Path, keys: list[str], **kwargs) -> Path:
    root.mkdir()
    write_shard(root / "data-0.tar", keys, **kwargs)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)
    return root


def rewrite_reversed(root: Path, keys: list[str], **kwargs) -> None:
    shard = root / "data-0.tar"
    size = shard.stat().st_size
    write_shard(shard, list(reversed(keys)), **kwargs)
    assert shard.stat().st_size == size  # the same layout: only the names differ


@pytest.mark.parametrize("keys", [KEYS, [PAX_PREFIX + k for k in KEYS]], ids=["ustar", "pax-long-names"])
def test_an_aux_member_read_through_a_stale_index_is_refused(tmp_path: Path, keys: list[str]) -> None:
    kwargs = {"tar_format": tarfile.PAX_FORMAT} if keys[0].startswith(PAX_PREFIX) else {}
    root = prepared(tmp_path / "aux", keys, **kwargs)
    store = WebdatasetFileStore(root)
    assert [store[f"{k}.txt"][0] for k in keys] == [f"text of {k}".encode() for k in keys]
    rewrite_reversed(root, keys, **kwargs)
    store = WebdatasetFileStore(root)
    asked = f"{keys[2]}.txt"
    with pytest.raises(DatasetError) as info:
        store[asked]
    message = str(info.value)
    assert re.search(r"data-0\.tar member data at byte \d+", message), message
    assert f"expected: tar member {asked!r}" in message and f"found: tar member {keys[7] + '.txt'!r}" in message, message
    assert f"energon-lite prepare {root}" in message, message


def test_restore_sample_of_a_rewritten_shard_is_refused(tmp_path: Path) -> None:
    root = prepared(tmp_path / "ds", KEYS)
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = get_savable_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=None))
    samples = list(loader)
    assert loader.restore_sample(samples[2].__restore_key__).__key__ == "k002"
    rewrite_reversed(root, KEYS)
    loader = get_savable_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=None))
    with pytest.raises(DatasetError, match=r"(?s)data-0\.tar sample 2.*expected: sample key 'k002'.*found: sample key 'k007'.*energon-lite prepare"):
        loader.restore_sample(samples[2].__restore_key__)


def test_a_map_view_index_of_a_rewritten_shard_is_refused(tmp_path: Path) -> None:
    root = prepared(tmp_path / "ds", KEYS)
    view = get_map_dataset(root, split_part="train")
    keys = [view[i].__key__ for i in range(len(view))]
    assert sorted(keys) == KEYS
    rewrite_reversed(root, KEYS)
    view = get_map_dataset(root, split_part="train")
    with pytest.raises(DatasetError, match=rf"(?s)expected: sample key '{keys[0]}'.*found: sample key.*energon-lite prepare"):
        view[0]


def test_streaming_a_rewritten_shard_still_reads_each_sample_once(tmp_path: Path) -> None:
    """A stream reads positions, not keys: it is not what this check is for (the order changes)."""
    root = prepared(tmp_path / "ds", KEYS)
    rewrite_reversed(root, KEYS)
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    assert sorted(s.__key__ for s in get_loader(get_val_dataset(root, split_part="train", worker_config=config, batch_size=None))) == KEYS
