"""examples/video_aux.py runs end to end: video read from an aux folder through FileStoreCachePool."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

av = pytest.importorskip("av")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "video_aux.py"
BATCH = re.compile(r"^batch (\d+): keys (\[.*?\]), frames (\(.*?\)) torch\.uint8, decoded as (\[.*?\])$")
SAMPLE = re.compile(r"^  (\S+): sources (\[.*?\]) \(([\d.]+) s\)$")


def run_example(data_dir: Path, *args: str) -> str:
    run = subprocess.run([sys.executable, str(EXAMPLE), "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def generated_questions(root: Path) -> dict[str, str]:
    """Sample key -> the clip its json names, read from the shards the example wrote."""
    clips = {}
    for shard in sorted((root / "crude/shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    clips[member.name[: -len(".json")]] = json.loads(tar.extractfile(member).read())["video"]
    return clips


def clip_duration(path: Path) -> float:
    """Frames / frame rate of an mp4, counted by decoding it with PyAV."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        return frames / float(stream.average_rate)


@pytest.mark.parametrize("workers,frames,size,batch_size", [(0, 4, (64, 48), 3), (2, 3, (32, 24), 2)])
def test_video_aux_example(tmp_path: Path, workers: int, frames: int, size: tuple[int, int], batch_size: int) -> None:
    batches = 2
    output = run_example(tmp_path, "--batches", str(batches), "--workers", str(workers), "--frames", str(frames), "--size", f"{size[0]}x{size[1]}",
                         "--batch-size", str(batch_size), "--samples", "10", "--clips", "4")
    root = tmp_path / "video_aux"
    clips = generated_questions(root)
    assert len(clips) == 10 and len(set(clips.values())) > 1
    assert all((root / "media" / clip).is_file() for clip in clips.values())

    parsed: list[tuple[list[str], list[tuple[str, list[str], float]]]] = []
    for line in output.splitlines():
        if match := BATCH.match(line):
            index, keys, shape, decoded = match.groups()
            assert int(index) == len(parsed)
            assert ast.literal_eval(shape) == (batch_size, frames, 3, size[1], size[0])
            assert ast.literal_eval(decoded) == ["AVDecoder"]  # the decoder made the .mp4 a lazy AVDecoder
            parsed.append((ast.literal_eval(keys), []))
        elif match := SAMPLE.match(line):
            key, sources, duration = match.groups()
            parsed[-1][1].append((key, ast.literal_eval(sources), float(duration)))
    assert len(parsed) == batches, output

    durations = {}
    for keys, samples in parsed:
        assert len(keys) == batch_size and [key for key, _, _ in samples] == keys, output
        for key, sources, duration in samples:
            clip = clips[key]
            assert sources == [f"media/{clip}"]  # the one aux read, named by folder and file
            if clip not in durations:
                durations[clip] = clip_duration(root / "media" / clip)
            assert duration == pytest.approx(durations[clip], abs=1e-3)  # from prepare-media's metadata
