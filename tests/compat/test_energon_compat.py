"""Megatron Energon 7.4.1 is the oracle: what it prepares loads here, what we prepare loads there.

Every dataset below is written once as raw tars (or one JSONL file), copied twice, and prepared
once with Energon's CLI (``energon prepare``) and once with ours (``energon-lite prepare``), with
the same flags; all prepares run concurrently in one module fixture. Then:

* both loaders read both copies: Energon's ``get_val_dataset`` (iterated in this process, in split
  order, with ``num_workers=0``) and our ``SampleLoader.load(i)``; keys, split indices, sample
  types, sources and decoded values (strings, JSON, image pixels) must be equal;
* the two prepared copies are compared file by file where Energon's format fixes the bytes:
  ``.tar.idx``, ``.info.json`` shard counts (order included), ``split.yaml`` (after brace
  expansion), ``dataset.yaml`` and the ``samples``/``sample_parts`` rows of ``index.sqlite``;
* our ``info``/``lint`` run on Energon's copies and Energon's ``info``/``lint`` on ours.

No expected value is written down here: every expectation comes from Energon.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml

energon = pytest.importorskip("megatron.energon")

import torch  # noqa: E402  (after the skip: torch comes with Energon's environment)
from braceexpand import braceexpand  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from energon_lite_dev.synthetic import make_jpeg, make_png, write_tar  # noqa: E402
from PIL import Image  # noqa: E402

from megatron_energon_lite.cli.main import cli as lite_cli  # noqa: E402
from megatron_energon_lite.decode import SampleDecoder  # noqa: E402
from megatron_energon_lite.pipeline.load import SampleLoader  # noqa: E402

pytestmark = pytest.mark.energon

# Energon's console script from this environment (same interpreter when the script is missing).
_ENERGON_SCRIPT = Path(sys.executable).with_name("energon")
ENERGON_CMD = (
    [str(_ENERGON_SCRIPT)]
    if _ENERGON_SCRIPT.is_file()
    else [sys.executable, "-c", "import sys; from megatron.energon.cli.main import main; sys.exit(main())"]
)
LITE_CMD = [sys.executable, "-m", "megatron_energon_lite.cli.main"]
PREPARERS = ("energon", "lite")
COMMON_FLAGS = ["--non-interactive", "--no-progress", "--num-workers", "1"]


# --------------------------------------------------------------------------------------------
# Raw datasets (not prepared). Tiny: 8x8-ish images, 2-6 samples per shard.
# --------------------------------------------------------------------------------------------


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def build_caption(root: Path) -> None:
    """Four shards (ustar, gnu, pax, ustar) of jpg + txt + json; non-ASCII captions."""
    layout = [(3, "ustar"), (5, "gnu"), (4, "pax"), (6, "ustar")]
    for shard, (count, tar_format) in enumerate(layout):
        samples = []
        for i in range(count):
            caption = f"Grüße {shard}/{i} 🐈 caption"
            samples.append(
                (
                    f"c{shard}_{i:04d}",
                    {
                        "jpg": make_jpeg(8, 8 if i % 2 else 6, seed=(shard, i)),
                        "txt": caption.encode("utf-8"),
                        "json": _json({"caption": caption.upper(), "i": i}),
                    },
                )
            )
        write_tar(root / f"shards/cap-{shard}.tar", samples, tar_format=tar_format)


LONG_DIR = "deeply/nested/folder/" * 6  # keys with a directory prefix, > 100 chars in total


def _alt_sample(key: str, n: int) -> tuple[str, dict[str, bytes]]:
    """jpg only, png only (RGBA / L / P), or both; json with a caption and a varying ``meta``."""
    kind = n % 5
    parts: dict[str, bytes] = {}
    if kind in (0, 3):
        parts["jpg"] = make_jpeg(8, 8, seed=(7, n))
    if kind in (1, 3):
        parts["png"] = make_png(8, 6, seed=(8, n), mode="RGBA")
    if kind == 2:
        parts["png"] = make_png(6, 8, seed=(9, n), mode="L")
    if kind == 4:
        parts["png"] = make_png(8, 8, seed=(10, n), mode="P")
    metas = [{"captions": ["first", f"second {n}"]}, {"captions": ["only"]}, ["list zero", "list one"], "a plain string", {"0": "zero key"}]
    parts["json"] = _json({"caption": f"json caption {n} — ünïcode", "meta": metas[n % len(metas)]})
    parts["txt"] = f"text fallback {n}".encode()
    return key, parts


def build_alt(root: Path) -> None:
    """Pre-split folders; PAX and GNU shards with keys longer than 100 chars."""
    write_tar(root / "train/a-0.tar", [_alt_sample(f"t0_{i:03d}", i) for i in range(5)], tar_format="ustar")
    long_train = [_alt_sample(f"{LONG_DIR}t1_{i:03d}", 5 + i) for i in range(3)]
    long_train += [_alt_sample("t1_" + "x" * 120 + f"_{i}", 8 + i) for i in range(2)]  # no '/', 126 chars
    write_tar(root / "train/a-1.tar", long_train, tar_format="pax")
    long_val = [_alt_sample(f"{LONG_DIR}v0_{i:03d}", 10 + i) for i in range(2)]
    long_val += [_alt_sample("v0_" + "y" * 130 + f"_{i}", 12 + i) for i in range(3)]
    write_tar(root / "val/b-0.tar", long_val, tar_format="gnu")


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", *, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = 1_704_067_200
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def build_crude(root: Path) -> None:
    """Crude samples with many part types, plus members that are not sample parts."""
    (root / "shards").mkdir(parents=True)
    # Shard 0 (ustar): a meta folder first, a directory, a name without a dot and a symlink
    # between parts of one sample, a key with a folder prefix.
    with tarfile.open(root / "shards/crude-0.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "__meta__/about.json", b'{"about": 1}')
        _add(tar, "sub", kind=tarfile.DIRTYPE)
        _add(tar, "k0_0000.jpg", make_jpeg(8, 8, seed=100))
        _add(tar, "k0_0000.txt", "crude ä".encode())
        _add(tar, "k0_0000.json", _json({"a": [1, 2.5, None, True], "b": {"c": "d"}}))
        _add(tar, "k0_0000.cls", b" 7\n")
        _add(tar, "README", b"not a sample part")
        _add(tar, "k0_0001.png", make_png(8, 8, seed=101, mode="RGBA"))
        _add(tar, "k0_0001.lnk", kind=tarfile.SYMTYPE, link="k0_0000.jpg")
        _add(tar, "k0_0001.detail.json", _json({"nested": "part name"}))
        _add(tar, "sub/k0_0002.txt", b"key with a folder")
        _add(tar, "sub/k0_0002.bin", bytes(range(256)))
    # Shard 1 (pax, with a global header as `git archive` writes one): more decoders.
    with tarfile.open(root / "shards/crude-1.tar", "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        for i in range(3):
            _add(tar, f"k1_{i:04d}.txt.gz", gzip.compress(f"gzipped {i}".encode(), mtime=0))
            _add(tar, f"k1_{i:04d}.id", str(40 + i).encode())
            _add(tar, f"k1_{i:04d}.jsn", _json([i, {"x": i}]))
            _add(tar, f"k1_{i:04d}.npy", _npy(np.arange(6, dtype=np.float32).reshape(2, 3) * i))
    # Shard 2 (gnu): long keys, upper-case extensions, a grey JPEG.
    samples = [
        ("k2_" + "z" * 110 + "_0", {"JPEG": make_jpeg(8, 8, seed=102), "TXT": b"upper-case extension", "text": b"text part"}),
        ("k2_short_1", {"PNG": make_png(8, 8, seed=103, mode="LA"), "transcript": "transcript ü".encode(), "cls2": b"3"}),
    ]
    write_tar(root / "shards/crude-2.tar", samples, tar_format="gnu")


def build_order(root: Path) -> None:
    """Shard paths whose order differs between path-component order and plain string order."""
    for n, name in enumerate(["d/a.tar", "d/a/b.tar", "d/a-c.tar", "d/a_d.tar"]):
        write_tar(root / name, [(f"o{n}_{i}", {"txt": f"order {n} {i}".encode()}) for i in range(2)])


def build_ratio(root: Path) -> None:
    """Ten one-sample shards, for how a split ratio becomes shard counts."""
    for n in range(10):
        write_tar(root / f"r-{n:02d}.tar", [(f"r{n}", {"txt": f"ratio {n}".encode()})])


JSONL_LINES = [
    b"\n",  # a blank line before the first record
    b'{"id": 0, "q": "a"}\n',
    b'{"id": 1, "q": "bb", "nested": {"l": [1, 2.5, null, true, false]}}\n',
    b"\n",
    b"   \n",  # whitespace only
    b'  {"id": 2, "q": "leading spaces"}  \n',
    b'{"id": 3, "q": "crlf"}\r\n',
    '{"id": 4, "q": "ünïcödé 🐈", "big": 12345678901234567890, "f": 1e-7}\n'.encode(),
    b'{"id": 5, "q": "no newline at the end"}',
]


def build_jsonl(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "records.jsonl").write_bytes(b"".join(JSONL_LINES))


@dataclass(frozen=True)
class Spec:
    build: Callable[[Path], None]
    flags: tuple[str, ...]
    target: str = ""  # file inside the folder to prepare (JSONL), else the folder itself


SPECS: dict[str, Spec] = {
    "caption": Spec(
        build_caption,
        ("--split-ratio", "2,1,1", "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}'),
    ),
    "alt": Spec(
        build_alt,
        (
            "--split-parts", "train:train/.*", "--split-parts", "val:val/.*",
            "--sample-type", "CaptioningSample", "--field-map", '{"image": "jpg,png", "caption": "json[caption]"}',
        ),
    ),
    "crude": Spec(build_crude, ("--split-ratio", "2,1,0", "--sample-type", "CrudeWebdataset")),
    "order": Spec(
        build_order,
        ("--split-parts", "train:d/a[./]", "--split-parts", "val:d/a[-_]", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}'),
    ),
    "ratio": Spec(build_ratio, ("--split-ratio", "1,1,1", "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')),
    "jsonl": Spec(build_jsonl, (), target="records.jsonl"),
}
WEBDATASETS = ["caption", "alt", "crude", "order", "ratio"]


@dataclass
class Prepared:
    """One raw dataset, prepared once by each tool."""

    name: str
    raw: Path
    energon: Path
    lite: Path

    def by(self, preparer: str) -> Path:
        return self.energon if preparer == "energon" else self.lite


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Prepared]:
    base = tmp_path_factory.mktemp("compat")
    prepared: dict[str, Prepared] = {}
    jobs: list[tuple[str, list[str], subprocess.Popen]] = []
    for name, spec in SPECS.items():
        raw = base / "raw" / name
        spec.build(raw)
        copies = {}
        for preparer in PREPARERS:
            copies[preparer] = base / preparer / name
            shutil.copytree(raw, copies[preparer])
            target = copies[preparer] / spec.target if spec.target else copies[preparer]
            if spec.target:
                cmd = ["prepare", str(target)]  # JSONL: Energon takes no other flags
            else:
                cmd = ["prepare", *COMMON_FLAGS, *spec.flags, str(target)]
            cmd = [*ENERGON_CMD, *cmd] if preparer == "energon" else [*LITE_CMD, *cmd]
            process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=base)
            jobs.append((f"{preparer} {name}", cmd, process))
        prepared[name] = Prepared(name, raw, copies["energon"], copies["lite"])
    failures = []
    for label, cmd, process in jobs:
        output, _ = process.communicate(timeout=120)
        if process.returncode != 0:
            failures.append(f"{label}: exit {process.returncode}\n$ {' '.join(cmd)}\n{output.decode(errors='replace')}")
    assert not failures, "\n\n".join(failures)
    return prepared


# --------------------------------------------------------------------------------------------
# Reading with Energon and with us
# --------------------------------------------------------------------------------------------


@energon.edataclass
class CrudeHolder(energon.Sample):
    """What Energon's crude sample held when it reached the cooker (a copy of the dict)."""

    crude: dict


@energon.stateless
def _keep_crude(crude: dict) -> CrudeHolder:
    return CrudeHolder(**energon.basic_sample_keys(crude), crude=dict(crude))


class CrudeKeeper(energon.DefaultTaskEncoder):
    cookers = [energon.Cooker(_keep_crude)]


def _split_index(restore_key: tuple) -> int:
    """Energon's restore key ends with ("Webdataset", index in the split)."""
    assert restore_key[-2] == "Webdataset", restore_key
    return int(restore_key[-1])


def energon_read(path: Path, split: str, *, image_decode: str = "torchrgb", crude: bool = False, **kwargs: Any) -> tuple[list[tuple[int, Any]], int]:
    """(split index, sample) in Energon's val order (sequential, one worker), and len(dataset)."""
    task_encoder = CrudeKeeper() if crude else energon.DefaultTaskEncoder()
    task_encoder.decoder = energon.SampleDecoder(image_decode=image_decode)
    worker_config = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_val_dataset(
        str(path), split_part=split, worker_config=worker_config, batch_size=None, task_encoder=task_encoder, **kwargs
    )
    worker_config.worker_activate(0)
    try:
        samples = list(dataset)
    finally:
        worker_config.worker_deactivate()
    return [(_split_index(s.__restore_key__), s.crude if crude else s) for s in samples], len(dataset)


def lite_read(path: Path, split: str, *, image_decode: str = "torchrgb", **kwargs: Any) -> tuple[list[tuple[int, Any]], int]:
    """(split index, sample) for every sample our loader does not exclude, and len(loader)."""
    loader = SampleLoader(path, split, decoder=SampleDecoder(image_decode=image_decode), **kwargs)
    try:
        loaded = [(i, loader.load(i)) for i in range(len(loader))]
        return [(i, s) for i, s in loaded if s is not None], len(loader)
    finally:
        loader.close()


def assert_same_value(ours: Any, theirs: Any, where: str) -> None:
    """Equal values of the same kind: tensors/arrays bit-identical, PIL images pixel-identical."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: Energon gives a tensor, we give {type(ours).__name__}"
        assert (ours.dtype, tuple(ours.shape)) == (theirs.dtype, tuple(theirs.shape)), f"{where}: dtype/shape"
        diff = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0.0
        assert torch.equal(ours, theirs), f"{where}: pixels differ (max abs diff {diff})"
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), f"{where}: Energon gives an ndarray, we give {type(ours).__name__}"
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), f"{where}: dtype/shape"
        assert np.array_equal(ours, theirs), f"{where}: array values differ"
    elif isinstance(theirs, Image.Image):
        assert isinstance(ours, Image.Image), f"{where}: Energon gives a PIL image, we give {type(ours).__name__}"
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size), f"{where}: mode/size"
        assert ours.tobytes() == theirs.tobytes(), f"{where}: pixels differ"
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{where}: Energon gives a dict, we give {type(ours).__name__}"
        assert list(ours) == list(theirs), f"{where}: keys"
        for key in theirs:
            assert_same_value(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs), f"{where}: Energon gives {type(theirs).__name__}, we give {type(ours).__name__}"
        assert len(ours) == len(theirs), f"{where}: length"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same_value(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, f"{where}: ours {ours!r} != Energon's {theirs!r}"


def assert_same_sources(ours: Any, theirs: Any, where: str) -> None:
    assert ours is not None and len(ours) == len(theirs), f"{where}: __sources__ {ours!r} vs {theirs!r}"
    for a, b in zip(ours, theirs):
        assert (str(a.dataset_path), a.index, a.shard_name, tuple(a.file_names)) == (
            str(b.dataset_path), b.index, b.shard_name, tuple(b.file_names),
        ), f"{where}: __sources__"


def assert_same_typed(ours: list[tuple[int, Any]], theirs: list[tuple[int, Any]], where: str) -> None:
    """Same keys in the same order at the same split indices, same types and field values."""
    assert [(i, s.__key__) for i, s in ours] == [(i, s.__key__) for i, s in theirs], f"{where}: (index, key) sequence"
    for (index, a), (_, b) in zip(ours, theirs):
        at = f"{where} #{index} {b.__key__!r}"
        assert type(a).__name__ == type(b).__name__, f"{at}: sample type"
        names = [f.name for f in dataclasses.fields(b)]
        assert [f.name for f in dataclasses.fields(a)] == names, f"{at}: dataclass fields"
        assert _split_index(a.__restore_key__) == index, f"{at}: our __restore_key__ {a.__restore_key__!r}"
        assert a.__subflavors__ == b.__subflavors__, f"{at}: __subflavors__"
        assert_same_sources(a.__sources__, b.__sources__, at)
        for name in names:
            if name not in ("__key__", "__restore_key__", "__subflavors__", "__sources__"):
                assert_same_value(getattr(a, name), getattr(b, name), f"{at}.{name}")


def assert_same_crude(
    ours: list[tuple[int, Any]], theirs: list[tuple[int, dict]], where: str, *, parts: Callable[[str], bool] = lambda part: True, sources: bool = True
) -> None:
    """Same keys at the same split indices; the parts selected by ``parts`` decoded alike."""
    assert [(i, s["__key__"]) for i, s in ours] == [(i, s["__key__"]) for i, s in theirs], f"{where}: (index, key) sequence"
    for (index, a), (_, b) in zip(ours, theirs):
        at = f"{where} #{index} {b['__key__']!r}"
        assert isinstance(a, dict), f"{at}: a crude sample must be a dict, got {type(a).__name__}"
        parts_a = sorted(k for k in a if not k.startswith("__"))
        parts_b = sorted(k for k in b if not k.startswith("__"))
        assert parts_a == parts_b, f"{at}: parts"
        for part in filter(parts, parts_b):
            assert_same_value(a[part], b[part], f"{at}[{part!r}]")
        assert _split_index(a["__restore_key__"]) == index, f"{at}: our __restore_key__"
        if sources:
            assert_same_sources(a["__sources__"], b["__sources__"], at)


def split_names(root: Path) -> list[str]:
    """Non-empty splits, from Energon's own split.yaml reading (yaml + braceexpand)."""
    config = yaml.safe_load((root / ".nv-meta/split.yaml").read_text())
    return [name for name, shards in config["split_parts"].items() if shards]


# --------------------------------------------------------------------------------------------
# Both loaders agree on both copies
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("name", ["caption", "alt", "order"])
def test_typed_samples_agree(datasets: dict[str, Prepared], name: str, preparer: str) -> None:
    """Captioning (jpg+txt), alternatives + JSON access (jpg,png / json[caption]), TextSample."""
    root = datasets[name].by(preparer)
    for split in split_names(root):
        theirs, their_len = energon_read(root, split)
        ours, our_len = lite_read(root, split)
        assert theirs, f"Energon read nothing from {split}"
        assert our_len == their_len, f"{split}: len"
        assert_same_typed(ours, theirs, f"{name}/{preparer}/{split}")


def _lower_case(part: str) -> bool:
    return part == part.lower()


@pytest.mark.parametrize("preparer", PREPARERS)
def test_crude_samples_agree(datasets: dict[str, Prepared], preparer: str) -> None:
    """CrudeWebdataset: every part decoded alike (jpg, png RGBA/LA, txt, json, cls, gz, npy, ...).

    Upper-case extensions are left to :func:`test_crude_upper_case_extensions_agree`.
    """
    root = datasets["crude"].by(preparer)
    for split in split_names(root):
        theirs, their_len = energon_read(root, split, crude=True)
        ours, our_len = lite_read(root, split)
        assert our_len == their_len
        assert_same_crude(ours, theirs, f"crude/{preparer}/{split}", parts=_lower_case)


def test_crude_upper_case_extensions_agree(datasets: dict[str, Prepared]) -> None:
    root = datasets["crude"].energon
    theirs, _ = energon_read(root, "val", crude=True)
    ours, _ = lite_read(root, "val")
    assert any(not _lower_case(p) for _, s in theirs for p in s)  # the data has such parts
    assert_same_crude(ours, theirs, "crude/upper-case", parts=lambda part: not _lower_case(part))


def _meta_keys(sample: dict) -> dict[str, Any]:
    """The ``__`` entries a cooker sees, sources and restore key reduced to comparable values."""
    return {
        k: v for k, v in sample.items() if k.startswith("__") and k not in ("__sources__", "__restore_key__")
    } | {"keys": sorted(k for k in sample if k.startswith("__"))}


def test_crude_sample_metadata_agrees(datasets: dict[str, Prepared]) -> None:
    """A cooker sees the same ``__`` entries (``__key__``, ``__shard__``, ``__subflavors__``, ...)."""
    root = datasets["crude"].energon
    theirs, _ = energon_read(root, "train", crude=True)
    ours, _ = lite_read(root, "train")
    assert [_meta_keys(s) for _, s in ours] == [_meta_keys(s) for _, s in theirs]


@pytest.mark.parametrize("image_decode", ["torchrgb", "torchrgba8", "torchl8", "rgb8", "l", "pil", "pilrgba"])
def test_image_decode_modes_agree(datasets: dict[str, Prepared], image_decode: str) -> None:
    """jpg and png (RGBA, L, P) decoded with each image_decode give identical pixels."""
    root = datasets["alt"].energon
    theirs, _ = energon_read(root, "train", image_decode=image_decode)
    ours, _ = lite_read(root, "train", image_decode=image_decode)
    assert_same_typed(ours, theirs, f"alt/{image_decode}")


DEEP_YAML = """\
sample_type:
  __module__: megatron.energon
  __class__: CaptioningSample
field_map:
  image: png,jpg
  caption: json[meta][captions][1],json[meta][0],txt
"""


@pytest.mark.parametrize("preparer", PREPARERS)
def test_field_access_fallbacks_agree(datasets: dict[str, Prepared], preparer: str, tmp_path: Path) -> None:
    """Nested JSON access falling through KeyError, IndexError, list/str access to the next one."""
    root = tmp_path / "alt"
    shutil.copytree(datasets["alt"].by(preparer), root)
    (root / ".nv-meta/dataset_deep.yaml").write_text(DEEP_YAML)
    for split in ("train", "val"):
        theirs, _ = energon_read(root, split, dataset_config="dataset_deep.yaml")
        ours, _ = lite_read(root, split, dataset_config="dataset_deep.yaml")
        assert len({s.caption for _, s in theirs}) > 2  # the fallbacks really were exercised
        assert_same_typed(ours, theirs, f"alt-deep/{preparer}/{split}")


def _edit_split_yaml(root: Path, edit: Callable[[dict], None]) -> None:
    path = root / ".nv-meta/split.yaml"
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _caption_excludes(config: dict) -> None:
    config["split_parts"] = {
        "train": ["shards/cap-{3,0}.tar"],  # reversed order, as a brace pattern
        "val": ["shards/cap-1.tar", "shards/cap-2.tar"],
    }
    config["exclude"] = ["shards/cap-2.tar", "shards/cap-3.tar/c3_000{1..2}", "shards/cap-0.tar/c0_0000", "shards/cap-1.tar/c1_0004"]


def _alt_excludes(config: dict) -> None:
    config["exclude"] = [
        f"train/a-1.tar/{LONG_DIR}t1_001",  # a key with '/' in it
        "train/a-1.tar/t1_" + "x" * 120 + "_1",
        "val/b-0.tar/v0_" + "y" * 130 + "_{0,2}",
    ]


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("name", ["caption", "alt"])
def test_excludes_skip_the_same_samples(datasets: dict[str, Prepared], name: str, preparer: str, tmp_path: Path) -> None:
    """Shard and ``shard/key`` excludes and a hand-ordered split: same samples skipped, same indices."""
    root = tmp_path / name
    shutil.copytree(datasets[name].by(preparer), root)
    _edit_split_yaml(root, _caption_excludes if name == "caption" else _alt_excludes)
    for split in ("train", "val"):
        full, _ = energon_read(datasets[name].by(preparer), split)
        theirs, their_len = energon_read(root, split)
        ours, our_len = lite_read(root, split)
        assert our_len == their_len, f"{split}: len"
        assert_same_typed(ours, theirs, f"{name}-excluded/{preparer}/{split}")
        if name == "alt" or split == "train":
            assert len(theirs) < len(full), "the excludes removed nothing"


# --------------------------------------------------------------------------------------------
# The files both tools write
# --------------------------------------------------------------------------------------------


def _info(root: Path) -> dict:
    return json.loads((root / ".nv-meta/.info.json").read_text())


def _cases(*names: str, **marks: pytest.MarkDecorator) -> list:
    """``names`` as parameters, with ``marks[name]`` applied where given."""
    return [pytest.param(n, marks=marks[n]) if n in marks else n for n in names]


@pytest.mark.parametrize("name", WEBDATASETS)
def test_info_json_agrees(datasets: dict[str, Prepared], name: str) -> None:
    """Same top-level keys, same shards in the same order (it defines tar_file_id), same counts."""
    theirs, ours = _info(datasets[name].energon), _info(datasets[name].lite)
    assert list(ours) == list(theirs)
    assert list(ours["shard_counts"].items()) == list(theirs["shard_counts"].items())


def _raw_shards(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar"))


# One case per shard of the builders above.
SHARD_CASES = [
    ("caption", f"shards/cap-{i}.tar") for i in range(4)
] + [("alt", s) for s in ("train/a-0.tar", "train/a-1.tar", "val/b-0.tar")] + [
    ("crude", "shards/crude-0.tar"),
    ("crude", "shards/crude-1.tar"),  # starts with a PAX global header
    ("crude", "shards/crude-2.tar"),
] + [("order", s) for s in ("d/a.tar", "d/a/b.tar", "d/a-c.tar", "d/a_d.tar")] + [
    ("ratio", f"r-{n:02d}.tar") for n in range(10)
]


@pytest.mark.parametrize(("name", "shard"), SHARD_CASES)
def test_tar_idx_identical(datasets: dict[str, Prepared], name: str, shard: str) -> None:
    prepared = datasets[name]
    assert shard in _raw_shards(prepared.raw)
    theirs = (prepared.energon / shard).with_suffix(".tar.idx").read_bytes()
    ours = (prepared.lite / shard).with_suffix(".tar.idx").read_bytes()
    assert ours == theirs, f"ours {np.frombuffer(ours, '<u8').tolist()} vs Energon's {np.frombuffer(theirs, '<u8').tolist()}"


def _expanded_splits(root: Path) -> dict:
    config = yaml.safe_load((root / ".nv-meta/split.yaml").read_text())
    return {
        "split_parts": {k: [s for p in (v or []) for s in braceexpand(p)] for k, v in config["split_parts"].items()},
        "exclude": [s for p in (config.get("exclude") or []) for s in braceexpand(p)],
        "keys": list(config),
    }


@pytest.mark.parametrize("name", _cases(*WEBDATASETS))
def test_split_yaml_agrees(datasets: dict[str, Prepared], name: str) -> None:
    """Same splits in the same order, same shards per split in the same order (after braceexpand)."""
    assert _expanded_splits(datasets[name].lite) == _expanded_splits(datasets[name].energon)


@pytest.mark.parametrize("name", WEBDATASETS)
def test_dataset_yaml_agrees(datasets: dict[str, Prepared], name: str) -> None:
    load = lambda root: yaml.safe_load((root / ".nv-meta/dataset.yaml").read_text())  # noqa: E731
    assert load(datasets[name].lite) == load(datasets[name].energon)


def _sqlite(root: Path) -> dict[str, Any]:
    db = sqlite3.connect(f"file:{root / '.nv-meta/index.sqlite'}?mode=ro", uri=True)
    try:
        return {
            "samples": db.execute("SELECT * FROM samples ORDER BY tar_file_id, sample_index").fetchall(),
            "sample_parts": db.execute(
                "SELECT * FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset"
            ).fetchall(),
            "columns": {t: db.execute(f"PRAGMA table_info({t})").fetchall() for t in ("samples", "sample_parts")},
        }
    finally:
        db.close()


@pytest.mark.parametrize("name", WEBDATASETS)
@pytest.mark.parametrize("table", ["samples", "sample_parts", "columns"])
def test_index_sqlite_agrees(datasets: dict[str, Prepared], name: str, table: str) -> None:
    theirs, ours = _sqlite(datasets[name].energon), _sqlite(datasets[name].lite)
    assert theirs[table], "Energon wrote no rows"
    assert ours[table] == theirs[table]


@pytest.mark.parametrize("name", WEBDATASETS)
def test_index_uuid_agrees(datasets: dict[str, Prepared], name: str) -> None:
    theirs = (datasets[name].energon / ".nv-meta/index.uuid").read_text()
    ours = (datasets[name].lite / ".nv-meta/index.uuid").read_text()
    assert len(ours) == len(theirs) and str(uuid.UUID(ours)) == ours and ours != theirs


# --------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------


def test_jsonl_index_identical(datasets: dict[str, Prepared]) -> None:
    prepared = datasets["jsonl"]
    theirs = (prepared.energon / "records.jsonl.idx").read_bytes()
    ours = (prepared.lite / "records.jsonl.idx").read_bytes()
    assert ours == theirs, f"ours {np.frombuffer(ours, '<u8').tolist()} vs Energon's {np.frombuffer(theirs, '<u8').tolist()}"


@pytest.mark.parametrize("preparer", PREPARERS)
def test_jsonl_records_agree(datasets: dict[str, Prepared], preparer: str) -> None:
    """Energon's crude JSONL samples (through a cooker) equal ours; both equal json.loads per line."""
    path = datasets["jsonl"].by(preparer) / "records.jsonl"
    theirs, their_len = energon_read(path, "train", crude=True)
    ours, our_len = lite_read(path, "train")
    assert our_len == their_len
    assert [r["json"] for _, r in theirs] == [json.loads(line) for line in JSONL_LINES if line.strip()]
    assert_same_crude(ours, theirs, f"jsonl/{preparer}", sources=False)


def test_jsonl_sources_agree(datasets: dict[str, Prepared]) -> None:
    path = datasets["jsonl"].energon / "records.jsonl"
    theirs, _ = energon_read(path, "train", crude=True)
    ours, _ = lite_read(path, "train")
    for (_, a), (_, b) in zip(ours, theirs, strict=True):
        assert_same_sources(a["__sources__"], b["__sources__"], f"jsonl {b['__key__']}")


def test_jsonl_sample_metadata_agrees(datasets: dict[str, Prepared]) -> None:
    path = datasets["jsonl"].energon / "records.jsonl"
    theirs, _ = energon_read(path, "train", crude=True)
    ours, _ = lite_read(path, "train")
    assert [_meta_keys(s) for _, s in ours] == [_meta_keys(s) for _, s in theirs]


# --------------------------------------------------------------------------------------------
# The CLIs on each other's datasets
# --------------------------------------------------------------------------------------------


def _energon_info(root: Path) -> dict[str, tuple[int, int]]:
    from megatron.energon.tools.info import command

    result = CliRunner().invoke(command, [str(root)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    found = re.findall(r"`(\S+)`: [\d.]+%, (\d+) samples in (\d+) shards", result.output)
    assert found, result.output
    return {split: (int(samples), int(shards)) for split, samples, shards in found}


def _lite_info(root: Path) -> dict[str, tuple[int, int]]:
    result = CliRunner().invoke(lite_cli, ["info", str(root)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    found = re.findall(r"split (\S+?):\s+(\d+) shards?, (\d+) samples?", result.output)
    assert found, result.output
    return {split: (int(samples), int(shards)) for split, shards, samples in found}


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("name", ["caption", "alt", "order"])  # `energon info` fails on crude datasets
def test_info_agrees(datasets: dict[str, Prepared], name: str, preparer: str) -> None:
    """``energon-lite info`` and ``energon info`` report the same samples and shards per split."""
    root = datasets[name].by(preparer)
    theirs = _energon_info(root)
    assert {k: v for k, v in _lite_info(root).items() if v != (0, 0)} == {k: v for k, v in theirs.items() if v != (0, 0)}


@pytest.mark.parametrize("name", ["caption", "alt", "crude"])
def test_lite_lint_accepts_energon_datasets(datasets: dict[str, Prepared], name: str) -> None:
    result = CliRunner().invoke(lite_cli, ["lint", str(datasets[name].energon), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


# Runs Energon's `lint` command on several datasets in one process (one import of Energon).
_ENERGON_LINT_ALL = """
import sys, traceback
from megatron.energon.tools.lint import command
failed = 0
for path, splits in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        command.main([path, "--split-parts", splits], prog_name="energon lint", standalone_mode=False)
    except BaseException:
        traceback.print_exc()
        print(f"LINT FAILED: {path}", flush=True)
        failed += 1
sys.exit(1 if failed else 0)
"""


def test_energon_lint_accepts_our_datasets(datasets: dict[str, Prepared]) -> None:
    """Energon's own checker (index lengths, then decoding every sample) on what we prepared."""
    args = []
    for name in ("caption", "alt", "order", "ratio"):
        root = datasets[name].lite
        args += [str(root), ",".join(split_names(root))]
    result = subprocess.run([sys.executable, "-c", _ENERGON_LINT_ALL, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
