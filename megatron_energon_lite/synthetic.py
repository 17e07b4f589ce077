"""Deterministic synthetic WebDataset shards and JSONL files: small datasets to try the loader on
(the examples make one when no dataset is given), and the data of our tests, demo and benchmarks.

Every byte written here is a pure function of the arguments: randomness comes only from
``numpy.random.default_rng((seed, ...))`` with a fixed stream number per purpose, tar members carry
fixed metadata, and files are written atomically. The same call therefore writes the same bytes on
every run and with any number of worker processes.

Keys follow Energon's grouping rule: a sample is a run of consecutive members ``f"{key}.{part}"``,
where the key is everything up to the first dot of the last path component.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import io
import json
import logging
import multiprocessing
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from .errors import ConfigError, format_message
from .format.prepare import prepare_dataset
from .storage.local import create_temporary

__all__ = [
    "CAPTIONING_SAMPLE_YAML",
    "TEXT_SAMPLE_YAML",
    "WORDS",
    "generate_captioning_dataset",
    "generate_demo_dataset",
    "generate_jsonl",
    "generate_text_dataset",
    "make_audio",
    "make_caption",
    "make_jpeg",
    "make_png",
    "make_text",
    "make_tone",
    "make_video",
    "prepared_captioning_dataset",
    "prepared_text_dataset",
    "write_jsonl",
    "write_tar",
]

logger = logging.getLogger(__name__)

#: A seed: a non-negative int or a sequence of them (e.g. ``(seed, shard, index)``).
Seed = Union[int, Sequence[int]]
Samples = Iterable[tuple[str, Mapping[str, bytes]]]

TAR_FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
IMAGE_FORMATS = ("jpg", "png")
#: Member mtime: fixed so that the same samples give the same tar bytes (2024-01-01T00:00:00Z).
FIXED_MTIME = 1_704_067_200

# One stream number per purpose, so that e.g. changing the caption length does not change images.
_STREAM_IMAGE = 1
_STREAM_TEXT = 2
_STREAM_SAMPLE = 3
_STREAM_JSONL = 4
_STREAM_MEDIA = 5

#: The fixed vocabulary of the pseudo-English text.
WORDS: tuple[str, ...] = tuple(
    """
    a an the this that some every many few two three red green blue yellow white black small large
    tiny huge old young quiet loud bright dark soft warm cold wet dry round square wooden metal glass
    cat dog bird horse fish cow sheep child man woman person group team city street road bridge river
    lake sea beach mountain hill forest tree flower garden field sky cloud sun moon star light shadow
    house building window door roof wall table chair bed lamp book cup plate bowl bottle phone screen
    car bus train bike boat plane truck ball kite hat coat shoe bag box picture photo painting sign
    sits stands walks runs jumps flies swims rests looks waits plays holds carries reads writes eats
    drinks opens closes shows covers crosses follows near under over behind beside between above inside
    outside across along around through on in at with without from into onto toward during after before
    morning evening night winter summer spring autumn rain snow wind fog slowly quickly quietly together
    alone again often never always nearly almost very rather quite and or but while because although
    """.split()
)


def _seed_entropy(seed: Seed, *stream: int) -> tuple[int, ...]:
    """Flattens a seed and stream numbers into SeedSequence entropy, rejecting what it cannot take."""
    if isinstance(seed, (str, bytes)) or not isinstance(seed, (int, np.integer, Sequence)):
        parts: tuple[Any, ...] = (seed,)  # rejected below with the usual message
    else:
        parts = (seed,) if isinstance(seed, (int, np.integer)) else tuple(seed)
    entropy = (*parts, *stream)
    for value in entropy:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConfigError(
                format_message(
                    "invalid seed",
                    expected="a non-negative int or a sequence of non-negative ints",
                    found=repr(seed),
                )
            )
    return tuple(int(v) for v in entropy)


def _rng(seed: Seed, *stream: int) -> np.random.Generator:
    return np.random.default_rng(_seed_entropy(seed, *stream))


def _as_rng(rng_or_seed: np.random.Generator | Seed, stream: int) -> np.random.Generator:
    if isinstance(rng_or_seed, np.random.Generator):
        return rng_or_seed
    return _rng(rng_or_seed, stream)


def _check_positive(name: str, value: int, *, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(format_message(f"invalid {name}", expected=f"an int >= {low}", found=repr(value)))


def _check_word_range(min_words: int, max_words: int) -> None:
    _check_positive("min_words", min_words, allow_zero=True)
    _check_positive("max_words", max_words, allow_zero=True)
    if min_words > max_words:
        raise ConfigError(
            format_message("invalid word range", expected="min_words <= max_words", found=f"{min_words} > {max_words}")
        )


# -- tar writing ---------------------------------------------------------------------------------


def write_tar(path: str | os.PathLike[str], samples: Samples, *, tar_format: str = "ustar") -> int:
    """Writes ``samples`` (``(key, {part: bytes})`` pairs) as members ``f"{key}.{part}"`` in order.

    Metadata is fixed (mtime :data:`FIXED_MTIME`, uid/gid 0, empty user/group names, mode 0o644), so
    equal samples give byte-equal tars. The file appears atomically (a fresh temporary, then a rename) and
    parent folders are created. Returns the number of samples written.
    """
    if tar_format not in TAR_FORMATS:
        raise ConfigError(
            format_message("unknown tar format", expected=" | ".join(TAR_FORMATS), found=repr(tar_format))
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temporary(path)
    count = 0
    try:
        with os.fdopen(fd, "wb") as file, tarfile.open(fileobj=file, mode="w", format=TAR_FORMATS[tar_format], encoding="utf-8") as tar:
            for key, parts in samples:
                if not isinstance(key, str) or not isinstance(parts, Mapping):
                    raise ConfigError(
                        format_message(
                            "invalid sample",
                            where=f"{path}, sample #{count}",
                            expected="(key: str, {part: bytes})",
                            found=f"({type(key).__name__}, {type(parts).__name__})",
                        )
                    )
                for part, data in parts.items():
                    _add_member(tar, f"{key}.{part}", data, where=f"{path}, sample {key!r}", tar_format=tar_format)
                count += 1
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.debug("wrote %d samples to %s (%s)", count, path, tar_format)
    return count


def _add_member(tar: tarfile.TarFile, name: str, data: bytes, *, where: str, tar_format: str) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigError(
            format_message(f"part {name!r} is not bytes", where=where, expected="bytes", found=type(data).__name__)
        )
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = FIXED_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    try:
        tar.addfile(info, io.BytesIO(bytes(data)))
    except ValueError as exc:  # tarfile: "name is too long" for ustar
        raise ConfigError(
            format_message(
                f"cannot store member {name!r} ({len(name)} chars) as {tar_format}: {exc}",
                where=where,
                fix="use tar_format='gnu' or 'pax' for long names",
            )
        ) from exc


# -- images --------------------------------------------------------------------------------------

# Noise level tuned so a 256x256 JPEG at quality 90 is about 20 KB, like a typical web photo.
_IMAGE_NOISE = 8.0


def _image_array(width: int, height: int, seed: Seed) -> np.ndarray:
    """An RGB uint8 array: colour gradients, a few low-frequency waves and a little pixel noise."""
    _check_positive("width", width)
    _check_positive("height", height)
    rng = _rng(seed, _STREAM_IMAGE)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None] - 0.5
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None] - 0.5
    base = rng.uniform(40, 215, 3).astype(np.float32)
    gx = rng.uniform(-80, 80, 3).astype(np.float32)
    gy = rng.uniform(-80, 80, 3).astype(np.float32)
    image = base + gx * x + gy * y
    for _ in range(3):
        fx, fy = rng.uniform(0.5, 6.0, 2) * rng.choice([-1.0, 1.0], 2)
        phase = rng.uniform(0.0, 2.0 * np.pi)
        amplitude = rng.uniform(10, 35, 3).astype(np.float32)
        image = image + amplitude * np.sin(np.float32(2.0 * np.pi) * (np.float32(fx) * x + np.float32(fy) * y) + np.float32(phase))
    image += rng.standard_normal((height, width, 3), dtype=np.float32) * np.float32(_IMAGE_NOISE)
    return np.clip(image, 0, 255).astype(np.uint8)


def make_jpeg(width: int, height: int, *, seed: Seed, quality: int = 90) -> bytes:
    """A real baseline JPEG (RGB) of ``width`` x ``height``; about 20 KB at 256x256, quality 90."""
    from PIL import Image

    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ConfigError(format_message("invalid JPEG quality", expected="an int in 1..100", found=repr(quality)))
    buffer = io.BytesIO()
    Image.fromarray(_image_array(width, height, seed), "RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def make_png(width: int, height: int, *, seed: Seed, mode: str = "RGB") -> bytes:
    """A real PNG of ``width`` x ``height`` in Pillow ``mode`` (``RGB``, ``RGBA``, ``L``, ``LA``, ...)."""
    from PIL import Image

    image = Image.fromarray(_image_array(width, height, seed), "RGB")
    if mode != "RGB":
        try:
            image = image.convert(mode)
        except ValueError as exc:
            raise ConfigError(
                format_message("unsupported PNG mode", expected="a Pillow mode such as RGB, RGBA, L, LA", found=repr(mode))
            ) from exc
    buffer = io.BytesIO()
    try:
        image.save(buffer, format="PNG")
    except OSError as exc:
        raise ConfigError(format_message(f"PNG cannot store mode {mode!r}", found=str(exc))) from exc
    return buffer.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# -- text ----------------------------------------------------------------------------------------


def _words(rng: np.random.Generator, count: int) -> list[str]:
    return [WORDS[i] for i in rng.integers(0, len(WORDS), count)]


def make_caption(rng_or_seed: np.random.Generator | Seed, *, min_words: int = 4, max_words: int = 16) -> str:
    """One capitalised pseudo-English sentence of ``min_words..max_words`` words, ending with a dot.

    A ``numpy.random.Generator`` is advanced; a seed gives the same caption every time.
    """
    _check_word_range(min_words, max_words)
    rng = _as_rng(rng_or_seed, _STREAM_TEXT)
    words = _words(rng, int(rng.integers(min_words, max_words + 1)))
    if not words:
        return ""
    return " ".join(words).capitalize() + "."


def make_text(rng_or_seed: np.random.Generator | Seed, *, min_words: int = 5, max_words: int = 400) -> str:
    """Pseudo-English paragraphs totalling ``min_words..max_words`` words (sentences of 3-20 words)."""
    _check_word_range(min_words, max_words)
    rng = _as_rng(rng_or_seed, _STREAM_TEXT)
    remaining = int(rng.integers(min_words, max_words + 1))
    sentences: list[str] = []
    while remaining > 0:
        length = min(remaining, int(rng.integers(3, 21)))
        sentence = " ".join(_words(rng, length)).capitalize() + "."
        # A paragraph break now and then, so texts have some line structure.
        sentences.append(sentence + ("\n\n" if rng.random() < 0.1 else " "))
        remaining -= length
    return "".join(sentences).rstrip()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# -- datasets ------------------------------------------------------------------------------------


def _check_key(key: str, where: str) -> None:
    last = key.rsplit("/", 1)[-1]
    if not last or "." in last or last.startswith("."):
        raise ConfigError(
            format_message(
                f"sample key {key!r} would not survive Energon's key/part split",
                where=where,
                expected="a key whose last path component is non-empty and has no '.'",
                fix="change key_pattern",
            )
        )


def _shard_path(root: Path, shard_pattern: str, shard: int) -> Path:
    try:
        relative = shard_pattern.format(shard)
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(
            format_message("invalid shard_pattern", expected="a str.format pattern like 'shards/data-{:04d}.tar'", found=repr(shard_pattern))
        ) from exc
    if not relative.endswith(".tar"):
        raise ConfigError(format_message("invalid shard_pattern", expected="a path ending in .tar", found=repr(relative)))
    return root / relative


def _format_key(key_pattern: str, shard: int, index: int) -> str:
    try:
        key = key_pattern.format(shard=shard, index=index)
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(
            format_message("invalid key_pattern", expected="a str.format pattern using {shard} and {index}", found=repr(key_pattern))
        ) from exc
    _check_key(key, f"key_pattern {key_pattern!r}")
    return key


def _image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2:
        raise ConfigError(format_message("invalid image_size", expected="(width, height) or an int", found=repr(image_size)))
    for value in size:
        _check_positive("image_size", value)
    return int(size[0]), int(size[1])


def _captioning_shard(
    path: Path, shard: int, samples_per_shard: int, width: int, height: int, image_format: str, seed: int, key_pattern: str, tar_format: str
) -> int:
    def samples() -> Iterator[tuple[str, dict[str, bytes]]]:
        for index in range(samples_per_shard):
            rng = _rng((seed, shard, index), _STREAM_SAMPLE)
            caption = make_caption(rng)
            tags = sorted(set(_words(rng, int(rng.integers(1, 5)))))
            label = int(rng.integers(0, 10))
            if image_format == "jpg":
                image = make_jpeg(width, height, seed=(seed, shard, index))
            else:
                image = make_png(width, height, seed=(seed, shard, index))
            record = {"caption": caption, "id": shard * samples_per_shard + index, "tags": tags}
            yield _format_key(key_pattern, shard, index), {
                image_format: image,
                "txt": caption.encode("utf-8"),
                "json": _json_bytes(record),
                "cls": str(label).encode("ascii"),
            }

    return write_tar(path, samples(), tar_format=tar_format)


def _text_shard(
    path: Path, shard: int, samples_per_shard: int, min_words: int, max_words: int, seed: int, key_pattern: str, tar_format: str
) -> int:
    samples = (
        (
            _format_key(key_pattern, shard, index),
            {"txt": make_text(_rng((seed, shard, index), _STREAM_SAMPLE), min_words=min_words, max_words=max_words).encode("utf-8")},
        )
        for index in range(samples_per_shard)
    )
    return write_tar(path, samples, tar_format=tar_format)


def _run_shards(
    jobs: list[tuple[Callable[..., int], tuple[Any, ...]]], *, num_workers: int, progress: bool, desc: str, samples_per_shard: int
) -> None:
    """Runs one job per shard, in this process or in ``num_workers`` spawned processes."""
    from tqdm import tqdm

    bar = tqdm(total=len(jobs) * samples_per_shard, desc=desc, unit="sample", disable=not progress)
    with bar:
        if num_workers <= 1 or len(jobs) <= 1:
            for function, args in jobs:
                bar.update(function(*args))
            return
        # spawn, not fork: callers (pytest, training scripts) may already run threads.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(num_workers, len(jobs)), mp_context=context) as pool:
            futures = [pool.submit(function, *args) for function, args in jobs]
            for future in concurrent.futures.as_completed(futures):
                bar.update(future.result())


def generate_captioning_dataset(
    root: str | os.PathLike[str],
    *,
    num_shards: int,
    samples_per_shard: int,
    image_size: int | tuple[int, int] = (64, 64),
    image_format: str = "jpg",
    seed: int = 0,
    shard_pattern: str = "shards/data-{:04d}.tar",
    key_pattern: str = "{shard:04d}_{index:06d}",
    tar_format: str = "ustar",
    num_workers: int = 1,
    progress: bool = False,
) -> list[Path]:
    """Writes an image-caption dataset (not prepared) and returns the shard paths in shard order.

    Each sample has, in this order: ``jpg`` (or ``png``) of ``image_size = (width, height)``, ``txt``
    (the caption), ``json`` (``{"caption", "id", "tags"}``, ``id`` global and consecutive) and ``cls``
    (an int 0..9 as ASCII). Output does not depend on ``num_workers``.
    """
    _check_positive("num_shards", num_shards, allow_zero=True)
    _check_positive("samples_per_shard", samples_per_shard, allow_zero=True)
    _check_positive("num_workers", num_workers)
    _seed_entropy(seed)
    width, height = _image_size(image_size)
    if image_format not in IMAGE_FORMATS:
        raise ConfigError(format_message("unknown image_format", expected=" | ".join(IMAGE_FORMATS), found=repr(image_format)))
    if tar_format not in TAR_FORMATS:
        raise ConfigError(format_message("unknown tar format", expected=" | ".join(TAR_FORMATS), found=repr(tar_format)))
    root = Path(root)
    paths = [_shard_path(root, shard_pattern, shard) for shard in range(num_shards)]
    _format_key(key_pattern, 0, 0)  # fail before any work on a bad pattern
    jobs = [
        (_captioning_shard, (path, shard, samples_per_shard, width, height, image_format, seed, key_pattern, tar_format))
        for shard, path in enumerate(paths)
    ]
    _run_shards(jobs, num_workers=num_workers, progress=progress, desc="captioning shards", samples_per_shard=samples_per_shard)
    logger.info("generated %d captioning shards under %s", num_shards, root)
    return paths


def generate_text_dataset(
    root: str | os.PathLike[str],
    *,
    num_shards: int,
    samples_per_shard: int,
    min_words: int = 5,
    max_words: int = 400,
    seed: int = 0,
    shard_pattern: str = "shards/data-{:04d}.tar",
    key_pattern: str = "{shard:04d}_{index:06d}",
    tar_format: str = "ustar",
    num_workers: int = 1,
    progress: bool = False,
) -> list[Path]:
    """Writes a text-only dataset (part ``txt``, ``min_words..max_words`` words each); returns shard paths."""
    _check_positive("num_shards", num_shards, allow_zero=True)
    _check_positive("samples_per_shard", samples_per_shard, allow_zero=True)
    _check_positive("num_workers", num_workers)
    _check_word_range(min_words, max_words)
    _seed_entropy(seed)
    if tar_format not in TAR_FORMATS:
        raise ConfigError(format_message("unknown tar format", expected=" | ".join(TAR_FORMATS), found=repr(tar_format)))
    root = Path(root)
    paths = [_shard_path(root, shard_pattern, shard) for shard in range(num_shards)]
    _format_key(key_pattern, 0, 0)
    jobs = [
        (_text_shard, (path, shard, samples_per_shard, min_words, max_words, seed, key_pattern, tar_format))
        for shard, path in enumerate(paths)
    ]
    _run_shards(jobs, num_workers=num_workers, progress=progress, desc="text shards", samples_per_shard=samples_per_shard)
    logger.info("generated %d text shards under %s", num_shards, root)
    return paths


#: Folder prefix of the demo's long keys: member names exceed ustar's 100-char name field.
DEMO_LONG_PREFIX = "long/" + "a_rather_deeply_nested_folder/" * 4
_DEMO_PART_ORDER = ("jpg", "png", "mp4", "wav", "txt", "json", "cls", "npy")
_DEMO_VIDEO_SIZES = ((32, 24), (24, 32), (32, 32))


def _demo_media(seed: int, shard: int, index: int) -> dict[str, bytes]:
    """About 12% of the samples get a short mp4 (a third of them with an AAC audio track), 8% a
    16 kHz wav. Its own random stream, so the other parts are the same with or without media."""
    rng = _rng((seed, shard, index), _STREAM_MEDIA)
    kind = rng.random()
    if kind < 0.12:
        size = _DEMO_VIDEO_SIZES[int(rng.integers(0, len(_DEMO_VIDEO_SIZES)))]
        return {"mp4": make_video(frames=int(rng.integers(4, 13)), fps=8, size=size, audio_rate=16000 if kind < 0.04 else None)}
    if kind < 0.2:
        return {"wav": make_audio(float(rng.uniform(0.25, 1.0)), 16000)}
    return {}


def _demo_sample(seed: int, shard: int, index: int, long_key: bool, media: bool) -> tuple[str, dict[str, bytes]]:
    rng = _rng((seed, shard, index), _STREAM_SAMPLE)
    key = f"{DEMO_LONG_PREFIX if long_key else ''}{shard:04d}_{index:06d}"
    parts: dict[str, bytes] = _demo_media(seed, shard, index) if media else {}
    width, height = (int(v) for v in rng.integers(16, 97, 2))
    image_kind = rng.random()
    if image_kind < 0.6:
        parts["jpg"] = make_jpeg(width, height, seed=(seed, shard, index))
    elif image_kind < 0.85:
        parts["png"] = make_png(width, height, seed=(seed, shard, index), mode="RGBA" if rng.random() < 0.3 else "RGB")
    caption = make_caption(rng)
    parts["txt"] = caption.encode("utf-8")
    label = int(rng.integers(0, 10))
    parts["json"] = _json_bytes(
        {"caption": caption, "id": index, "shard": shard, "label": label, "modalities": [p for p in ("jpg", "png", "mp4", "wav") if p in parts]}
    )
    if rng.random() < 0.5:
        parts["cls"] = str(label).encode("ascii")
    if rng.random() < 0.4:
        shape = tuple(int(v) for v in rng.integers(1, 9, 2))
        parts["npy"] = _npy_bytes(rng.standard_normal(shape, dtype=np.float32))
    return key, {name: parts[name] for name in _DEMO_PART_ORDER if name in parts}


def _demo_shard(path: Path, shard: int, samples_per_shard: int, seed: int, tar_format: str, media: bool) -> int:
    long_keys = tar_format == "pax"
    samples = (_demo_sample(seed, shard, index, long_keys and index % 8 == 3, media) for index in range(samples_per_shard))
    return write_tar(path, samples, tar_format=tar_format)


def _pyav_importable() -> bool:
    try:
        importlib.import_module("av")
    except ImportError:
        return False
    return True


def generate_demo_dataset(
    root: str | os.PathLike[str], *, num_shards: int = 4, samples_per_shard: int = 25, seed: int = 0, media: bool | None = None
) -> list[Path]:
    """Writes a small multimodal dataset (``shards/demo-NNNN.tar``) and returns the shard paths.

    Every sample has ``txt`` and ``json``; most have a ``jpg`` or a ``png`` (RGB or RGBA, 16-96 px),
    about half a ``cls`` and some a small float32 ``npy``. With ``media`` (default: when PyAV is
    installed) about 12% of the samples also have a short H.264 ``mp4`` (4-12 frames, 24-32 px, a
    third with an AAC audio track) and 8% a 16 kHz ``wav`` (0.25-1 s); the other parts are the same
    either way, but for the json's list of ``modalities``. Shards alternate ustar and gnu; the last
    is pax and holds a few samples (every 8th from index 3) whose key starts with
    :data:`DEMO_LONG_PREFIX`, so their member names are longer than 100 chars.
    """
    if media is None:
        media = _pyav_importable()
    _check_positive("num_shards", num_shards, allow_zero=True)
    _check_positive("samples_per_shard", samples_per_shard, allow_zero=True)
    _seed_entropy(seed)
    root = Path(root)
    paths = []
    for shard in range(num_shards):
        tar_format = "pax" if shard == num_shards - 1 else ("ustar", "gnu")[shard % 2]
        path = root / f"shards/demo-{shard:04d}.tar"
        _demo_shard(path, shard, samples_per_shard, seed, tar_format, media)
        paths.append(path)
    logger.info("generated %d demo shards under %s", num_shards, root)
    return paths


# -- JSONL ---------------------------------------------------------------------------------------


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> int:
    """Writes one compact JSON object per line (UTF-8, ``\\n`` after each), atomically; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temporary(path)
    count = 0
    try:
        with os.fdopen(fd, "wb") as file:
            for record in records:
                if not isinstance(record, Mapping):
                    raise ConfigError(
                        format_message(
                            "a JSONL record must be a JSON object",
                            where=f"{path}, record #{count}",
                            expected="a mapping",
                            found=type(record).__name__,
                        )
                    )
                file.write(_json_bytes(dict(record)) + b"\n")
                count += 1
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def generate_jsonl(path: str | os.PathLike[str], *, num_records: int, seed: int = 0) -> int:
    """Writes ``num_records`` records ``{"id", "question", "answer", "label", "tags"}``; returns the count."""
    _check_positive("num_records", num_records, allow_zero=True)
    _seed_entropy(seed)

    def records() -> Iterator[dict[str, Any]]:
        for index in range(num_records):
            rng = _rng((seed, index), _STREAM_JSONL)
            yield {
                "id": index,
                "question": make_caption(rng, min_words=3, max_words=12)[:-1] + "?",
                "answer": make_text(rng, min_words=1, max_words=60),
                "label": int(rng.integers(0, 10)),
                "tags": _words(rng, int(rng.integers(0, 4))),
            }

    return write_jsonl(path, records())


def make_video(frames: int = 16, fps: int = 8, size: tuple[int, int] = (64, 48), codec: str = "libx264", audio_rate: int | None = None, gop: int = 4) -> bytes:
    """An H.264 mp4 (lossless) whose frame i is a flat gray of value ``(8 * i) % 256``, so tests can
    tell frames apart; with ``audio_rate`` also a mono AAC 440 Hz tone.  Needs PyAV (the ``av`` extra)."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.thread_count = 1  # x264's output depends on its thread count: same bytes on every machine
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "0"}
        audio = None
        if audio_rate:
            audio = container.add_stream("aac", rate=audio_rate)
            audio.layout = "mono"
        for i in range(frames):
            image = np.full((size[1], size[0], 3), (8 * i) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            samples = make_tone(frames / fps, audio_rate)
            for start in range(0, samples.shape[1], 1024):
                chunk = av.AudioFrame.from_ndarray(samples[:, start : start + 1024], format="fltp", layout="mono")
                chunk.sample_rate = audio_rate
                for packet in audio.encode(chunk):
                    container.mux(packet)
            for packet in audio.encode():
                container.mux(packet)
    return buffer.getvalue()


def make_tone(seconds: float, rate: int) -> np.ndarray:
    """A mono 440 Hz sine, float32 of shape (1, samples)."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]


def make_audio(seconds: float = 1.0, rate: int = 16000, fmt: str = "wav") -> bytes:
    """A mono 440 Hz tone as 16-bit WAV or FLAC.  Needs PyAV (the ``av`` extra)."""
    import av

    codec = {"wav": "pcm_s16le", "flac": "flac"}[fmt]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        samples = (make_tone(seconds, rate) * 32767).astype(np.int16)
        for start in range(0, samples.shape[1], 4096):
            frame = av.AudioFrame.from_ndarray(samples[:, start : start + 4096], format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


TEXT_SAMPLE_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: txt\n"
CAPTIONING_SAMPLE_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


def prepared_captioning_dataset(root: str | os.PathLike[str], **generate: Any) -> Path:
    """:func:`generate_captioning_dataset` at ``root`` (its keyword arguments), prepared as one
    train split of ``CaptioningSample`` (image: jpg, caption: txt); returns ``root``."""
    root = Path(root)
    generate_captioning_dataset(root, **generate)
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTIONING_SAMPLE_YAML)
    return root


def prepared_text_dataset(root: str | os.PathLike[str], *, split_ratio: tuple[float, float, float] = (1, 0, 0), **generate: Any) -> Path:
    """:func:`generate_text_dataset` at ``root`` (its keyword arguments), prepared with
    ``split_ratio`` (default: all train) as ``TextSample`` (text: txt); returns ``root``."""
    root = Path(root)
    generate_text_dataset(root, **generate)
    prepare_dataset(root, split_ratio=split_ratio, progress=False, num_workers=1, dataset_yaml=TEXT_SAMPLE_YAML)
    return root
