"""Video and audio loading: samples/s for ours and Energon 7.4.1 with the same clip extraction.

Generates (once) an audio set (WAV, 16 kHz mono, 1-3 s, 4 shards x 250) and a video set (H.264
mp4, 128x128, 16 frames at 8 fps, 4 shards x 250), each with a short text, prepares both with
Energon's CLI (VidQASample, field map {video: <media part>, context: txt}), then loads them with
both libraries: every sample's media part arrives as each library's lazy AVDecoder and
encode_sample extracts the same thing with each library's own functions: 8 frames spread
uniformly over the video (get_single_frames_uniform), or the first second of audio
(get_audio_clips([(0, 1)])).  Batch 16, shuffle buffer 32, fresh process per measurement.

    .venv/bin/python benchmarks/bench_av.py --data-dir /tmp/bench_av
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD_FLAG = "--child"


def generate(root: Path, kind: str, shards: int, per_shard: int) -> None:
    import numpy as np
    from megatron_energon_lite.synthetic import make_audio, make_video, write_tar
    from tqdm import tqdm

    rng = np.random.default_rng(0)
    with tqdm(total=shards * per_shard, desc=f"{kind} samples") as bar:
        for shard in range(shards):
            samples = []
            for i in range(per_shard):
                if kind == "video":
                    media = {"mp4": make_video(frames=16, fps=8, size=(128, 128), gop=8)}
                else:
                    media = {"wav": make_audio(float(rng.uniform(1.0, 3.0)), 16000)}
                samples.append((f"{shard:02d}_{i:04d}", {**media, "txt": f"{kind} sample {i}".encode()}))
                bar.update()
            write_tar(root / f"shards/{kind}-{shard:02d}.tar", samples)
    part = "mp4" if kind == "video" else "wav"
    energon = Path(sys.executable).with_name("energon")
    subprocess.run([str(energon), "prepare", "--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--sample-type", "VidQASample",
                    "--field-map", json.dumps({"video": part, "context": "txt"}), str(root)], check=True, capture_output=True)


def child(loader_name: str, data: Path, kind: str, workers: int, batches: int, warmup: int) -> dict:
    if loader_name == "ours":
        import megatron_energon_lite as module
        from megatron_energon_lite.decode.av import get_single_frames_uniform
    else:
        import megatron.energon as module
        from megatron.energon.av.utils import get_single_frames_uniform

    class Clips(module.DefaultTaskEncoder):
        @module.stateless
        def encode_sample(self, sample):
            if kind == "video":
                sample.video = get_single_frames_uniform(sample.video, 8)
            else:
                clips, _ = sample.video.get_audio_clips([(0.0, 1.0)])
                sample.video = clips[0][:, :16000]
            return sample

    config = module.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = module.get_train_dataset(str(data), worker_config=config, batch_size=16, shuffle_buffer_size=32, max_samples_per_sequence=50, task_encoder=Clips())
    it = iter(module.get_savable_loader(ds))
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    shape = None
    for _ in range(batches):
        batch = next(it)
        shape = list(batch.video.shape)
    return {"samples_per_s": batches * 16 / (time.perf_counter() - start), "shape": shape}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_av"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-shard", type=int, default=250)
    parser.add_argument(CHILD_FLAG, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, kind = args.child
        print(json.dumps(child(name, args.data_dir / kind, kind, args.workers, args.batches, args.warmup)))
        return
    for kind in ("audio", "video"):
        if not (args.data_dir / kind / ".nv-meta").is_dir():
            generate(args.data_dir / kind, kind, args.shards, args.per_shard)
    from tqdm import tqdm

    results: dict[tuple[str, str], list[dict]] = {}
    runs = [(kind, name) for _ in range(args.repeats) for kind in ("audio", "video") for name in ("ours", "energon")]
    for kind, name in tqdm(runs, desc="runs"):
        cmd = [sys.executable, __file__, CHILD_FLAG, name, kind, "--data-dir", str(args.data_dir), "--workers", str(args.workers), "--batches", str(args.batches), "--warmup", str(args.warmup)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{name} {kind} failed:\n{out.stderr[-3000:]}")
        results.setdefault((kind, name), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{args.workers} workers, batch 16, median of {args.repeats}:\n")
    print("| set | extraction | ours samples/s | Energon samples/s | ours / Energon | batch |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for kind, extraction in (("audio", "first 1 s"), ("video", "8 frames, uniform")):
        med = {name: sorted(r["samples_per_s"] for r in results[(kind, name)])[args.repeats // 2] for name in ("ours", "energon")}
        print(f"| {kind} | {extraction} | {med['ours']:,.0f} | {med['energon']:,.0f} | {med['ours'] / med['energon']:.2f}x | {results[(kind, 'ours')][0]['shape']} |")


if __name__ == "__main__":
    main()
