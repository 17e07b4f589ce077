"""``energon-lite bench``: rates, the stall report, the mock ceiling, the plot, and bad input."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from energon_lite_dev.synthetic import generate_captioning_dataset
from PIL import Image

from megatron_energon_lite.cli.bench import (
    COLOURS,
    PLOT_SIZE,
    Run,
    plot_throughput,
    samples_in,
    stall_lines,
)
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.format.prepare import prepare_dataset

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")]

CAPTION_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "images"
    generate_captioning_dataset(root, num_shards=2, samples_per_shard=10, image_size=(16, 16))
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTION_YAML)
    return root


def bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *map(str, args), "--no-progress"])


def rate(output: str, name: str) -> float:
    match = re.search(rf"^  {name}: ([\d,.]+)$", output, re.M)
    assert match, output
    return float(match.group(1).replace(",", ""))


def test_bench_prints_rates_ceiling_and_writes_the_plot(images: Path, tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    result = bench(images, "--batch-size", 2, "--num-workers", 2, "--seconds", 1, "--mock-seconds", 0.5, "--plot", out)
    assert result.exit_code == 0, result.output
    output = result.output
    batches, samples = rate(output, "batches/s"), rate(output, "samples/s")
    assert batches > 0 and samples == pytest.approx(2 * batches, rel=0.01)  # every batch holds 2 samples
    assert re.search(r"^time to first batch: \d+\.\d\d s \(and \d+\.\d\d s before it to build the dataset\)$", output, re.M)
    assert re.search(r"^  batches/s per worker: 0: [\d,.]+, 1: [\d,.]+$", output, re.M)
    assert re.search(r"^stall report: \S", output, re.M)
    ceiling = re.search(r"^mock ceiling \(mock=True, [\d.]+ s\): ([\d,.]+) batches/s, ([\d,.]+) samples/s$", output, re.M)
    assert ceiling, output
    mock_batches = float(ceiling.group(1).replace(",", ""))
    assert float(ceiling.group(2).replace(",", "")) == pytest.approx(2 * mock_batches, rel=0.01)
    share = re.search(r"^real / mock: ([\d.]+)% of the ceiling$", output, re.M)
    assert share and float(share.group(1)) == pytest.approx(batches / mock_batches * 100, abs=0.11)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == PLOT_SIZE
        colours = {colour for _, colour in image.convert("RGB").getcolors(PLOT_SIZE[0] * PLOT_SIZE[1])}
    assert COLOURS[0] in colours and COLOURS[1] in colours and COLOURS[2] not in colours  # a line per worker


def test_plot_draws_each_workers_rate(tmp_path: Path) -> None:
    # Worker 0: 10 batches/s for 2 s; worker 1: nothing in the first second, then 20 batches/s.
    events = [(i / 10, 0, 4) for i in range(20)] + [(1 + i / 20, 1, 4) for i in range(20)]
    run = Run(seconds=2.0, first_batch_s=0.1, events=sorted(events), workers=2)
    path = tmp_path / "p.png"
    plot_throughput(run, path, bin_s=0.5, title="test", size=(600, 400))
    with Image.open(path) as image:
        pixels = image.convert("RGB")
        assert image.size == (600, 400)
        # Worker 1's line is higher than worker 0's on the right and lower on the left.
        def rows_of(colour, x_range):
            return [y for x in x_range for y in range(400) if pixels.getpixel((x, y)) == colour]

        left, right = range(100, 200), range(380, 460)
        assert min(rows_of(COLOURS[1], left)) > max(rows_of(COLOURS[0], left))
        assert max(rows_of(COLOURS[1], right)) < min(rows_of(COLOURS[0], right))


def test_stall_lines_from_a_hand_made_report() -> None:
    report = {
        "wall_s": 60.0, "waited_s": 18.6, "waited_share": 0.31, "worker_s": 200.0,
        "stages": {"read": {"s": 20.0, "share": 0.1}, "decode": {"s": 144.0, "share": 0.72}, "batch": {"s": 36.0, "share": 0.18}},
        "datasets": {"coco": {"stages": {"decode": {"s": 100.0, "share": 0.5}}}, "empty": {"stages": {}}},
    }
    assert stall_lines(report) == [
        "  loop waited 18.60 s of 60.00 s (31.0%); loader work 200.00 s",
        "  stage     seconds   share",
        "  decode     144.00   72.0%",
        "  batch       36.00   18.0%",
        "  read        20.00   10.0%",
        "  dataset coco:",
        "    stage     seconds   share",
        "    decode     100.00   50.0%",
    ]
    assert stall_lines({}) == []
    assert stall_lines({"stages": {"odd": None}}) == ["  stage    seconds   share", "  odd         0.00    0.0%"]


def test_the_stall_report_shows_the_stages_and_the_dataset(images: Path) -> None:
    """A real report (SavableDataLoader.stall_report): the wait, the stages with their seconds, and
    the dataset's own stages (its reads and decodes happen before any blend)."""
    result = bench(images, "--batch-size", 2, "--num-workers", 0, "--seconds", 0.5, "--mock-seconds", 0)
    assert result.exit_code == 0, result.output
    assert re.search(r"^stall report: loader waited \d+% of [\d.]+ s \(\d+ batches\); .* of loader time$", result.output, re.M), result.output
    stages = dict(re.findall(r"^  (read|decode|batch|pipeline) +([\d.]+) +[\d.]+%$", result.output, re.M))
    assert set(stages) == {"read", "decode", "batch", "pipeline"}, result.output
    assert re.search(rf"^  dataset {re.escape(str(images))}:\n    stage .*\n(    (read|decode|cook) .*\n)+", result.output, re.M), result.output
    assert "mock ceiling" not in result.output  # --mock-seconds 0


@dataclasses.dataclass
class Batch:
    __key__: list
    image: torch.Tensor
    caption: list


def test_samples_in_odd_structures() -> None:
    assert samples_in(torch.zeros(5, 3)) == 5
    assert samples_in({"__key__": ["a"], "tokens": torch.zeros(7, 2)}) == 7
    assert samples_in({"ids": [1, 2, 3]}) == 3
    assert samples_in({"ids": np.zeros((4, 2))}) == 4
    assert samples_in(Batch(["a", "b"], torch.zeros(2, 3), ["x", "y"])) == 2
    assert samples_in([torch.zeros(6), torch.zeros(6)]) == 6
    assert samples_in((["a", "b", "c"],)) == 3
    for odd in ("text", 3, None, {}, {"n": 3}, torch.tensor(1.0), [], {"x": "abc"}, object()):
        assert samples_in(odd) is None, odd


ODD_ENCODER = """
from megatron_energon_lite import DefaultTaskEncoder

class OddEncoder(DefaultTaskEncoder):
    def encode_batch(self, batch):
        return {"summary": "a string, not a batch dimension"}

class NotAnEncoder:
    pass
"""


def test_task_encoders(images: Path, tmp_path: Path) -> None:
    module = tmp_path / "odd_encoders.py"
    module.write_text(ODD_ENCODER)
    result = bench(images, "--batch-size", 2, "--num-workers", 0, "--seconds", 0.3, "--mock-seconds", 0.2, "--task-encoder", f"{module}:OddEncoder")
    assert result.exit_code == 0, result.output
    assert "OddEncoder" in result.output and rate(result.output, "batches/s") > 0
    assert "  samples/s: n/a (batches have no first dimension to count samples by)" in result.output
    assert re.search(r"^mock ceiling .*: [\d,.]+ batches/s, n/a samples/s$", result.output, re.M)

    for spec, message in [
        ("no_such_module_xyz:Encoder", "cannot import the task encoder 'no_such_module_xyz:Encoder': ModuleNotFoundError"),
        (f"{module}:Missing", f"cannot import the task encoder '{module}:Missing'"),
        (f"{module}:NotAnEncoder", "is not a TaskEncoder (found NotAnEncoder)"),
        ("Encoder", "'Encoder' is not module:Class"),
    ]:
        result = bench(images, "--seconds", 0.3, "--task-encoder", spec)
        assert result.exit_code == 1, (spec, result.output)
        assert "Invalid value for '--task-encoder'" in result.output and message in result.output, result.output
        assert "Traceback" not in result.output


def test_a_yaml_with_a_missing_dataset(images: Path, tmp_path: Path) -> None:
    yaml = tmp_path / "blend.yaml"
    missing = tmp_path / "no_such_dataset"
    yaml.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - weight: 1\n        path: {images}\n      - weight: 1\n        path: {missing}\n"
    )
    result = bench(yaml, "--seconds", 0.3)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: dataset path does not exist") and str(missing) in result.output
    assert "splits.train.blend[1].path" in result.output and "Traceback" not in result.output
    result = bench(tmp_path / "nope.yaml", "--seconds", 0.3)
    assert result.exit_code == 1 and "does not exist" in result.output
