"""Saves a shuffled training loader on 2 ranks x 2 workers half-way through an epoch, then finishes
that epoch on 1 rank x 3 workers, and checks that every sample of the epoch came exactly once.

Ranks are simulated in one process (``WorkerConfig(rank=r, world_size=2)``; under torchrun each
rank would make its own loader and ``save_state_global`` would gather the states); every loader
runs its real worker processes.  The states pass through JSON, as a checkpoint file would.

    .venv/bin/python examples/elastic_resume.py --samples 600 --fraction 0.4
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import tempfile
import warnings
from collections import Counter
from pathlib import Path

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.synthetic import generate_text_dataset

TEXT_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
BATCH = 4


def loader(data: Path, rank: int, world: int, workers: int):
    config = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    # repeat=False: one epoch, so "the rest of the epoch" has an end to check against.
    ds = get_train_dataset(data, worker_config=config, batch_size=BATCH, shuffle_buffer_size=16, max_samples_per_sequence=20, repeat=False)
    return get_savable_loader(ds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--dataset", type=Path, default=None, help="A prepared dataset of your own (TextSample); default: generate a small one under --data-dir.")
    parser.add_argument("--samples", type=int, default=600, help="Samples in the generated dataset (6 shards).")
    parser.add_argument("--fraction", type=float, default=0.4, help="Part of each old rank's share read before saving.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 3 workers on a small machine
    data = args.dataset or (args.data_dir or Path(tempfile.mkdtemp())) / "texts"
    if args.dataset is None and not (data / ".nv-meta").is_dir():
        generate_text_dataset(data, num_shards=6, samples_per_shard=args.samples // 6, min_words=2, max_words=10, seed=5)
        prepare_dataset(data, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=TEXT_YAML)

    before: list[str] = []
    states = []
    for rank in range(2):
        old = loader(data, rank, world=2, workers=2)
        steps = int(len(old) * args.fraction)
        before += [key for batch in itertools.islice(old, steps) for key in batch.__key__]
        states.append(json.loads(json.dumps(old.save_state_rank())))
        print(f"saved rank {rank} of 2 (2 workers) after {steps} of its {len(old)} batches")

    new = loader(data, 0, world=1, workers=3)
    new.restore_state_global(states)  # another topology: the rest of the epoch is divided anew
    after = [key for batch in new for key in batch.__key__]
    print(f"restored on 1 rank x 3 workers: {len(after)} samples to the end of the epoch")

    epoch = Counter(before + after)
    repeated = [key for key, count in epoch.items() if count > 1]
    # every sample of the epoch: the generated count, or one plain pass over your dataset
    expected = args.samples // 6 * 6 if args.dataset is None else sum(len(batch.__key__) for batch in loader(data, 0, world=1, workers=0))
    print(f"delivered before the save: {len(before)}, after the restore: {len(after)}, distinct: {len(epoch)} of {expected}")
    print(f"repeated: {len(repeated)}, missing: {expected - len(epoch)}")
    ok = not repeated and len(epoch) == expected
    print("check:", "every sample of the epoch exactly once" if ok else "FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
