"""Runs a scheduled blend for real and writes what docs/guide/blending.md shows ("Seeing a
schedule"): the schedule's plot from its YAML, the realized shares from the run's manifest, and
where a checkpoint stands.  Prints the commands' output for the page.

    python scripts/docs_blend_schedule.py [--out docs/assets] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.synthetic import prepared_text_dataset

YAML = """\
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: {linear: {0: 6, 6000: 1}}      # web: 6 -> 1 over the first 6,000 samples
        path: ./web
      - weight: {step: {0: 1, 3000: 3}}        # code: 1, then 3 from sample 3,000
        path: ./code
      - weight: {cosine: {2000: 0, 8000: 2}}   # math: eases in from 0 to 2 between 2,000 and 8,000
        path: ./math
"""
BATCH, WORKERS, STEPS = 32, 2, 300


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "megatron_energon_lite.cli.main", *args], capture_output=True, text=True, check=True)
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/assets"))
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = args.work or Path(tempfile.mkdtemp(prefix="blend-schedule-"))
    for seed, name in enumerate(("web", "code", "math")):
        if not (work / name).exists():
            prepared_text_dataset(work / name, num_shards=4, samples_per_shard=500, max_words=12, seed=seed, key_pattern=name + "{shard:02d}_{index:04d}")
    yaml_path = work / "mix.yaml"
    yaml_path.write_text(YAML)
    manifest = work / "manifest"
    dataset = get_train_dataset(yaml_path, batch_size=BATCH, shuffle_buffer_size=100, max_samples_per_sequence=100, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=WORKERS))
    loader = get_savable_loader(dataset, manifest=manifest)
    for step, _ in zip(range(STEPS), loader):
        pass
    state = work / "state.json"
    state.write_text(json.dumps(loader.save_state_rank()))
    del loader
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"$ energon-lite info mix.yaml --plot-schedule blend-schedule.png --until {BATCH * STEPS}")
    print(_cli("info", str(yaml_path), "--plot-schedule", str(args.out / "blend-schedule.png"), "--until", str(BATCH * STEPS)).replace(str(work) + "/", ""))
    print("$ energon-lite manifest stats manifest --window 25 --plot blend-realized.png")
    print(_cli("manifest", "stats", str(manifest), "--window", "25", "--plot", str(args.out / "blend-realized.png")).replace(str(work) + "/", ""))
    print("$ energon-lite checkpoint info --no-workers state.json")
    print(_cli("checkpoint", "info", "--no-workers", str(state)).replace(str(work) + "/", ""))


if __name__ == "__main__":
    main()
