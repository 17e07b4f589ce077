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
