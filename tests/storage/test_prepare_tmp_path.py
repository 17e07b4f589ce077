"""energon-lite prepare --tmp-path: where a remote dataset's index.sqlite is built (Energon's flag)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from click.testing import CliRunner
from energon_lite_dev.synthetic import generate_captioning_dataset

from megatron_energon_lite.cli.main import cli
from megatron_energon_lite.storage import configure_storage

P = ("--non-interactive", "--no-progress", "--num-workers", "1", "--split-ratio", "1,0,0", "--skip-dataset-yaml")


def test_tmp_path_holds_the_remote_index_build(s3_server, s3_url, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ENERGON_LITE_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "local"
    generate_captioning_dataset(local, num_shards=2, samples_per_shard=3, image_size=(8, 8), seed=1)
    s3_server.upload_dir(local, s3_url)
    configure_storage("s3", storage_options=s3_server.storage_options())
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def spy(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    try:
        build = tmp_path / "build" / "here"  # created when missing
        result = CliRunner().invoke(cli, ["prepare", s3_url, *P, "--tmp-path", str(build)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert made and all(Path(m).parent == build for m in made)
        assert build.is_dir() and not any(build.iterdir())  # the build folder inside it is removed
        assert s3_server.filesystem().exists(f"{s3_url}/.nv-meta/index.sqlite")
        assert tempfile.tempdir != str(build)  # the process-wide temp folder is restored
    finally:
        configure_storage("s3", storage_options={})


def test_tmp_path_is_ignored_for_a_local_dataset(tmp_path: Path) -> None:
    generate_captioning_dataset(tmp_path / "ds", num_shards=1, samples_per_shard=2, image_size=(8, 8), seed=1)
    result = CliRunner().invoke(cli, ["prepare", str(tmp_path / "ds"), *P, "--tmp-path", str(tmp_path / "unused")], catch_exceptions=False)
    assert result.exit_code == 0 and not (tmp_path / "unused").exists()
