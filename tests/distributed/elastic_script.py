"""Run under torchrun (gloo): ``save`` reads some batches on each rank and gathers every rank's
state on rank 0; ``restore`` gives the saved list to every rank (sent from rank 0) and reads to
the end of the epoch.  Each rank writes the keys it delivered to OUT/<mode>_rank<r>.json."""

import itertools
import json
import sys
from pathlib import Path

import torch.distributed as dist

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset


def main(mode: str, dataset: str, out: str, workers: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    loader = get_savable_loader(get_train_dataset(dataset, batch_size=2, shuffle_buffer_size=4, max_samples_per_sequence=3, repeat=False, worker_config=config))
    out_dir = Path(out)
    if mode == "save":
        keys = [key for batch in itertools.islice(loader, 3 + rank) for key in batch.__key__]
        states = loader.save_state_global(global_dst_rank=0)
        if rank == 0:
            (out_dir / "states.json").write_text(json.dumps(states))
    else:
        states = json.loads((out_dir / "states.json").read_text()) if rank == 0 else None
        loader.restore_state_global(states, src_rank=0)
        keys = [key for batch in loader for key in batch.__key__]
    (out_dir / f"{mode}_rank{rank}.json").write_text(json.dumps(keys))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
