"""The stall report (``loader/stall.py``): the loop's wait for batches and the loader's time per stage.

The assertions use lower bounds that sleeps guarantee (a hook that sleeps 10 ms per sample takes at
least that long, however loaded the machine; one batch in 8 is timed and scaled up, which keeps
such a bound since every batch sleeps as long) and comparisons between stages far apart (a 10 ms
sleep against reading and decoding a small sample, which stays far below that even when a
loaded machine stretches it several times: at 3 ms, decode won once under heavy load), never a duration's upper bound.
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite import (
    ConfigError,
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
)
from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline.stage_clock import STAGES
from megatron_energon_lite.loader.stall import StallReport

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

CAPTIONING_YAML = "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stall")
    for name, size in (("large", (192, 192)), ("small", (8, 8))):
        generate_captioning_dataset(root / name, num_shards=2, samples_per_shard=20, image_size=size, seed=len(name))
        prepare_dataset(root / name, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CAPTIONING_YAML)
    (root / "blend.yaml").write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - weight: 1\n        path: ./large\n      - weight: 1\n        path: ./small\n")
    return root


#: What SlowEncoder sleeps per sample.
SLOW_HOOK_S = 0.010


class SlowEncoder(DefaultTaskEncoder):
    """Sleeps in encode_sample: the stage that must dominate the loader's time."""

    decoder = SampleDecoder(image_decode="torchrgb8")

    def encode_sample(self, sample):
        time.sleep(SLOW_HOOK_S)
        return sample


def _loader(path: Path, workers: int, **kwargs):
    dataset = get_train_dataset(path, batch_size=4, shuffle_buffer_size=4, max_samples_per_sequence=5, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), task_encoder=SlowEncoder())
    return get_savable_loader(dataset, **kwargs)


def _take(loader, batches: int, pause_s: float = 0.0) -> None:
    it = iter(loader)
    for _ in range(batches):
        next(it)
        if pause_s:
            time.sleep(pause_s)
    del it


@pytest.mark.parametrize("workers", [0, 2])
def test_the_stages_add_up_and_the_slow_hook_dominates(root: Path, workers: int) -> None:
    loader = _loader(root / "small", workers, stall_report=True)
    _take(loader, 12)
    report = loader.stall_report()
    d = report.as_dict()
    assert d["batches"] == 12 and d["workers"] == workers
    stages = d["stages"]
    assert set(stages) <= set(STAGES) and {"read", "decode", "encode_sample", "batch", "pipeline"} <= set(stages)
    # At least the samples delivered were encoded (workers may have made more ahead), less each
    # worker's first batch, which is not counted (it builds the pipeline).
    assert stages["encode_sample"]["s"] >= (12 - max(workers, 1)) * 4 * SLOW_HOOK_S
    assert stages["encode_sample"]["share"] > max(v["share"] for k, v in stages.items() if k != "encode_sample")
    assert sum(v["s"] for v in stages.values()) == pytest.approx(d["worker_s"])
    assert sum(v["share"] for v in stages.values()) == pytest.approx(1.0)
    assert 0 < d["waited_s"] <= d["wall_s"] and d["waited_share"] == pytest.approx(d["waited_s"] / d["wall_s"])
    if workers:
        assert "hand-over" in stages  # pickling in the worker
    else:  # without workers the loop waits for all of the loader's work, its sleeps included
        # (a bound the sleeps guarantee; the stage's own figure is one batch in 8 scaled up, which
        # a loaded machine can push above what the loop waited)
        assert d["waited_s"] >= 12 * 4 * SLOW_HOOK_S
    assert report.summary().startswith(f"loader waited {d['waited_share']:.0%} of ") and "encode_sample" in report.summary()
    del loader
    gc.collect()


def test_a_slow_training_loop_waits_less_than_a_fast_one(root: Path) -> None:
    """With workers, a loop that spends 40 ms per batch gives them time to keep up: it waits a
    smaller share of its time than a loop that only takes batches."""
    shares = {}
    for pause in (0.0, 0.04):
        loader = _loader(root / "small", 2, stall_report=True)
        _take(loader, 16, pause)
        shares[pause] = loader.stall_report().as_dict()["waited_share"]
        del loader
        gc.collect()
    assert shares[0.04] < shares[0.0]


def test_reads_and_decodes_are_kept_per_dataset_of_a_blend(root: Path) -> None:
    loader = _loader(root / "blend.yaml", 0, stall_report=True)
    _take(loader, 48)  # one batch in 8 is timed: 6 batches of 4 samples
    datasets = loader.stall_report().as_dict()["datasets"]
    large, small = datasets[str(root / "large")], datasets[str(root / "small")]
    assert set(large["stages"]) <= {"read", "decode", "cook"} and "decode" in large["stages"]
    # 192x192 JPEGs against 8x8 ones, about as many of each.
    assert large["stages"]["decode"]["s"] > small["stages"]["decode"]["s"]
    del loader
    gc.collect()


def test_a_summary_is_logged_every_n_seconds(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    loader = _loader(root / "small", 0, stall_report_every_s=0.05)
    with caplog.at_level(logging.INFO, logger="megatron_energon_lite.stall"):
        _take(loader, 10, 0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "megatron_energon_lite.stall"]
    assert len(lines) >= 2, lines
    assert all(line.startswith("stall report, last ") and "loader waited " in line for line in lines)
    del loader
    gc.collect()


def test_a_report_of_an_interval_is_the_difference_of_two() -> None:
    import numpy as np

    seconds = np.zeros((1, 1, len(STAGES)))
    seconds[0, 0, STAGES.index("decode")] = 3.0
    early = StallReport(wall_s=10.0, waited_s=4.0, first_batch_s=1.0, batches=10, workers=0, seconds=seconds, dataset_names=())
    later_seconds = seconds.copy()
    later_seconds[0, 0, STAGES.index("read")] = 1.0
    later = StallReport(wall_s=20.0, waited_s=5.0, first_batch_s=1.0, batches=30, workers=0, seconds=later_seconds, dataset_names=())
    d = (later - early).as_dict()
    assert d["wall_s"] == 10.0 and d["waited_s"] == 1.0 and d["batches"] == 20
    assert d["stages"] == {"read": {"s": 1.0, "share": 1.0}}


def test_a_loader_without_the_report_says_how_to_turn_it_on(root: Path) -> None:
    loader = get_loader(get_train_dataset(root / "small", batch_size=2, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)))
    with pytest.raises(ConfigError, match="stall_report=True"):
        loader.stall_report()
    with pytest.raises(ConfigError, match="stall_report_every_s must be a number of seconds > 0"):
        get_loader(loader.savable_dataset, stall_report_every_s=0)
    with pytest.raises(ConfigError, match="stall_report must be True or False"):
        get_loader(loader.savable_dataset, stall_report="yes")


def test_one_item_in_time_every_is_timed_and_the_totals_are_scaled_up() -> None:
    from megatron_energon_lite.pipeline.stage_clock import TIME_EVERY
    from megatron_energon_lite.loader.stall import StageTimes

    times = StageTimes(1, ["a"])
    clock = times.clock(0)
    timed = [clock.for_next_item() is not None for _ in range(1 + 3 * TIME_EVERY)]
    # Not the first item (it builds the pipeline), then the next one and every TIME_EVERY-th.
    assert timed == [False] + ([True] + [False] * (TIME_EVERY - 1)) * 3
    clock.run("decode", 0, lambda: None)
    times.seconds[0, 1, STAGES.index("decode")] = 0.5  # as if the 3 timed items (of 24) took 0.5 s in all
    clock._totals = times.seconds[0].tolist()
    clock.publish()
    assert times.estimate()[0, 1, STAGES.index("decode")] == pytest.approx(0.5 * TIME_EVERY)
