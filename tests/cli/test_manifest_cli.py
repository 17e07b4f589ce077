"""``energon-lite manifest show`` and ``stats`` (issue 41, item 2)."""

from __future__ import annotations

import importlib.util
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.manifest import ManifestWriter, dataset_tables, read_rank_files


def _dataset(yaml: Path, *, rank: int, shuffle: int | None = 5):
    return get_train_dataset(yaml, worker_config=WorkerConfig(rank=rank, world_size=2, num_workers=0), batch_size=3, shuffle_buffer_size=shuffle, max_samples_per_sequence=3)


def _write(yaml: Path, folder: Path, batches: int = 8, sample_keys: dict | None = None, shuffle: int | None = 5) -> dict[int, list[tuple]]:
    """Two ranks of a blend write ``folder``; returns each rank's batch restore keys (and puts
    their samples' ``__key__`` lists in ``sample_keys``)."""
    keys = {}
    for rank in (0, 1):
        loader = get_savable_loader(_dataset(yaml, rank=rank, shuffle=shuffle), manifest=folder)
        it = iter(loader)
        batches_seen = [next(it) for _ in range(batches)]
        keys[rank] = [batch.__restore_key__ for batch in batches_seen]
        if sample_keys is not None:
            sample_keys[rank] = [list(batch.__key__) for batch in batches_seen]
        loader.save_state_rank()
    return keys


@pytest.fixture
def written(prepared_blend: Path, tmp_path: Path) -> tuple[Path, dict[int, list[tuple]], dict[int, list[list[str]]]]:
    sample_keys: dict = {}
    return tmp_path / "m", _write(prepared_blend, tmp_path / "m", sample_keys=sample_keys), sample_keys


def test_show_lists_the_samples_of_a_step_on_every_rank(written, prepared_blend: Path) -> None:
    folder, keys, sample_keys = written
    result = CliRunner().invoke(cli, ["manifest", "show", str(folder), "--step", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("step")] == ["step 3 rank 0", "step 3 rank 1"]
    samples = [line for line in lines if line.startswith("  dataset")]
    assert [line.split("restore key ", 1)[1] for line in samples] == [repr(k) for r in (0, 1) for k in keys[r][3][4:]]
    # The __key__ read from the shard is the one the batch held.
    assert [line.split("__key__ ", 1)[1].split()[0] for line in samples] == [k for r in (0, 1) for k in sample_keys[r][3]]
    for line, sample in zip(samples, [k for r in (0, 1) for k in keys[r][3][4:]]):
        assert str(prepared_blend.parent / "ab"[sample[1]]) in line and "shards/" in line


def test_show_one_rank_and_a_missing_step(written) -> None:
    folder, keys, sample_keys = written
    result = CliRunner().invoke(cli, ["manifest", "show", str(folder), "--step", "0", "--rank", "1", "--no-keys"])
    assert result.exit_code == 0 and "rank 0" not in result.output and "step 0 rank 1" in result.output
    assert "__key__" not in result.output and result.output.count("restore key") == 3
    missing = CliRunner().invoke(cli, ["manifest", "show", str(folder), "--step", "99"])
    assert missing.exit_code != 0 and "no step 99" in missing.output and "steps 0..7" in missing.output


def test_stats_shares_coverage_and_no_repeats(written) -> None:
    folder, keys, sample_keys = written
    result = CliRunner().invoke(cli, ["manifest", "stats", str(folder), "--window", "4"])
    assert result.exit_code == 0, result.output
    assert "8 step(s) on 2 rank(s), 48 sample(s)" in result.output
    shares = [line.split() for line in result.output.splitlines() if line.strip().split(" ")[0] in ("0", "4")]
    assert len(shares) == 2 and all(abs(sum(float(cell) for cell in row[1:] if not cell.startswith("(")) - 1) < 1e-6 for row in shares)
    a = sum(1 for r in (0, 1) for key in keys[r] for sample in key[4:] if sample[1] == 0)
    assert f"{a} of 24 samples seen" in result.output and f"{48 - a} of 39 samples seen" in result.output
    assert "samples seen more than once within an epoch: 0" in result.output


def test_stats_counts_a_sample_seen_twice(prepared_blend: Path, tmp_path: Path) -> None:
    # Rank 1's file delivers its step 0 batch again at step 1: its 3 samples repeat within an epoch.
    # (No shuffle buffer: with one, a repeat of a dataset this rank read little of may be the
    # next epoch's start coming through the buffer, and is not counted.)
    folder = tmp_path / "m"
    keys = _write(prepared_blend, folder, shuffle=None)
    for rank_file in read_rank_files(folder):
        if rank_file.rank == 1:
            rank_file.path.unlink()
    dataset = _dataset(prepared_blend, rank=1, shuffle=None)
    writer = ManifestWriter(folder, rank=1, world_size=2, num_workers=0, config=dataset.config(), data=dataset.data_record(), datasets=dataset_tables(dataset.spec))
    for step, key in enumerate([keys[1][0], *keys[1][:-1]]):
        writer.add(step, key)
    writer.close()
    result = CliRunner().invoke(cli, ["manifest", "stats", str(folder)])
    assert "samples seen more than once within an epoch: 3" in result.output, result.output
    assert all(f"step 1: ds{sample[1]} split index {sample[3]}" in result.output for sample in keys[1][0][4:])


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_through_a_shuffle_buffer_are_not_repeats(prepared_blend: Path, tmp_path: Path, workers: int) -> None:
    # 30 steps of 2 ranks x 2 samples: about 2 epochs of each dataset, whose ends the buffer mixes.
    for rank in (0, 1):
        dataset = get_train_dataset(prepared_blend, worker_config=WorkerConfig(rank=rank, world_size=2, num_workers=workers), batch_size=2, shuffle_buffer_size=5)
        loader = get_savable_loader(dataset, manifest=tmp_path / "m")
        it = iter(loader)
        for _ in range(30):
            next(it)
        loader.save_state_rank()
    result = CliRunner().invoke(cli, ["manifest", "stats", str(tmp_path / "m")])
    assert "24 of 24 samples seen (100.0%)" in result.output and "39 of 39 samples seen (100.0%)" in result.output
    assert "samples seen more than once within an epoch: 0" in result.output, result.output


def test_plot_without_matplotlib_is_skipped_with_a_note(written, tmp_path: Path) -> None:
    folder, _, _ = written
    result = CliRunner().invoke(cli, ["manifest", "stats", str(folder), "--plot", str(tmp_path / "shares.png")])
    assert result.exit_code == 0
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in result.output and not (tmp_path / "shares.png").exists()
    else:
        assert (tmp_path / "shares.png").read_bytes()[:4] == b"\x89PNG"


def test_a_torn_file_is_reported_and_its_prefix_shown(written) -> None:
    folder, _, _ = written
    zero = read_rank_files(folder)[0].path
    zero.write_bytes(zero.read_bytes()[:-3])
    result = CliRunner().invoke(cli, ["manifest", "show", str(folder), "--step", "2"])
    assert result.exit_code == 0 and "torn or damaged" in result.output and str(zero) in result.output
    assert "step 2 rank 0" in result.output
    last = CliRunner().invoke(cli, ["manifest", "show", str(folder), "--step", "7", "--rank", "0"])
    assert last.exit_code != 0 and "no step 7 on rank 0" in last.output


def test_not_a_manifest_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["manifest", "stats", str(tmp_path)])
    assert result.exit_code != 0 and "not a manifest folder" in result.output


def _captioning_step_page(prepared_captioning: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """A manifest of a captioning run, and the page ``manifest show --html`` writes of step 2
    (with the sample keys of that step's batch)."""
    dataset = get_train_dataset(prepared_captioning, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=3)
    loader = get_savable_loader(dataset, manifest=tmp_path / "m")
    it = iter(loader)
    keys = [list(next(it).__key__) for _ in range(4)]
    loader.save_state_rank()
    page = tmp_path / "step.html"
    result = CliRunner().invoke(cli, ["manifest", "show", str(tmp_path / "m"), "--step", "2", "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "Wrote 3 samples" in result.output
    return page, keys[2]


def test_show_html_renders_the_steps_samples(prepared_captioning: Path, tmp_path: Path) -> None:
    page, keys = _captioning_step_page(prepared_captioning, tmp_path)

    class Structure(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[tuple[str, str | None]] = []
            self.keys: list[str] = []
            self._in_key = False

        def handle_starttag(self, tag, attrs):
            self.tags.append((tag, dict(attrs).get("class")))
            self._in_key = tag == "span" and dict(attrs).get("class") == "key"

        def handle_data(self, data):
            if self._in_key:
                self.keys.append(data)
                self._in_key = False

    parsed = Structure()
    parsed.feed(page.read_text())
    assert [c for t, c in parsed.tags if t == "section"] == [None]  # one rank
    assert sum(1 for t, c in parsed.tags if t == "div" and c == "sample") == 3
    assert parsed.keys == keys  # the step's samples, in batch order
    assert sum(1 for t, _ in parsed.tags if t == "img") >= 3  # each sample's image
    assert "step 2 rank 0" in page.read_text()


def test_stats_compares_each_window_with_the_schedules_target(prepared_blend: Path, tmp_path: Path) -> None:
    """a then b, switching at global sample 24: two ranks of batch 3 take 6 global samples a step,
    so windows of 2 steps cover 12 clocks: a's target is 1 in steps 0-3 and 0 from step 4."""
    yaml = tmp_path / "scheduled.yaml"
    yaml.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: {{step: {{0: 1, 24: 0}}}}, path: {prepared_blend.parent / 'a'}}}\n"
        f"      - {{weight: {{step: {{0: 0, 24: 1}}}}, path: {prepared_blend.parent / 'b'}}}\n"
    )
    _write(yaml, tmp_path / "m", batches=8)
    result = CliRunner().invoke(cli, ["manifest", "stats", str(tmp_path / "m"), "--window", "2"])
    assert result.exit_code == 0, result.output
    assert "target in brackets" in result.output
    rows = {}
    for line in result.output.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0].isdigit():
            rows[int(cells[0])] = (cells[2], cells[4])
    assert rows == {0: ("(1.000)", "(0.000)"), 2: ("(1.000)", "(0.000)"), 4: ("(0.000)", "(1.000)"), 6: ("(0.000)", "(1.000)")}


def test_stats_of_a_constant_blend_shows_its_weights_as_target(written) -> None:
    folder, _, _ = written
    result = CliRunner().invoke(cli, ["manifest", "stats", str(folder), "--window", "4"])
    assert result.exit_code == 0, result.output
    first = next(line.split() for line in result.output.splitlines() if line.split()[:1] == ["0"])
    shares = [float(cell.strip("()")) for cell in first[2::2]]
    assert len(shares) == 2 and sum(shares) == pytest.approx(1.0) and min(shares) > 0
