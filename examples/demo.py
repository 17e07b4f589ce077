"""End-to-end demo: generate a small multimodal dataset, prepare it, inspect it, lint it, read it,
then stream it through the savable loader, save the state half-way and show that a fresh loader
restored from it continues exactly.

The samples mix optional parts (jpg or png images, text, JSON, class ids, numpy arrays and, with
PyAV installed, short mp4 videos and wav recordings), so the dataset is prepared as crude
(``CrudeWebdataset``): samples are dicts of decoded parts; video and audio parts arrive as lazy
``AVDecoder`` objects that decode only what is asked for.

Run through ``bash scripts/demo.sh`` (which installs everything first), or directly with the
project's environment: ``.venv/bin/python examples/demo.py [--out demo_data]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    InterleavedSample,
    WorkerConfig,
    basic_sample_keys,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.decode.av import get_single_frames_uniform
from megatron_energon_lite.pipeline.load import SampleLoader
from megatron_energon_lite.samples import format_value
from megatron_energon_lite.synthetic import generate_demo_dataset


def run_cli(*args: str) -> None:
    command = [sys.executable, "-m", "megatron_energon_lite.cli.main", *args]
    print(f"\n$ energon-lite {' '.join(args)}", flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo_data"), help="Where to generate the dataset.")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples-per-shard", type=int, default=50)
    parser.add_argument("--batches", type=int, default=40, help="Batches to stream in the save/restore part.")
    args = parser.parse_args()

    root = args.out / "multimodal"
    if root.exists():
        shutil.rmtree(root)
    shards = generate_demo_dataset(root, num_shards=args.shards, samples_per_shard=args.samples_per_shard, seed=0)
    print(f"Generated {len(shards)} shards under {root}")

    run_cli(
        "prepare", str(root), "--non-interactive", "--split-ratio", "8,1,1",
        "--sample-type", "CrudeWebdataset", "--num-workers", "2",
    )
    run_cli("info", str(root))
    run_cli("lint", str(root), "--parallel", "2")
    run_cli("preview", str(root), "--split-parts", "val", "-n", "3")

    print("\nReading the first samples of the train split by random access:")
    reader = SampleLoader(root, "train", decoder=SampleDecoder(image_decode="torchrgb8"))
    for index in range(3):
        sample = reader.load(index)
        print(f"  {format_value({k: v for k, v in sample.items() if not k.startswith('__')})}")
    reader.close()

    show_media(root)
    stream_save_restore(root, batches=args.batches)
    write_html_preview(root, args.out / "preview.html")


def show_media(root: Path) -> None:
    """Shows the first video and the first audio part of the train split and what they decode to."""
    print("\nVideo and audio parts are lazy AVDecoders; only what is asked for is decoded:")
    reader = SampleLoader(root, "train", decoder=SampleDecoder())
    shown: set[str] = set()
    for index in range(len(reader)):
        sample = reader.load(index)
        for part in ("mp4", "wav"):
            if part not in sample or part in shown:
                continue
            shown.add(part)
            meta = sample[part].get_metadata()
            if part == "mp4":
                frames = get_single_frames_uniform(sample[part], 4, video_out_frame_size=(16, 16))
                print(f"  {sample['__key__']}.mp4: {meta.video_width}x{meta.video_height}, {meta.video_fps:g} fps, {meta.video_duration:.2f} s"
                      f" -> 4 uniform frames resized to 16x16: {tuple(frames.shape)} {frames.dtype}")
            else:
                clips, _ = sample[part].get_audio_clips([(0.0, 0.25)])
                print(f"  {sample['__key__']}.wav: {meta.audio_sample_rate} Hz, {meta.audio_duration:.2f} s"
                      f" -> first 0.25 s: {tuple(clips[0].shape)} {clips[0].dtype}")
        if len(shown) == 2:
            break
    reader.close()
    if not shown:
        print("  (none here: without PyAV the demo dataset has no video or audio)")


@stateless
def cook_interleaved(crude: dict) -> InterleavedSample:
    """Crude dict -> an image (if the sample has one) followed by its text."""
    image = crude.get("jpg", crude.get("png"))
    sequence = ([image[:3]] if image is not None else []) + [crude["txt"]]
    return InterleavedSample(**basic_sample_keys(crude), sequence=sequence)


class DemoTaskEncoder(DefaultTaskEncoder):
    decoder = SampleDecoder(image_decode="torchrgb8")
    cookers = [Cooker(cook_interleaved)]


def make_loader(root: Path):
    dataset = get_train_dataset(
        root,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        batch_size=8,
        shuffle_buffer_size=32,
        max_samples_per_sequence=10,
        task_encoder=DemoTaskEncoder(),
    )
    return get_savable_loader(dataset)


def stream_save_restore(root: Path, *, batches: int) -> None:
    """Streams batches, saves the loader state half-way, and checks that a fresh loader restored
    from that state continues with exactly the same batches."""
    print(f"\nStreaming {batches} batches through get_savable_loader (2 workers), saving at batch {batches // 2}:")
    loader = make_loader(root)
    seen, state = [], None
    for batch in tqdm(loader, total=batches, unit="batch"):
        seen.append(list(batch.__key__))
        if len(seen) == batches // 2:
            state = loader.save_state_rank()
        if len(seen) == batches:
            break
    print(f"  saved state: {len(json.dumps(state))} bytes of JSON, next worker {state['next_worker']}")
    restored = make_loader(root)
    restored.restore_state_rank(state)
    continued = [list(batch.__key__) for _, batch in zip(range(batches - batches // 2), restored)]
    same = continued == seen[batches // 2 :]
    print(f"  restored loader continues with the same {len(continued)} batches: {same}")
    print(f"  e.g. batch {batches // 2}: {continued[0][:3]}...")
    if not same:
        raise SystemExit("the restored loader did not continue exactly")
    print("\nDemo finished.")


def write_html_preview(root: Path, page: Path) -> None:
    """Ends the demo with the samples as one self-contained web page (images, video frames, audio)."""
    command = [sys.executable, "-m", "megatron_energon_lite.cli.main", "preview", str(root), "--split-parts", "val", "-n", "12", "--html", str(page)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"\nHTML preview of the demo dataset: {page.resolve()} (open it in a browser)")


if __name__ == "__main__":
    main()
