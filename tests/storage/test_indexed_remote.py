"""A Megatron .bin/.idx dataset on S3 read by the loader (moto on 127.0.0.1): the same samples as
from local disk, a metadataset blend on S3, and in-order reads fetched in few requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megatron_energon_lite import (
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron_energon_lite.format.indexed import IndexedWriter
from megatron_energon_lite.storage import configure_storage, read_counters


@pytest.fixture
def remote(s3_server, s3_url, tmp_path, monkeypatch):
    """60 documents written locally and uploaded as ``<s3_url>/tokens.{bin,idx}``."""
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(5)
    documents = [rng.integers(0, 50000, size=int(rng.integers(1, 60))).astype(np.uint16) for _ in range(60)]
    local = tmp_path / "local"
    local.mkdir()
    with IndexedWriter(local / "tokens", np.uint16) as writer:
        for doc in documents:
            writer.add_document(doc)
    s3_server.upload_dir(local, s3_url)
    configure_storage("s3", storage_options=s3_server.storage_options())
    yield documents, local, s3_url
    configure_storage("s3", storage_options={})


def wc(workers: int = 0) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=workers)


def test_remote_documents_in_order_in_few_requests(remote) -> None:
    documents, _, url = remote
    loader = get_savable_loader(get_val_dataset(f"{url}/tokens", split_part="val", batch_size=None, worker_config=wc()))
    before = read_counters.requests
    samples = list(loader)
    requests = read_counters.requests - before
    assert [s.tokens.tolist() for s in samples] == [d.tolist() for d in documents]
    assert requests < len(documents) // 4, f"{requests} requests for {len(documents)} in-order documents"


def test_remote_blend_of_windows_equals_the_local_one_and_resumes(remote) -> None:
    _, local, url = remote

    def make(base: str):
        blend = {
            "__module__": "megatron.energon",
            "__class__": "MetadatasetV2",
            "splits": {"train": {"blend": [{"weight": 1, "path": f"{base}/tokens.idx", "sequence_length": 16}, {"weight": 1, "path": f"{base}/tokens"}]}},
        }
        return get_train_dataset(blend, batch_size=None, shuffle_buffer_size=8, max_samples_per_sequence=5, worker_config=wc(2))

    def stream(loader, n: int) -> list:
        return [(len(s.tokens), s.tokens.tolist()) for _, s in zip(range(n), loader)]

    expected = stream(get_savable_loader(make(str(local))), 40)
    loader = get_savable_loader(make(url))
    it = iter(loader)
    first = [(len(s.tokens), s.tokens.tolist()) for _, s in zip(range(15), it)]
    state = json.loads(json.dumps(loader.save_state_rank()))
    fresh = get_savable_loader(make(url))
    fresh.restore_state_rank(state)
    assert first + stream(fresh, 25) == expected
