"""Issue 41's "done when": a poison sample makes a fake training loop's loss NaN; its step and the
sample are found through the manifest (the Python API); the run resumes from an earlier
checkpoint skipping it (with a save and restore in between), and the rest of the run is the
original's minus that sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.manifest import read_manifest

POISON = "b0_002"  # at step 12 of this run, with 0 or 2 workers; a sample of dataset b of the blend (energon_lite_dev.prepared.PREPARED_BLEND_SIZES)
CHECKPOINT_EVERY = 4


def _loader(blend: Path, workers: int, manifest: Path):
    dataset = get_train_dataset(blend, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=3)
    return get_savable_loader(dataset, manifest=manifest)


def _sample_losses(batch) -> list[float]:
    """The fake model: a finite loss per sample, NaN for the poison."""
    return [math.nan if key == POISON else float(len(text)) for key, text in zip(batch.__key__, batch.text)]


def _train(loader, steps: int, *, stop_on_nan: bool, checkpoints: dict[int, dict] | None = None):
    """Runs the fake loop; returns (per-step (worker, keys), step of the first NaN or None)."""
    seen, nan_step = [], None
    it = iter(loader)
    for step in range(loader.step, loader.step + steps):
        if checkpoints is not None and step % CHECKPOINT_EVERY == 0:
            checkpoints[step] = loader.save_state_rank()  # the state before this step's batch
        batch = next(it)
        seen.append((batch.__restore_key__[1], list(batch.__key__)))
        if math.isnan(sum(_sample_losses(batch))):
            nan_step = step if nan_step is None else nan_step
            if stop_on_nan:
                break
    return seen, nan_step


def _streams(steps) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for worker, keys in steps:
        out.setdefault(worker, []).extend(keys)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_find_the_poison_through_the_manifest_and_replay_without_it(prepared_blend: Path, tmp_path: Path, workers: int) -> None:
    # The original run, uninterrupted, for reference.
    reference, _ = _train(_loader(prepared_blend, workers, tmp_path / "reference"), 40, stop_on_nan=False)

    # The training run: checkpoints every 4 steps, until the loss is NaN.
    checkpoints: dict[int, dict] = {}
    run = _loader(prepared_blend, workers, tmp_path / "m")
    _, nan_step = _train(run, 40, stop_on_nan=True, checkpoints=checkpoints)
    assert nan_step is not None, "the poison must come within the run"
    run.save_state_rank()  # writes the manifest's last records (also done at exit)

    # Which samples made the failing step, and which of them is the poison.
    (step,) = [s for s in read_manifest(tmp_path / "m") if s.step == nan_step]
    batch = run.restore_sample(step.batches[0][0])
    losses = _sample_losses(batch)
    (bad,) = [sample for sample, loss in zip(step.samples(rank=0), losses) if math.isnan(loss)]
    assert batch.__key__[[math.isnan(x) for x in losses].index(True)] == POISON
    assert bad.dataset_path.endswith("/b") and bad.shard == "shards/000.tar" and bad.index_in_shard == 2

    # Resume from a checkpoint at least a step before it, skipping the poison; save and restore
    # once more on the way (the state keeps the skip list).
    resume_at = max(s for s in checkpoints if s < nan_step)
    assert resume_at > 0
    replay = _loader(prepared_blend, workers, tmp_path / "m")
    replay.restore_state_rank(checkpoints[resume_at], skip_samples=[bad])
    first_half, nan_first = _train(replay, 6, stop_on_nan=False)
    state = replay.save_state_rank()
    again = _loader(prepared_blend, workers, tmp_path / "m")
    again.restore_state_rank(state)
    second_half, nan_second = _train(again, 40 - resume_at - 6 - 2, stop_on_nan=False)
    assert nan_first is None and nan_second is None
    again.save_state_rank()  # writes the manifest's last records
    assert replay.replay_skipped_samples + again.replay_skipped_samples >= 1

    # The rest of the run: the original's minus the poison, worker by worker.
    before = _streams(reference[:resume_at])
    original, replayed = _streams(reference), _streams(first_half + second_half)
    for worker, keys in replayed.items():
        expected = [k for k in original[worker][len(before.get(worker, [])) :] if k != POISON]
        assert keys == expected[: len(keys)]
        assert len(keys) >= len(expected) - 3 * (POISON in original[worker]) - 3
    # The manifest (the replay continued it) lists no poison after the checkpoint.
    later = [s for s in read_manifest(tmp_path / "m") if s.step >= resume_at]
    assert [s.step for s in later] == list(range(resume_at, resume_at + len(first_half) + len(second_half)))
    assert all(s.split_index != bad.split_index or s.dataset != bad.dataset for step in later for s in step.samples())
