"""What Energon's own test_crudedataset.py needs beyond plain aux reads: ``dss://`` dataset paths
(primary and aux) resolved in ``NVDATASET_CACHE_DIR``, and the Energon test-suite runner keeping
dataset YAML text as Energon writes it and running the tests through the as_energon switch."""

from __future__ import annotations

import importlib.util
import io
import itertools
import re
import sys
import tarfile
from pathlib import Path

import pytest

import megatron_energon_lite.energon.epathlib.epath as epath_mod
from megatron_energon_lite import (
    Cooker,
    DefaultTaskEncoder,
    TextSample,
    WorkerConfig,
    basic_sample_keys,
    get_loader,
    get_train_dataset,
    stateless,
)
from megatron_energon_lite.energon.epathlib import EPath
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.storage import as_path

CRUDE = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
N = 8
REPO = Path(__file__).resolve().parents[2]


def write_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, parts in samples:
            for ext, data in parts.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def crude_dataset(root: Path, offset: int) -> Path:
    for shard in range(2):
        indices = range(shard * N // 2 + offset, (shard + 1) * N // 2 + offset)
        write_shard(root / f"parts/data-{shard}.tar", [(f"{i:06d}", {"txt": str(i).encode()}) for i in indices])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1, dataset_yaml=CRUDE)
    return root


@stateless
def cook_with_other(sample: dict, other) -> TextSample:
    index = int(sample["txt"])
    return TextSample(**basic_sample_keys(sample), text=f"<{index}|{other.get(f'{index + 100:06d}.txt', sample)}>")


class OtherEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_with_other)]


@pytest.fixture()
def dss_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dataset cache as Energon's DSS lays it out: NAME/VERSION folders (one a symlink)."""
    cache = tmp_path / "dss_cache"
    crude_dataset(cache / "primary" / "v1", 0)
    crude_dataset(tmp_path / "elsewhere", 100)
    (cache / "other").mkdir(parents=True)
    (cache / "other" / "v2").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    # The module global is what Energon's test sets (read at call time; the environment
    # variable only seeds it at import).
    monkeypatch.setattr(epath_mod, "NVDATASET_CACHE_DIR", EPath(cache))
    return cache


def test_as_path_resolves_dss_urls_in_the_dataset_cache(dss_cache: Path) -> None:
    assert as_path("dss://primary@v1") == dss_cache / "primary" / "v1"
    assert as_path("dss://other@v2/parts/data-0.tar") == dss_cache / "other" / "v2" / "parts" / "data-0.tar"
    assert as_path("dss://other@v2/parts/data-0.tar").is_file()
    assert as_path(EPath("dss://primary@v1/.nv-meta")) == dss_cache / "primary" / "v1" / ".nv-meta"


def test_dss_url_without_version_is_a_config_error(dss_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"dss://NAME@VERSION/path"):
        as_path("dss://primary")


def test_dss_url_without_cache_dir_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(epath_mod, "NVDATASET_CACHE_DIR", None)
    with pytest.raises(ConfigError, match="NVDATASET_CACHE_DIR"):
        as_path("dss://primary@v1")
    (tmp_path / "mds.yaml").write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: dss://primary@v1\n")
    with pytest.raises(ConfigError, match="NVDATASET_CACHE_DIR"):
        get_train_dataset(tmp_path / "mds.yaml", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None)


@pytest.mark.parametrize("workers", [0, 2])
def test_metadataset_reads_dss_datasets_as_primary_and_aux(dss_cache: Path, tmp_path: Path, workers: int) -> None:
    mds = tmp_path / "mds.yaml"
    mds.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        "    path: dss://primary@v1\n    aux:\n      other: dss://other@v2\n"
    )
    dataset = get_train_dataset(
        mds,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=OtherEncoder(),
    )
    texts = [batch.text[0] for batch in itertools.islice(get_loader(dataset), N)]
    pairs = [tuple(map(int, re.fullmatch(r"<(\d+)\|(\d+)>", text).groups())) for text in texts]
    assert sorted(index for index, _ in pairs) == list(range(N))
    assert all(other == index + 100 for index, other in pairs)


# --- scripts/energon_suite.py -----------------------------------------------------------------


def _suite_module():
    spec = importlib.util.spec_from_file_location("energon_suite_under_test", REPO / "scripts" / "energon_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rename_shim_keeps_dataset_yaml_text(tmp_path: Path) -> None:
    suite = _suite_module()
    original = tmp_path / "original"
    (original / "tests").mkdir(parents=True)
    source = (
        "import megatron.energon\n"
        "from megatron.energon.epathlib import EPath\n"
        'YAML = "\\n".join(["__module__: megatron.energon", "__class__: CrudeWebdataset"])\n'
        'NAME = "megatron.energon.task_encoder.base.DefaultTaskEncoder.batch"\n'
    )
    (original / "tests" / "test_x.py").write_text(source)
    count = suite.make_renamed_copy(original, tmp_path / "renamed")
    renamed = (tmp_path / "renamed" / "tests" / "test_x.py").read_text()
    assert count == 3
    assert "import megatron_energon_lite\n" in renamed and "from megatron_energon_lite.energon.epathlib import EPath" in renamed
    assert '"__module__: megatron.energon"' in renamed  # Energon's file format, which we read as it is
    assert '"megatron_energon_lite.energon.task_encoder.base.DefaultTaskEncoder.batch"' in renamed


def test_suite_runs_original_tests_through_the_switch(tmp_path: Path) -> None:
    suite = _suite_module()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_probe.py").write_text(
        "import megatron.energon\n"
        "import megatron_energon_lite\n"
        "from megatron_energon_lite import energon_mode\n\n"
        "def test_energon_is_us():\n"
        "    assert megatron.energon is megatron_energon_lite\n"
        "    assert energon_mode.enabled()\n"
    )
    result = suite.run_file(sys.executable, tmp_path, "tests/test_probe.py", 120, 300, tmp_path / "log.txt", (suite.SWITCH_PLUGIN,))
    assert result["passed"] == ["tests/test_probe.py::test_energon_is_us"], (tmp_path / "log.txt").read_text()[-3000:]


def test_suite_stub_lets_a_torchvision_test_file_collect(tmp_path: Path) -> None:
    """With the stub on PYTHONPATH a file importing torchvision.transforms at the top collects; the
    test that uses torchvision is skipped, the others run."""
    suite = _suite_module()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tv.py").write_text(
        "import torchvision.transforms as transforms\n\n"
        "def test_uses_torchvision():\n"
        "    transforms.Resize((2, 2))\n\n"
        "def test_does_not():\n"
        "    assert not hasattr(transforms, '__wrapped__')\n"
    )
    stub = suite.write_torchvision_stub(tmp_path / "stubs")
    result = suite.run_file(sys.executable, tmp_path, "tests/test_tv.py", 120, 300, tmp_path / "log.txt", (), (stub,))
    log = (tmp_path / "log.txt").read_text()
    assert result["passed"] == ["tests/test_tv.py::test_does_not"] and result["skipped"] == 1, log[-3000:]
    assert "torchvision.transforms.Resize was used" in log
