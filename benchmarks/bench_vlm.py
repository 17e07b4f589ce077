"""A realistic vision-language loading benchmark: web-like images at a training size (issue 42).

Generates an image-text data set whose images resemble web image-text data (the distribution
below), prepares it ONCE with Energon's own CLI, trains a small BPE tokenizer on its captions
with the ``tokenizers`` package (no download), then measures images/s of each loader with the
same task-encoder logic, each measurement in a fresh process (this script with ``--child``):

- ``ours (declared size)``: megatron_energon_lite, ``SampleDecoder(image_decode="rgb8",
  image_min_side=<need>)`` (JPEGs decoded at the smallest DCT scale that covers the need);
- ``ours``: megatron_energon_lite, ``SampleDecoder(image_decode="rgb8")`` (full-size decode);
- ``Energon 7.4.1``: the same task encoder class on ``megatron.energon`` (its decoder: Pillow);
- ``webdataset``: ``WebDataset(...).shuffle(100).decode("rgb8").to_tuple("jpg", "txt")``
  ``.batched(B, collation_fn=<the same collate>)`` in a DataLoader (Pillow).

The task encoder, the same functions for every loader (:func:`encode_image`, :func:`collate`):
the image (HxWx3 uint8) becomes 3 x S x S uint8 (shorter side to S, centre crop, with
``megatron_energon_lite.decode.resize``), or for ``tiles`` up to 6 tiles of 448 x 448 (the grid of
at most 6 tiles whose aspect ratio is closest to the image's, as InternVL does; the image is
resized to the grid and cut); a batch stacks the images (tiles: concatenates them, with a count
per sample) and tokenizes the captions with the BPE, padded to the longest in the batch.
Variants: ``224``, ``448`` (need: shorter side S) and ``tiles`` (need: shorter side 896: a grid
of at most 6 tiles has at most 2 tiles on its shorter side).

Ceilings, in the same run (no loader, no captions): the image bytes of the shards in memory,
then decode (our decoder, ``rgb8``) + :func:`encode_image` in 1 and 2 processes, both with the
declared size (``ceiling, declared size``) and at full size (``ceiling, full decode``), and the
declared-size decode alone (``bound``: no loader can beat Energon by more than this row does).
Every cell also reports its CPU time per batch (the main process and its workers; the main
process's share) and the cores it kept busy (images/s x CPU per image).

Rounds: every round measures every cell once, every other round in reversed order; tables give
medians. Also measured: the PSNR of declared-size decode + resize against full decode + the same
resize, per variant, over the JPEGs of the set.

The generated distribution (per image; seeded):

- size class: 30% small web images (longer side 300-800), 35% COCO-like (longer side 500-700,
  mostly 640), 25% large photos (longer side 1000-2048), 10% documents/charts (longer side
  1200-2200, portrait); aspect ratios 4:3, 3:2, 16:9, 1:1, 2:3, 3:4, 9:16 (documents 1:1.29-1:1.41);
- format: 5% PNG (charts/flat content, longer side at most 800), else JPEG; of the JPEGs 10%
  progressive, 5% grayscale (documents: 30% more); quality uniform 70-95; chroma subsampling 4:2:0 80%, 4:4:4 15%,
  4:2:2 5%. PNG files are stored under the ``jpg`` part name (web crawls mislabel; every decoder
  here reads the content, not the name).
- content: a smooth random field (bicubic-upscaled low-resolution noise), fine noise and a few
  hard-edged rectangles, so that JPEG sizes (about 1.5-2.5 bits a pixel at quality 85) look like
  photos; documents are mostly white with dark text-like strokes.
- captions: 5-40 words from a vocabulary of 3,000 made-up words with a Zipf-like frequency.

    .venv/bin/python benchmarks/bench_vlm.py --data-dir /tmp/bench_vlm --rounds 3
    .venv/bin/python benchmarks/bench_vlm.py --quick      # smoke test, not figures to quote
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = {"224": 224, "448": 448, "tiles": 896}  # variant -> the shorter side it needs
TILE, MAX_TILES = 448, 6
LOADERS = {
    "ours-declared": "ours (declared size)",
    "ours": "ours (full decode)",
    "energon": "Energon 7.4.1",
    "webdataset": "webdataset + Pillow",
}
CEILINGS = {"ceiling-declared": "ceiling, declared size", "ceiling-full": "ceiling, full decode", "ceiling-decode": "bound: declared-size decode alone"}


# -- the task encoder logic, shared by every loader ------------------------------------------------


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """(columns, rows), at most MAX_TILES tiles, aspect ratio closest to the image's (ties: more tiles)."""
    aspect = width / height
    grids = [(c, r) for c in range(1, MAX_TILES + 1) for r in range(1, MAX_TILES + 1) if c * r <= MAX_TILES]
    return min(grids, key=lambda g: (abs(g[0] / g[1] - aspect), -g[0] * g[1]))


def encode_image(image, variant: str):
    """HxWx3 uint8 -> 3 x S x S uint8 tensor, or for ``tiles`` n x 3 x 448 x 448."""
    from megatron_energon_lite.decode.resize import resize_centre_crop, resize_image

    if variant != "tiles":
        return resize_centre_crop(image, int(variant))
    height, width = image.shape[:2]
    columns, rows = tile_grid(width, height)
    grid = resize_image(image, rows * TILE, columns * TILE)
    return grid.unflatten(1, (rows, TILE)).unflatten(3, (columns, TILE)).permute(1, 3, 0, 2, 4).reshape(-1, 3, TILE, TILE)


@functools.cache
def tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def collate(images: list, captions: list[str], tokenizer_path: str, variant: str, stack=None) -> dict:
    """A batch: the images stacked (tiles concatenated, with counts), the captions' tokens padded.
    ``stack``: the loader's own stacking helper (``batch_stack`` of Energon and of ours, which
    stacks straight into the worker's shared-memory slab); None: ``torch.stack``."""
    import torch

    encoded = tokenizer(tokenizer_path).encode_batch(captions)
    longest = max(len(e.ids) for e in encoded)
    tokens = torch.zeros((len(encoded), longest), dtype=torch.int64)  # 0 is [PAD]
    for row, e in zip(tokens, encoded):
        row[: len(e.ids)] = torch.tensor(e.ids, dtype=torch.int64)
    if variant == "tiles":
        return {"images": torch.cat(images), "tiles": torch.tensor([len(i) for i in images]), "tokens": tokens}
    return {"images": (stack or torch.stack)(images), "tokens": tokens}


# -- data -------------------------------------------------------------------------------------------


def _content(rng, width: int, height: int, document: bool):
    import numpy as np
    from PIL import Image

    if document:
        page = np.full((height, width), 250, np.float32)
        for _ in range(int(rng.integers(20, 60))):  # lines of text-like strokes
            y = int(rng.integers(0, max(1, height - 12)))
            x0 = int(rng.integers(0, width // 3))
            x1 = int(rng.integers(x0 + 10, width))
            page[y : y + int(rng.integers(6, 12)), x0:x1] = rng.uniform(10, 80)
        page += rng.normal(0, 3, page.shape)
        return np.clip(page, 0, 255).astype(np.uint8)[..., None].repeat(3, axis=2)
    low = rng.uniform(0, 255, (max(2, height // 64), max(2, width // 64), 3)).astype(np.uint8)
    field = np.asarray(Image.fromarray(low).resize((width, height), Image.Resampling.BICUBIC), np.float32)
    for _ in range(int(rng.integers(2, 8))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        field[y0 : y0 + int(rng.integers(10, height // 2 + 11)), x0 : x0 + int(rng.integers(10, width // 2 + 11))] = rng.uniform(0, 255, 3)
    field += rng.normal(0, 7, field.shape)
    return np.clip(field, 0, 255).astype(np.uint8)


ASPECTS = [(4, 3), (3, 2), (16, 9), (1, 1), (2, 3), (3, 4), (9, 16)]


def image_spec(rng) -> dict:
    """One image's size, format and encoding settings, drawn from the documented distribution."""
    kind = rng.choice(["web", "coco", "photo", "document"], p=[0.30, 0.35, 0.25, 0.10])
    if kind == "document":
        longer = int(rng.integers(1200, 2201))
        width, height = int(longer / rng.uniform(1.29, 1.41)), longer
    else:
        longer = {"web": lambda: int(rng.integers(300, 801)), "coco": lambda: 640 if rng.random() < 0.7 else int(rng.integers(500, 701)),
                  "photo": lambda: int(rng.integers(1000, 2049))}[kind]()
        a, b = ASPECTS[int(rng.integers(len(ASPECTS)))]
        width, height = (longer, round(longer * b / a)) if a >= b else (round(longer * a / b), longer)
    png = kind != "document" and rng.random() < 0.05
    if png:
        scale = min(1.0, 800 / max(width, height))
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    return {
        "kind": str(kind), "width": width, "height": height, "format": "PNG" if png else "JPEG",
        "progressive": bool(rng.random() < 0.10), "gray": bool(rng.random() < 0.05),
        "quality": int(rng.integers(70, 96)), "subsampling": int(rng.choice([2, 0, 1], p=[0.80, 0.15, 0.05])),
    }


CAPTION_VOCAB = 3000


@functools.cache
def vocabulary() -> list[str]:
    """CAPTION_VOCAB made-up words (consonant-vowel syllables), the same on every run."""
    import numpy as np

    rng = np.random.default_rng(12345)
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    return ["".join(consonants[rng.integers(18)] + vowels[rng.integers(5)] for _ in range(int(rng.integers(1, 5)))) for _ in range(CAPTION_VOCAB)]


def caption(rng) -> str:
    words = vocabulary()
    return " ".join(words[min(CAPTION_VOCAB, int(rng.zipf(1.3))) - 1] for _ in range(int(rng.integers(5, 41))))


def encode_file(spec: dict, rng) -> bytes:
    import io

    from PIL import Image

    image = Image.fromarray(_content(rng, spec["width"], spec["height"], spec["kind"] == "document"))
    if spec["gray"] or spec["kind"] == "document" and spec["format"] == "JPEG" and rng.random() < 0.3:
        image = image.convert("L")
    out = io.BytesIO()
    if spec["format"] == "PNG":
        image.quantize(64).convert("RGB").save(out, "PNG")  # flat chart-like colours
    else:
        image.save(out, "JPEG", quality=spec["quality"], subsampling=spec["subsampling"], progressive=spec["progressive"])
    return out.getvalue()


def _write_shard(job: tuple) -> list[dict]:
    import io
    import tarfile

    import numpy as np

    root, shard, count, seed = job
    rng = np.random.default_rng((seed, shard))
    specs = []
    with tarfile.open(Path(root) / f"shard-{shard:04d}.tar", "w") as tar:
        for index in range(count):
            spec = image_spec(rng)
            key = f"{shard:04d}/{index:06d}"
            for part, data in (("jpg", encode_file(spec, rng)), ("txt", caption(rng).encode())):
                info = tarfile.TarInfo(f"{key}.{part}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                if part == "jpg":
                    specs.append({**spec, "bytes": len(data)})
    return specs


def generate(root: Path, args: argparse.Namespace) -> dict:
    """Generates, prepares (Energon's CLI) and trains the tokenizer; reused when the parameters match."""
    import multiprocessing
    import shutil
    import tarfile

    params = {"shards": args.shards, "per_shard": args.per_shard, "seed": args.seed, "version": 1}
    marker = root / "params.json"
    if marker.is_file() and json.loads(marker.read_text())["params"] == params:
        print(f"Reusing {root}", file=sys.stderr)
        return json.loads(marker.read_text())
    shutil.rmtree(root, ignore_errors=True)
    data = root / "data"
    data.mkdir(parents=True)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        specs = [s for shard in pool.map(_write_shard, [(str(data), i, args.per_shard, args.seed) for i in range(args.shards)]) for s in shard]
    command = [str(Path(sys.executable).parent / "energon"), "prepare", "--non-interactive", "--split-ratio", "1,0,0",
               "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}', "--no-progress", str(data)]
    subprocess.run(command, check=True, capture_output=True)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    captions = []
    for shard in sorted(data.glob("*.tar")):
        with tarfile.open(shard) as tar:
            captions += [tar.extractfile(m).read().decode() for m in tar if m.name.endswith(".txt")]
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(captions, trainers.BpeTrainer(vocab_size=4000, special_tokens=["[PAD]", "[UNK]"]))
    bpe.save(str(root / "tokenizer.json"))
    summary = {"params": params, "specs": specs}
    marker.write_text(json.dumps(summary))
    return summary


def describe(specs: list[dict]) -> str:
    import numpy as np

    jpegs = [s for s in specs if s["format"] == "JPEG"]
    shorter = np.array([min(s["width"], s["height"]) for s in specs])
    longer = np.array([max(s["width"], s["height"]) for s in specs])
    bits = np.array([8 * s["bytes"] / (s["width"] * s["height"]) for s in jpegs])
    kinds = {k: sum(s["kind"] == k for s in specs) for k in ("web", "coco", "photo", "document")}
    return (
        f"{len(specs)} images: {kinds}; {len(specs) - len(jpegs)} PNG, {sum(s['progressive'] for s in jpegs)} progressive JPEG, "
        f"{sum(s['gray'] for s in jpegs)}+ grayscale JPEG; shorter side median {np.median(shorter):.0f} (10%-90%: "
        f"{np.percentile(shorter, 10):.0f}-{np.percentile(shorter, 90):.0f}), longer side median {np.median(longer):.0f} (10%-90%: "
        f"{np.percentile(longer, 10):.0f}-{np.percentile(longer, 90):.0f}); JPEG bits per pixel median {np.median(bits):.2f}; "
        f"file size median {np.median([s['bytes'] for s in specs]) / 1e3:.0f} KB, total {sum(s['bytes'] for s in specs) / 1e6:.0f} MB"
    )


# -- the child: one measurement -------------------------------------------------------------------


def make_loader(cfg: dict):
    variant, workers = cfg["variant"], cfg["workers"]
    collate_args = (cfg["tokenizer"], variant)
    if cfg["loader"] == "webdataset":
        import torch.utils.data
        import webdataset as wds

        def encode_pair(pair):
            return encode_image(pair[0], variant), pair[1]

        def collate_pairs(pairs):
            return collate([p[0] for p in pairs], [p[1] for p in pairs], *collate_args)

        dataset = (
            wds.WebDataset(cfg["shards"], shardshuffle=len(cfg["shards"]), nodesplitter=wds.single_node_only, workersplitter=wds.split_by_worker, seed=0)
            .shuffle(100).decode("rgb8").to_tuple("jpg", "txt").map(encode_pair).batched(cfg["batch_size"], collation_fn=collate_pairs).repeat()
        )
        return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    if cfg["loader"] == "energon":
        from megatron.energon import DefaultTaskEncoder, SampleDecoder, WorkerConfig, batch_stack, get_savable_loader, get_train_dataset

        decoder_args = {}
    else:
        from megatron_energon_lite import DefaultTaskEncoder, SampleDecoder, WorkerConfig, batch_stack, get_savable_loader, get_train_dataset

        decoder_args = {"image_min_side": VARIANTS[variant]} if cfg["loader"] == "ours-declared" else {}

    class VLMTaskEncoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="rgb8", **decoder_args)

        def encode_sample(self, sample):
            sample.image = encode_image(sample.image, variant)
            return sample

        def batch(self, samples):
            return collate([s.image for s in samples], [s.caption for s in samples], *collate_args, stack=batch_stack)

    dataset = get_train_dataset(
        cfg["path"], batch_size=cfg["batch_size"], shuffle_buffer_size=100, max_samples_per_sequence=100,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), task_encoder=VLMTaskEncoder(),
    )
    return get_savable_loader(dataset)


def read_images(shards: list[str], count: int) -> list[bytes]:
    import tarfile

    images = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            images += [tar.extractfile(m).read() for m in tar if m.name.endswith(".jpg")]
        if len(images) >= count:
            break
    return [images[i % len(images)] for i in range(count)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (a loader's workers)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # the thread ended
            continue
    return found + [grandchild for child in found for grandchild in descendants(child)]


def ceiling(cfg: dict) -> dict:
    """Images/s (and CPU seconds per image, all processes) of decode + encode_image, no loader,
    in 1 or ``workers`` forked processes; ``ceiling-decode``: the declared-size decode alone."""
    import multiprocessing
    import resource

    from megatron_energon_lite.decode import decode_image_bytes

    variant = cfg["variant"]
    min_side = None if cfg["loader"] == "ceiling-full" else VARIANTS[variant]
    resize = cfg["loader"] != "ceiling-decode"
    images = read_images(cfg["shards"], cfg["images"])

    def work(share):
        for data in share:
            image = decode_image_bytes(data, "rgb8", min_side=min_side)
            if resize:
                encode_image(image, variant)

    work(images[:4])  # imports and caches, before timing and forking
    processes = max(1, cfg["workers"])
    if processes == 1:
        start, cpu = time.perf_counter(), time.process_time()
        work(images)
        return {"images_per_s": len(images) / (time.perf_counter() - start), "cpu_per_image": (time.process_time() - cpu) / len(images)}
    context = multiprocessing.get_context("fork")
    ready, go = context.Barrier(processes + 1), context.Event()

    def run(share):
        ready.wait()
        go.wait()
        work(share)

    children = [context.Process(target=run, args=(images[i::processes],)) for i in range(processes)]
    for child in children:
        child.start()
    ready.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    go.set()
    for child in children:
        child.join()
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return {"images_per_s": len(images) / elapsed, "cpu_per_image": cpu / len(images)}


def child(cfg: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if cfg["loader"].startswith("ceiling"):
        return ceiling(cfg)
    loader = make_loader(cfg)
    iterator = iter(loader)
    for _ in range(cfg["warmup"]):
        next(iterator)
    workers = descendants(os.getpid())
    start, images = time.perf_counter(), 0
    main_cpu, workers_cpu = time.process_time(), sum(map(cpu_seconds, workers))
    for _ in range(cfg["batches"]):
        batch = next(iterator)
        images += len(batch["tokens"])
    elapsed = time.perf_counter() - start
    main_cpu = time.process_time() - main_cpu
    workers_cpu = sum(map(cpu_seconds, workers)) - workers_cpu
    shape = f"{list(batch['images'].shape)} {batch['images'].dtype}, tokens {list(batch['tokens'].shape)}"
    return {"images_per_s": images / elapsed, "batch": shape, "main_cpu_per_image": main_cpu / images, "cpu_per_image": (main_cpu + workers_cpu) / images}


# -- the parent ---------------------------------------------------------------------------------------


def measure(cfg: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("@@VLM ")]
    if result.returncode != 0 or not lines:
        return {"error": (result.stderr or result.stdout)[-2000:]}
    return json.loads(lines[-1][6:])


def psnr_table(shards: list[str], count: int) -> list[str]:
    """PSNR of declared-size decode + encode_image against full decode + the same, per variant."""
    import numpy as np

    from megatron_energon_lite.decode import decode_image_bytes
    from megatron_energon_lite.decode.image import jpeg_scale

    images = [d for d in read_images(shards, count) if d[:2] == b"\xff\xd8"]
    rows = ["| variant | JPEGs | decoded at reduced scale | PSNR dB, reduced-scale ones: median | 10th percentile | min | PSNR dB over all JPEGs: median |", "|---|---:|---:|---:|---:|---:|---:|"]
    import simplejpeg

    for variant, need in VARIANTS.items():
        scaled, every = [], []
        for data in images:
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
            full = encode_image(decode_image_bytes(data, "rgb8"), variant).numpy().astype(np.float64)
            small = encode_image(decode_image_bytes(data, "rgb8", min_side=need), variant).numpy().astype(np.float64)
            mse = float(np.mean((full - small) ** 2))
            value = 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)
            every.append(value)
            if jpeg_scale(width, height, min_side=need) > 1:
                scaled.append(value)
        rows.append(
            f"| {variant} | {len(images)} | {len(scaled)} | {np.median(scaled):.1f} | {np.percentile(scaled, 10):.1f} | {min(scaled):.1f} | {np.median(every):.1f} |"
            if scaled else f"| {variant} | {len(images)} | 0 | n/a | n/a | n/a | {np.median(every):.1f} |"
        )
    return rows


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(LOADERS) + list(CEILINGS)
    labels = {**LOADERS, **CEILINGS}
    variants = [v for v in VARIANTS if any(key[0] == v for key in results)]  # only what was run
    worker_counts = sorted({key[2] for key in results})
    width = 0.8 / len(worker_counts)
    fig, axes = plt.subplots(1, len(variants), figsize=(5 * len(variants), 4.5), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, variant in zip(axes, variants):
        for offset, workers in enumerate(worker_counts):
            values = [results.get((variant, name, workers), float("nan")) for name in names]
            positions = [i + offset * width for i in range(len(names))]
            ax.bar(positions, values, width=width, label=f"{workers} workers (ceilings: {max(1, workers)} process{'es' if workers > 1 else ''})")
        ax.set_xticks([i + width * (len(worker_counts) - 1) / 2 for i in range(len(names))], [labels[n] for n in names], rotation=35, ha="right", fontsize=8)
        ax.set_title(f"variant {variant}")
        ax.set_ylabel("images/s")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_vlm"))
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--psnr-images", type=int, default=200)
    parser.add_argument("--out", type=Path, help="results markdown to write (and a .png beside it)")
    parser.add_argument("--quick", action="store_true", help="tiny data, one round: a smoke test")
    args = parser.parse_args()
    if args.child:
        print("@@VLM " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.quick:
        args.shards, args.per_shard, args.batches, args.warmup, args.rounds, args.psnr_images = 2, 24, 2, 1, 1, 12
        args.data_dir = args.data_dir.with_name(args.data_dir.name + "-quick")
    summary = generate(args.data_dir, args)
    data = args.data_dir / "data"
    shards = [str(p) for p in sorted(data.glob("*.tar"))]
    base = {"path": str(data), "shards": shards, "tokenizer": str(args.data_dir / "tokenizer.json"), "batch_size": args.batch_size,
            "warmup": args.warmup, "batches": args.batches, "images": args.batches * args.batch_size}
    cells = [(v, name, w) for v in args.variants for w in args.workers for name in [*LOADERS, *CEILINGS]]
    figures: dict = {}
    cpu: dict = {}  # cell -> [(CPU ms per batch, all processes; of the main process)] per round
    shapes: dict = {}
    errors: dict = {}
    rounds_log: list[str] = []
    for round_index in range(args.rounds):
        for cell in cells if round_index % 2 == 0 else cells[::-1]:
            variant, name, workers = cell
            result = measure({**base, "variant": variant, "loader": name, "workers": workers})
            if "error" in result:
                errors[cell] = result["error"]
                print(f"round {round_index}: {cell} FAILED: {result['error'][-300:]}", file=sys.stderr, flush=True)
                continue
            figures.setdefault(cell, []).append(result["images_per_s"])
            per_batch = lambda key: 1e3 * args.batch_size * result[key] if key in result else float("nan")  # noqa: E731
            busy = result["images_per_s"] * result.get("cpu_per_image", float("nan"))  # CPU seconds per second
            cpu.setdefault(cell, []).append((per_batch("cpu_per_image"), per_batch("main_cpu_per_image"), busy))
            shapes.setdefault((variant, name), result.get("batch"))
            rounds_log.append(f"round {round_index}: {cell}: {result['images_per_s']:.1f} images/s, CPU {cpu[cell][-1][0]:.1f} ms per batch (main process {cpu[cell][-1][1]:.2f}), cores busy {cpu[cell][-1][2]:.2f}")
            print(rounds_log[-1], file=sys.stderr, flush=True)
    medians = {cell: statistics.median(values) for cell, values in figures.items()}
    cpu_medians = {cell: tuple(statistics.median(v[i] for v in values) for i in range(3)) for cell, values in cpu.items()}
    lines = ["# VLM loading benchmark (bench_vlm.py)", "", f"`{' '.join([Path(sys.executable).name, 'benchmarks/bench_vlm.py', *sys.argv[1:]])}`", "",
             f"Machine: {os.cpu_count()} CPUs; load average before the tables: {os.getloadavg()[0]:.2f}. Batch size {args.batch_size}, "
             f"{args.warmup} warm-up + {args.batches} timed batches per cell; median of {args.rounds} round(s), alternating order; "
             f"ceilings decode {base['images']} images. CPU: user + system seconds of the main process and its workers (ceilings: "
             f"of their processes) during the timed batches, per batch of {args.batch_size} images; less sensitive to other load than images/s. "
             f"Cores busy: CPU seconds per second (images/s x CPU per image); below the core count, the processes waited.",
             "", "Data: " + describe(summary["specs"]), ""]
    for variant in args.variants:
        lines += [f"## variant {variant} (declared: image_min_side={VARIANTS[variant]})", "",
                  "| loader | workers | images/s | vs Energon | vs webdataset | % of ceiling, declared size (same processes) | CPU ms per batch, all processes | of it the main process | cores busy | batch |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for workers in args.workers:
            energon = medians.get((variant, "energon", workers))
            wds = medians.get((variant, "webdataset", workers))
            top = medians.get((variant, "ceiling-declared", workers))
            for name, label in {**LOADERS, **CEILINGS}.items():
                value = medians.get((variant, name, workers))
                if value is None:
                    lines.append(f"| {label} | {workers} | failed | | | | | | | |")
                    continue
                ratio = lambda other: f"{value / other:.2f}x" if other else "n/a"  # noqa: E731
                total_cpu, main_cpu, busy = cpu_medians[(variant, name, workers)]
                main_text = "" if name in CEILINGS else f"{main_cpu:.2f}"
                share = f"{100 * value / top:.0f}%" if top else ""
                lines.append(f"| {label} | {workers} | {value:,.1f} | {ratio(energon)} | {ratio(wds)} | {share} | {total_cpu:.1f} | {main_text} | {busy:.2f} | {shapes.get((variant, name)) or ''} |")
        lines.append("")
    lines += ["## PSNR: declared-size decode + resize vs full decode + the same resize", "", *psnr_table(shards, args.psnr_images), ""]
    lines += ["## Per-round figures (every other round in reversed order)", "", "```", *rounds_log, "```", ""]
    if errors:
        lines += ["## Failures", ""] + [f"- {cell}: `{err.strip().splitlines()[-1] if err.strip() else '?'}`" for cell, err in errors.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        plot(medians, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
