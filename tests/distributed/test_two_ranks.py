"""Two ranks under torchrun with the gloo backend: disjoint data, equal lengths, global state."""

import json
from pathlib import Path

import pytest
from energon_lite_dev.synthetic import generate_captioning_dataset
from torchrun_helpers import torchrun

from megatron_energon_lite.format.prepare import prepare_dataset


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("dist")
    root = tmp / "captions"
    generate_captioning_dataset(root, num_shards=5, samples_per_shard=7, image_size=(8, 8), seed=1)
    prepare_dataset(root, split_ratio=(3, 2, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text("sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\nfield_map:\n  image: jpg\n  caption: txt\n")
    other = tmp / "others"
    generate_captioning_dataset(other, num_shards=3, samples_per_shard=5, image_size=(8, 8), seed=2, key_pattern="other_{shard:02d}_{index:03d}")
    prepare_dataset(other, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (other / ".nv-meta/dataset.yaml").write_text((root / ".nv-meta/dataset.yaml").read_text())
    blend = tmp / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_mode: exact\n"
        "    blend:\n      - {weight: 3, path: ./captions}\n      - {weight: 1, path: ./others}\n"
    )
    out = tmp / "out"
    out.mkdir()
    run = torchrun(str(Path(__file__).with_name("rank_script.py")), [str(root), str(out), str(blend)], ranks=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_default_worker_config_reads_torch_distributed(results) -> None:
    assert [r["config"] for r in results] == [[0, 2], [1, 2]]


def test_ranks_read_disjoint_samples_covering_the_split(results) -> None:
    a, b = (set(r["epoch_keys"]) for r in results)
    assert not a & b and len(a | b) == 3 * 7
    assert len(results[0]["epoch_keys"]) + len(results[1]["epoch_keys"]) == 21


def test_val_lengths_and_disjointness(results) -> None:
    for r in results:
        assert len(r["val_batches"]) == r["val_len"]
    keys = [set(k for b in r["val_batches"] for k in b) for r in results]
    assert not keys[0] & keys[1] and len(keys[0] | keys[1]) == 2 * 7


def test_global_state_round_trip(results) -> None:
    assert results[0]["gathered"] == 2 and results[1]["gathered"] is None
    for r in results:
        assert r["resumed"] == r["after"]
    assert results[0]["before"] != results[1]["before"]


def test_exact_blend_holds_over_both_ranks_at_every_step(results) -> None:
    """The global stream (step by step, rank 0 then rank 1) keeps 3:1 within one sample."""
    counts = [0, 0]
    n = 0
    for step in range(20):
        for r in results:
            for key in (r["blend_before"] + r["blend_after"])[step]:
                counts[1 if key.startswith("other") else 0] += 1
                n += 1
                assert abs(counts[0] - 0.75 * n) < 1 and abs(counts[1] - 0.25 * n) < 1, (step, counts)


def test_blend_state_resumes_on_both_ranks_and_reports_the_global_mix(results) -> None:
    for r in results:
        assert r["blend_resumed"] == r["blend_after"]
    report = results[0]["blend_report"]
    assert results[1]["blend_report"] is None
    consumed = [k for r in results for batch in r["blend_before"] for k in batch]
    others = sum(k.startswith("other") for k in consumed)
    assert [row["samples"] for row in report] == [len(consumed) - others, others]
    assert [row["target_share"] for row in report] == [0.75, 0.25]
