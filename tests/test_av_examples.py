"""examples/video_qa.py and examples/audio_captioning.py run end to end on tiny data."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(script: str, data_dir: Path, *args: str) -> str:
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def epoch_counts(output: str) -> tuple[int, int]:
    samples, batches = re.search(r"one epoch: (\d+) samples in (\d+) batches", output).groups()
    return int(samples), int(batches)


def test_video_qa_example(tmp_path: Path) -> None:
    output = run_example("video_qa.py", tmp_path, "--samples", "10", "--frames", "4", "--size", "32x24", "--batch-size", "3", "--workers", "2")
    lines = re.findall(r"batch \d+: video (\(.*?\)) torch.uint8, (\d+) questions, e.g. 'How many frames does clip (\d+) have\?' -> (\[.*\])", output)
    assert len(lines) == 3, output
    for shape, questions, clip, answers in lines:
        shape = ast.literal_eval(shape)
        assert shape[1:] == (4, 3, 24, 32) and shape[0] == int(questions) <= 3
        frames = 8 + int(clip) % 16  # how the example generates clip i; the answers come from its JSON
        assert ast.literal_eval(answers) == [str(frames), f"{frames} frames"]
    samples, batches = epoch_counts(output)
    assert samples == 10 and 4 <= batches <= 5  # 2 workers may each end with a partial batch
    # A second run reuses the prepared dataset.
    assert epoch_counts(run_example("video_qa.py", tmp_path, "--frames", "2", "--size", "16x16", "--workers", "0")) == (10, 3)


def test_audio_captioning_example(tmp_path: Path) -> None:
    output = run_example("audio_captioning.py", tmp_path, "--samples", "10", "--seconds", "0.5", "--batch-size", "3", "--workers", "0")
    lines = re.findall(r"batch \d+: audio (\(.*?\)) torch.float32, lengths (\[.*?\]), e.g. 'recording \d+: a ([\d.]+) second 440 Hz tone at (\d+) Hz'", output)
    assert len(lines) == 3, output
    for shape, lengths, seconds, _rate in lines:
        shape, lengths = ast.literal_eval(shape), ast.literal_eval(lengths)
        assert shape == (len(lengths), 1, 8000) and len(lengths) <= 3
        assert all(0 < n <= 8000 for n in lengths)
        assert lengths[0] == min(8000, round(float(seconds) * 16000))  # resampled to 16 kHz, then cut
    assert epoch_counts(output) == (10, 4)
    padded = int(re.search(r"(\d+) clips padded", output).group(1))
    assert 0 < padded < 10
