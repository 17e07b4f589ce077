"""Run under torchrun (gloo): ``save`` reads some batches on each rank and gathers every rank's
state on rank 0; ``restore`` gives the saved list to every rank (sent from rank 0) and reads to
the end of the epoch (``restore-changed``: into data that changed since the save, with
``allow_data_change`` and ``join_new_shards``).  Each rank writes the keys it delivered to
OUT/<mode>_rank<r>.json.

With a blend (DATASET ends with .yaml; training blends never end): one sample per batch, and the
restoring ranks read until none of their datasets reads what it carried over, writing only the
samples of the carried epochs (``energon_lite_dev.states.carried_datasets``)."""

import itertools
import json
import sys
from pathlib import Path

import torch.distributed as dist
from energon_lite_dev.states import carried_datasets

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset

BLEND_DATASETS = 2


def main(mode: str, dataset: str, out: str, workers: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    blend = dataset.endswith(".yaml")
    if blend:
        loader = get_savable_loader(get_train_dataset(dataset, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=3, worker_config=config))
    else:
        loader = get_savable_loader(get_train_dataset(dataset, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3, repeat=False, worker_config=config))
    out_dir = Path(out)
    if mode == "save" and blend:
        keys = [key for batch in itertools.islice(loader, 4 + rank) for key in batch.__key__]
        states = loader.save_state_global(global_dst_rank=0)
        if rank == 0:
            (out_dir / "states.json").write_text(json.dumps(states))
    elif mode == "save":
        keys = [key for batch in itertools.islice(loader, 3 + rank) for key in batch.__key__]
        states = loader.save_state_global(global_dst_rank=0)
        if rank == 0:
            (out_dir / "states.json").write_text(json.dumps(states))
    else:
        states = json.loads((out_dir / "states.json").read_text()) if rank == 0 else None
        changed = mode == "restore-changed"
        loader.restore_state_global(states, src_rank=0, allow_data_change=changed, join_new_shards=changed)
        keys = _carried_keys(loader) if blend else [key for batch in loader for key in batch.__key__]
    (out_dir / f"{mode}_rank{rank}.json").write_text(json.dumps(keys))
    dist.barrier()
    dist.destroy_process_group()


def _carried_keys(loader) -> list[str]:
    """The samples of the carried epochs (datasets a and b: keys start with their name)."""
    keys = []
    it = iter(loader)
    carried = carried_datasets(loader.save_state_rank(), BLEND_DATASETS)
    while any(carried):
        (key,) = next(it).__key__
        carried = carried_datasets(loader.save_state_rank(), BLEND_DATASETS)
        if carried["ab".index(key[0])]:
            keys.append(key)
    return keys


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
