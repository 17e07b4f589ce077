"""Run by tests/distributed/test_two_ranks.py under torchrun (gloo): one process per rank.

Writes what this rank saw to ``<out>/rank<r>.json`` for the test to check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from megatron_energon_lite import (
    WorkerConfig,
    blend_report,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)


def main() -> None:
    dataset, out, blend = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = WorkerConfig.default_worker_config(num_workers=1)

    def train_loader():
        ds = get_train_dataset(dataset, worker_config=config, batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=4)
        return get_savable_loader(ds)

    epoch = get_train_dataset(dataset, worker_config=config, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
    epoch_keys = [s.__key__ for s in get_savable_loader(epoch)]

    val = get_val_dataset(dataset, worker_config=config, batch_size=2)
    val_batches = [list(b.__key__) for b in get_savable_loader(val)]

    loader = train_loader()
    iterator = iter(loader)
    before = [list(next(iterator).__key__) for _ in range(5)]
    states = loader.save_state_global(global_dst_rank=0)
    after = [list(next(iterator).__key__) for _ in range(5)]

    restored = train_loader()
    restored.restore_state_global(states, src_rank=0)
    resumed = [list(b.__key__) for _, b in zip(range(5), restored)]

    # An exact blend over both ranks: 10 batches, a global save, 10 more, and a resumed loader.
    def blend_loader():
        return get_savable_loader(get_train_dataset(blend, worker_config=config, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=3))

    blended = blend_loader()
    blend_iterator = iter(blended)
    blend_before = [list(next(blend_iterator).__key__) for _ in range(10)]
    blend_states = blended.save_state_global(global_dst_rank=0)
    blend_after = [list(next(blend_iterator).__key__) for _ in range(10)]
    blend_restored = blend_loader()
    blend_restored.restore_state_global(blend_states, src_rank=0)
    blend_resumed = [list(b.__key__) for _, b in zip(range(10), blend_restored)]

    result = {
        "rank": rank,
        "blend_before": blend_before,
        "blend_after": blend_after,
        "blend_resumed": blend_resumed,
        "blend_report": None if blend_states is None else blend_report(blend_states),
        "world_size": dist.get_world_size(),
        "config": [config.rank, config.world_size],
        "epoch_keys": epoch_keys,
        "val_batches": val_batches,
        "val_len": len(val),
        "before": before,
        "after": after,
        "resumed": resumed,
        "gathered": None if states is None else len(states),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
