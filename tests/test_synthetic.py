"""Synthetic data generators: tars read back with Python's tarfile, bytes are deterministic per seed."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from energon_lite_dev.synthetic import (
    WORDS,
    generate_captioning_dataset,
    generate_demo_dataset,
    generate_jsonl,
    generate_text_dataset,
    make_caption,
    make_jpeg,
    make_png,
    make_text,
    write_jsonl,
    write_tar,
)
from PIL import Image

from megatron_energon_lite.errors import ConfigError

# Energon's split rule (flavors/webdataset/prepare.py): key up to the first dot of the last component.
SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def read_members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path, "r:") as tar:
        return [(info, tar.extractfile(info).read()) for info in tar.getmembers()]


def group_samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """Groups consecutive members by key, as Energon does."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    for info, data in read_members(path):
        match = SPLIT_NAME_RE.match(info.name)
        assert match, info.name
        key, part = match.groups()
        if not samples or samples[-1][0] != key:
            samples.append((key, {}))
        samples[-1][1][part] = data
    return samples


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- write_tar -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tar_format", ["ustar", "gnu", "pax"])
def test_write_tar_round_trips_names_bytes_and_order(tmp_path: Path, tar_format: str) -> None:
    rng = np.random.default_rng(7)
    samples = [
        ("b_second_first", {"txt": b"hello", "json": b'{"a": 1}', "detail.json": b"[]"}),
        ("a_first_second", {"jpg": rng.bytes(1234), "txt": b""}),
        ("dir/sub/k3", {"bin": rng.bytes(512), "txt": "ünïcode".encode()}),
        ("ü_key", {"txt": b"x" * 10_000}),
    ]
    path = tmp_path / "nested" / "out.tar"
    assert write_tar(path, samples, tar_format=tar_format) == len(samples)
    members = read_members(path)
    expected = [(f"{key}.{part}", data) for key, parts in samples for part, data in parts.items()]
    assert [(info.name, data) for info, data in members] == expected
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("tar_format", ["gnu", "pax"])
def test_write_tar_keeps_long_names(tmp_path: Path, tar_format: str) -> None:
    long_key = "deep/" * 60 + "k" * 150  # 450 chars: longer than ustar's prefix + name fields
    path = tmp_path / "long.tar"
    write_tar(path, [(long_key, {"txt": b"a", "json": b"{}"}), ("short", {"txt": b"b"})], tar_format=tar_format)
    assert [info.name for info, _ in read_members(path)] == [f"{long_key}.txt", f"{long_key}.json", "short.txt"]
    assert group_samples(path) == [(long_key, {"txt": b"a", "json": b"{}"}), ("short", {"txt": b"b"})]


def test_write_tar_ustar_splits_long_paths_and_rejects_unsplittable(tmp_path: Path) -> None:
    splittable = "dir/" * 40 + "k"  # fits ustar's 155-char prefix + 100-char name
    write_tar(tmp_path / "ok.tar", [(splittable, {"txt": b"a"})])
    assert [info.name for info, _ in read_members(tmp_path / "ok.tar")] == [f"{splittable}.txt"]
    target = tmp_path / "bad.tar"
    target.write_bytes(b"old content")
    with pytest.raises(ConfigError, match="gnu' or 'pax'"):
        write_tar(target, [("ok", {"txt": b"a"}), ("k" * 120, {"txt": b"b"})])
    assert target.read_bytes() == b"old content"  # atomic: the old file is untouched
    assert not list(tmp_path.rglob("*.tmp"))


def test_write_tar_metadata_is_fixed_and_output_deterministic(tmp_path: Path) -> None:
    samples = [(f"k{i}", {"txt": str(i).encode(), "cls": b"3"}) for i in range(5)]
    write_tar(tmp_path / "a.tar", samples)
    write_tar(tmp_path / "b.tar", samples)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    infos = [info for info, _ in read_members(tmp_path / "a.tar")]
    assert len({info.mtime for info in infos}) == 1
    assert all(info.isreg() and info.uid == 0 and info.gid == 0 and info.mode == 0o644 for info in infos)


@pytest.mark.parametrize("tar_format", ["zip", "USTAR", "", "v7"])
def test_write_tar_rejects_unknown_formats(tmp_path: Path, tar_format: str) -> None:
    with pytest.raises(ConfigError, match="tar format"):
        write_tar(tmp_path / "a.tar", [("k", {"txt": b"a"})], tar_format=tar_format)
    assert not list(tmp_path.iterdir())


def test_write_tar_rejects_non_bytes_parts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not bytes"):
        write_tar(tmp_path / "a.tar", [("k", {"txt": "a str"})])  # type: ignore[dict-item]
    assert not list(tmp_path.iterdir())


# -- images and text -----------------------------------------------------------------------------


def test_jpeg_decodes_to_the_asked_size_and_is_deterministic() -> None:
    data = make_jpeg(40, 24, seed=3)
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.size, image.mode) == ("JPEG", (40, 24), "RGB")
    assert make_jpeg(40, 24, seed=3) == data
    assert make_jpeg(40, 24, seed=4) != data
    assert make_jpeg(40, 24, seed=(3, 1)) != data


@pytest.mark.parametrize("seed", [0, 1, 17, 12345])
def test_jpeg_size_at_256_is_realistic(seed: int) -> None:
    assert 10_000 <= len(make_jpeg(256, 256, seed=seed)) <= 40_000


def test_jpeg_has_structure_not_flat_colour() -> None:
    pixels = np.asarray(Image.open(io.BytesIO(make_jpeg(64, 64, seed=5))), dtype=np.float32)
    assert pixels.std() > 5
    assert len(make_jpeg(64, 64, seed=5, quality=30)) < len(make_jpeg(64, 64, seed=5, quality=95))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA"])
def test_png_modes(mode: str) -> None:
    data = make_png(20, 10, seed=1, mode=mode)
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.size, image.mode) == ("PNG", (20, 10), mode)
    assert make_png(20, 10, seed=1, mode=mode) == data
    assert make_png(20, 10, seed=2, mode=mode) != data


@pytest.mark.parametrize(
    "call",
    [
        lambda: make_png(4, 4, seed=0, mode="nonsense"),
        lambda: make_jpeg(0, 4, seed=0),
        lambda: make_jpeg(4, 4, seed=0, quality=101),
        lambda: make_jpeg(4, 4, seed=-1),
        lambda: make_jpeg(4, 4, seed=1.5),  # type: ignore[arg-type]
        lambda: make_caption(0, min_words=5, max_words=2),
    ],
)
def test_bad_arguments_are_config_errors(call) -> None:
    with pytest.raises(ConfigError):
        call()


def test_caption_and_text_use_the_word_list_and_respect_lengths() -> None:
    vocabulary = set(WORDS)
    for seed in range(20):
        caption = make_caption(seed, min_words=2, max_words=6)
        assert caption.endswith(".")
        words = caption[:-1].lower().split()
        assert 2 <= len(words) <= 6 and set(words) <= vocabulary
        text = make_text(seed, min_words=10, max_words=50)
        words = re.findall(r"[a-z]+", text.lower())
        assert 10 <= len(words) <= 50 and set(words) <= vocabulary
    assert make_text(1, min_words=3, max_words=3).count(" ") == 2


def test_text_is_deterministic_per_seed_and_generators_advance() -> None:
    assert make_caption(5) == make_caption(5)
    assert len({make_caption(seed) for seed in range(10)}) == 10
    assert make_text(5, min_words=20, max_words=40) == make_text(5, min_words=20, max_words=40)
    rng = np.random.default_rng(1)
    first, second = make_caption(rng), make_caption(rng)
    assert first != second
    rng = np.random.default_rng(1)
    assert (make_caption(rng), make_caption(rng)) == (first, second)


# -- datasets ------------------------------------------------------------------------------------


def test_captioning_dataset_layout_and_parts(tmp_path: Path) -> None:
    paths = generate_captioning_dataset(tmp_path, num_shards=3, samples_per_shard=4, image_size=(32, 16), seed=1)
    assert paths == [tmp_path / f"shards/data-{i:04d}.tar" for i in range(3)]
    ids = []
    for shard, path in enumerate(paths):
        samples = group_samples(path)
        assert [key for key, _ in samples] == [f"{shard:04d}_{i:06d}" for i in range(4)]
        for _, parts in samples:
            assert list(parts) == ["jpg", "txt", "json", "cls"]
            assert Image.open(io.BytesIO(parts["jpg"])).size == (32, 16)
            record = json.loads(parts["json"])
            assert set(record) == {"caption", "id", "tags"}
            assert record["caption"] == parts["txt"].decode()
            assert record["tags"] and set(record["tags"]) <= set(WORDS)
            assert 0 <= int(parts["cls"].decode("ascii")) < 10
            ids.append(record["id"])
    assert ids == list(range(12))


def test_captioning_dataset_png_patterns_and_tar_format(tmp_path: Path) -> None:
    paths = generate_captioning_dataset(
        tmp_path, num_shards=2, samples_per_shard=2, image_format="png", shard_pattern="x/part_{}.tar",
        key_pattern="s{shard}/k{index:03d}", tar_format="gnu",
    )
    assert paths == [tmp_path / "x/part_0.tar", tmp_path / "x/part_1.tar"]
    samples = group_samples(paths[1])
    assert [key for key, _ in samples] == ["s1/k000", "s1/k001"]
    assert Image.open(io.BytesIO(samples[0][1]["png"])).format == "PNG"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"image_format": "gif"},
        {"tar_format": "zip"},
        {"key_pattern": "{shard}.{index}"},  # a dot would move the key/part boundary
        {"key_pattern": "{nope}"},
        {"shard_pattern": "shards/{:04d}.zip"},
        {"image_size": (8, 8, 3)},
        {"num_shards": -1},
    ],
)
def test_captioning_dataset_rejects_bad_arguments(tmp_path: Path, kwargs: dict) -> None:
    arguments = {"num_shards": 1, "samples_per_shard": 1, **kwargs}
    with pytest.raises(ConfigError):
        generate_captioning_dataset(tmp_path, **arguments)
    assert not list(tmp_path.rglob("*.tar"))


def test_captioning_dataset_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        generate_captioning_dataset(tmp_path / name, num_shards=2, samples_per_shard=3, seed=seed)
    a, b, c = (tree_bytes(tmp_path / name) for name in "abc")
    assert a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_parallel_generation_writes_the_same_bytes(tmp_path: Path) -> None:
    generate_captioning_dataset(tmp_path / "one", num_shards=3, samples_per_shard=2, num_workers=1)
    generate_captioning_dataset(tmp_path / "two", num_shards=3, samples_per_shard=2, num_workers=2)
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")


def test_text_dataset_lengths_vary_within_bounds(tmp_path: Path) -> None:
    paths = generate_text_dataset(tmp_path / "a", num_shards=2, samples_per_shard=20, min_words=3, max_words=80, seed=4)
    lengths = []
    for path in paths:
        for _, parts in group_samples(path):
            assert list(parts) == ["txt"]
            lengths.append(len(parts["txt"].decode().split()))
    assert len(lengths) == 40 and min(lengths) >= 3 and max(lengths) <= 80
    assert len(set(lengths)) > 10
    generate_text_dataset(tmp_path / "b", num_shards=2, samples_per_shard=20, min_words=3, max_words=80, seed=4)
    generate_text_dataset(tmp_path / "c", num_shards=2, samples_per_shard=20, min_words=3, max_words=80, seed=5)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b") != tree_bytes(tmp_path / "c")


def test_demo_dataset_mixes_modalities_and_long_pax_names(tmp_path: Path) -> None:
    paths = generate_demo_dataset(tmp_path, num_shards=4, samples_per_shard=25)
    assert len(paths) == 4 and all(p.is_file() for p in paths)
    keys, part_sets, long_names = [], set(), []
    for path in paths:
        samples = group_samples(path)
        assert len(samples) == 25
        for key, parts in samples:
            keys.append(key)
            part_sets.add(tuple(parts))
            assert {"txt", "json"} <= set(parts)
            if "npy" in parts:
                array = np.load(io.BytesIO(parts["npy"]), allow_pickle=False)
                assert array.dtype == np.float32 and array.ndim == 2
            for image_part in ("jpg", "png"):
                if image_part in parts:
                    Image.open(io.BytesIO(parts[image_part])).verify()
            assert json.loads(parts["json"])["modalities"] == [p for p in ("jpg", "png", "mp4", "wav") if p in parts]
        with tarfile.open(path) as tar:
            long_names += [(path, m.name) for m in tar.getmembers() if len(m.name) > 100]
    assert len(set(keys)) == len(keys) == 100
    assert {p for parts in part_sets for p in parts} == {"jpg", "png", "mp4", "wav", "txt", "json", "cls", "npy"}
    assert len(part_sets) > 3  # samples really differ in which parts they carry
    assert 0 < len({name.rsplit(".", 1)[0] for _, name in long_names}) < 25
    # Only the pax shard has long names; tarfile reads them back whole.
    assert {path for path, _ in long_names} == {paths[-1]}
    assert b"path=" in paths[-1].read_bytes()  # stored through a PAX extended header
    generate_demo_dataset(tmp_path / "again", num_shards=4, samples_per_shard=25)
    generate_demo_dataset(tmp_path / "other", num_shards=4, samples_per_shard=25, seed=1)
    original = {k: v for k, v in tree_bytes(tmp_path).items() if k.startswith("shards/")}
    assert tree_bytes(tmp_path / "again") == original != tree_bytes(tmp_path / "other")


def test_demo_media_parts_decode_and_leave_the_other_parts_alone(tmp_path: Path) -> None:
    from megatron_energon_lite.decode.av import AVDecoder

    with_media = generate_demo_dataset(tmp_path / "a", num_shards=2, samples_per_shard=30)
    without = generate_demo_dataset(tmp_path / "b", num_shards=2, samples_per_shard=30, media=False)
    videos = audios = with_track = 0
    for path_a, path_b in zip(with_media, without):
        for (key_a, parts_a), (key_b, parts_b) in zip(group_samples(path_a), group_samples(path_b), strict=True):
            assert key_a == key_b and not {"mp4", "wav"} & set(parts_b)
            assert {k: v for k, v in parts_a.items() if k not in ("mp4", "wav", "json")} == {k: v for k, v in parts_b.items() if k != "json"}
            if "mp4" in parts_a:
                meta = AVDecoder(parts_a["mp4"]).get_metadata(get_video_frame_count=True)
                assert 4 <= meta.video_num_frames <= 12 and {meta.video_width, meta.video_height} <= {24, 32}
                videos += 1
                with_track += meta.audio_sample_rate == 16000
            if "wav" in parts_a:
                meta = AVDecoder(parts_a["wav"]).get_metadata()
                assert meta.audio_sample_rate == 16000 and 0.24 <= meta.audio_duration <= 1.01
                audios += 1
    assert 0 < with_track < videos and audios > 0 and videos + audios < 30  # some samples, not most


# -- JSONL ---------------------------------------------------------------------------------------


def test_jsonl_lines_parse_and_are_deterministic(tmp_path: Path) -> None:
    assert generate_jsonl(tmp_path / "a.jsonl", num_records=50, seed=2) == 50
    raw = (tmp_path / "a.jsonl").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 50
    lines = raw.decode("utf-8").split("\n")[:-1]
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == list(range(50))
    assert all(line.startswith("{") and line.endswith("}") and ", " not in line for line in lines)
    generate_jsonl(tmp_path / "b.jsonl", num_records=50, seed=2)
    generate_jsonl(tmp_path / "c.jsonl", num_records=50, seed=3)
    assert (tmp_path / "b.jsonl").read_bytes() == raw != (tmp_path / "c.jsonl").read_bytes()


def test_write_jsonl_round_trips_and_rejects_non_objects(tmp_path: Path) -> None:
    records = [{"a": 1, "ü": "ß"}, {"nested": {"x": [1, 2.5, None, True]}}, {}]
    assert write_jsonl(tmp_path / "x" / "r.jsonl", records) == 3
    assert [json.loads(line) for line in (tmp_path / "x" / "r.jsonl").read_text("utf-8").splitlines()] == records
    with pytest.raises(ConfigError, match="JSON object"):
        write_jsonl(tmp_path / "bad.jsonl", [{"a": 1}, [1, 2]])  # type: ignore[list-item]
    assert not (tmp_path / "bad.jsonl").exists() and not list(tmp_path.rglob("*.tmp"))
