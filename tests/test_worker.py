import pytest

from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.worker import WorkerConfig


def test_topology_and_seeds_match_energon() -> None:
    energon = pytest.importorskip("megatron.energon")
    for rank, world, workers, offset in [(0, 1, 0, 0), (1, 2, 3, 0), (2, 3, 2, 43)]:
        ours = WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=offset)
        theirs = energon.WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=offset)
        for local in range(max(1, workers)):
            assert ours.worker_seed(local) == theirs.worker_seed(local)
        assert ours.num_global_workers == max(1, workers) * world


def test_equality_is_topology_only() -> None:
    assert WorkerConfig(rank=0, world_size=2, num_workers=1, seed_offset=1) == WorkerConfig(rank=0, world_size=2, num_workers=1)
    assert WorkerConfig(rank=0, world_size=2, num_workers=1) != WorkerConfig(rank=1, world_size=2, num_workers=1)


@pytest.mark.parametrize("kwargs", [dict(rank=2, world_size=2, num_workers=0), dict(rank=0, world_size=0, num_workers=0), dict(rank=0, world_size=1, num_workers=-1)])
def test_bad_topology_is_a_config_error(kwargs) -> None:
    with pytest.raises(ConfigError):
        WorkerConfig(**kwargs)


def test_default_worker_config_without_distributed() -> None:
    config = WorkerConfig.default_worker_config(3)
    assert (config.rank, config.world_size, config.num_workers) == (0, 1, 3)


def test_rank_and_world_size_default_like_default_worker_config() -> None:
    config = WorkerConfig(num_workers=8, prefetch_factor=2, persistent_workers=True)
    assert (config.rank, config.world_size, config.num_workers, config.prefetch_factor) == (0, 1, 8, 2)
    assert config == WorkerConfig.default_worker_config(8)
    assert WorkerConfig(num_workers=1).prefetch_factor is None and WorkerConfig(num_workers=1).persistent_workers


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(prefetch_factor=0), "prefetch_factor"),
        (dict(prefetch_factor=True), "prefetch_factor"),
        (dict(persistent_workers=1), "persistent_workers"),
        (dict(worker_log_level="1"), "worker_log_level"),
        (dict(worker_debug_path="/tmp/{rank}.jsonl"), "worker_debug_path"),
    ],
)
def test_bad_loader_settings_are_config_errors(kwargs, field) -> None:
    with pytest.raises(ConfigError, match=field):
        WorkerConfig(rank=0, world_size=1, num_workers=1, **kwargs)


def test_config_has_energons_keys_and_fingerprint_keeps_ours() -> None:
    energon = pytest.importorskip("megatron.energon")
    for rank, world, workers in [(0, 1, 0), (1, 3, 2)]:
        ours = WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=5)
        theirs = energon.WorkerConfig(rank=rank, world_size=world, num_workers=workers, seed_offset=5)
        assert ours.config() == theirs.config()
        # Saved loader states record these keys: they must stay as the release that saved them wrote them.
        assert ours.fingerprint() == {"rank": rank, "world_size": world, "num_workers": workers, "seed_offset": 5}


def test_should_log_matches_energon() -> None:
    energon = pytest.importorskip("megatron.energon")
    for log_level in (0, 1, 2):
        ours = WorkerConfig(rank=0, world_size=1, num_workers=0, worker_log_level=log_level)
        theirs = energon.WorkerConfig(rank=0, world_size=1, num_workers=0, worker_log_level=log_level)
        assert [ours.should_log(level) for level in (0, 1, 2, 3)] == [theirs.should_log(level) for level in (0, 1, 2, 3)]


def test_worker_log_writes_json_lines_where_energon_does(tmp_path) -> None:
    import json
    import os

    energon = pytest.importorskip("megatron.energon")
    ours = WorkerConfig(rank=1, world_size=2, num_workers=2, worker_debug_path=str(tmp_path / "ours/{worker_id}_{pid}.jsonl"), worker_log_level=1)
    theirs = energon.WorkerConfig(rank=1, world_size=2, num_workers=2, worker_debug_path=str(tmp_path / "theirs/{worker_id}_{pid}.jsonl"), worker_log_level=1)
    for config in (ours, theirs):
        config.worker_log({"t": "yield_batch", "keys": ["a", "b"]})
        config.worker_log({"t": "yield_batch", "idx": 1})
    theirs._worker_debug_file.close()
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == sorted(p.name for p in (tmp_path / "theirs").iterdir()) == [f"3_{os.getpid()}.jsonl"]
    lines = (tmp_path / f"ours/3_{os.getpid()}.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"t": "yield_batch", "keys": ["a", "b"]}, {"t": "yield_batch", "idx": 1}]


def test_worker_log_in_dataloader_workers_uses_one_file_per_worker(tmp_path) -> None:
    import torch.utils.data

    config = WorkerConfig(rank=0, world_size=1, num_workers=2, worker_debug_path=str(tmp_path / "w{worker_id}.jsonl"), worker_log_level=1)

    class Logging(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            config.worker_log({"worker": info.id})
            yield info.id

    loader = torch.utils.data.DataLoader(Logging(), num_workers=2, batch_size=None, multiprocessing_context="fork")
    assert sorted(loader) == [0, 1]
    # Energon's numbering: the main process is worker_id 0 of its rank, dataloader worker k is k + 1.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w1.jsonl", "w2.jsonl"]
    assert (tmp_path / "w2.jsonl").read_text() == '{"worker": 1}\n'


def test_worker_log_without_a_path_goes_to_stdout(capsys) -> None:
    WorkerConfig(rank=0, world_size=1, num_workers=0, worker_log_level=1).worker_log({"t": "x", "r": 0})
    assert capsys.readouterr().out == '{"t": "x", "r": 0}\n'
