"""Decompression bombs: images whose header claims too many pixels, and ``.gz``, ``.npy``, ``.npz``
and ``.pth`` parts that would decode past a byte limit, are refused with ``DecompressionBombError``
before they take memory.

Every bomb is generated here, never stored. The ones that would take gigabytes on an unbounded
decoder run in a child process whose address space is capped (``RLIMIT_AS``: what the child has
mapped after its imports plus 1.5 GiB), so a missing bound ends as a ``MemoryError`` or a decoded
result in the child, which fails the test, instead of taking the machine down. The image bombs
get a tighter cap (768 MiB): an unbounded JPEG decoder allocates its 1.2 GB output buffer first.
"""

from __future__ import annotations

import gzip
import zipfile
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from energon_lite_dev.synthetic import write_tar
from PIL import Image

from megatron_energon_lite import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_train_dataset,
)
from megatron_energon_lite.decode import SampleDecoder, basic, decode_image_bytes, image
from megatron_energon_lite.errors import (
    ConfigError,
    DecodeError,
    DecompressionBombError,
)
from megatron_energon_lite.format.prepare import prepare_dataset
from megatron_energon_lite.pipeline import guard

REPO = Path(__file__).resolve().parents[2]
PILLOW_DEFAULT = 89_478_485  # PIL.Image.MAX_IMAGE_PIXELS as Pillow ships it

# --- generated bombs -------------------------------------------------------------------------


def _encode(array: np.ndarray, fmt: str, **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **save)
    return buf.getvalue()


def _photo(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([(x * 7) % 256, (y * 5) % 256, ((x + y) * 3) % 256], axis=-1).astype(np.uint8)


def _jpeg_claiming(width: int, height: int) -> bytes:
    """A small valid baseline JPEG whose SOF0 segment is patched to claim ``width`` x ``height``."""
    data = bytearray(_encode(_photo(16, 16), "JPEG", quality=50))
    pos = 2  # after SOI: walk the marker segments up to SOF0
    while data[pos + 1] != 0xC0:
        assert data[pos] == 0xFF, "not at a marker"
        pos += 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
    data[pos + 5 : pos + 9] = struct.pack(">HH", height, width)  # FFC0, length, precision, height, width
    return bytes(data)


def _png_claiming(width: int, height: int) -> bytes:
    """A small grayscale PNG whose IHDR is patched (with a correct CRC) to claim ``width`` x ``height``."""
    data = bytearray(_encode(np.zeros((4, 4), np.uint8), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _gzip_of_zeros(total: int, member: int = 64 << 20) -> bytes:
    """``total`` zero bytes as gzip members of ``member`` bytes each (about 1000:1): cheap to build."""
    one = gzip.compress(bytes(member), compresslevel=9)
    return one * (total // member)


# --- the memory-capped child -----------------------------------------------------------------

_CHILD = r"""
import importlib, json, resource, sys
import numpy, PIL.Image, PIL.JpegImagePlugin, PIL.PngImagePlugin  # mapped before the cap
for module in sys.argv[5:]:  # what the decoder needs, e.g. torch
    importlib.import_module(module)
try:
    import simplejpeg
except ImportError:
    pass
from megatron_energon_lite import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset
from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.errors import DecompressionBombError

path, part, kwargs, headroom = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
with open(path, "rb") as f:
    data = f.read()
decoder = SampleDecoder(**kwargs)
with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    decoder.decode_part(part, data, key="bomb/0", dataset="/data/hostile")
except DecompressionBombError as exc:
    print(exc)
    sys.exit(0)
except MemoryError:
    print("MemoryError: the decoder has no bound")
    sys.exit(3)
print("decoded: the decoder has no bound")
sys.exit(4)
"""

HEADROOM = 3 << 29  # 1.5 GiB of address space above what the child has mapped after its imports
IMAGE_HEADROOM = 3 << 28  # 768 MiB: less than the 1.2 GB a 20000x20000 RGB buffer takes


def _decode_in_capped_child(tmp_path: Path, part: str, data: bytes, headroom: int = HEADROOM, preload: tuple[str, ...] = (), **kwargs: object) -> str:
    """Decodes ``data`` as ``part`` in a child under RLIMIT_AS; returns the refusal's message."""
    path = tmp_path / "bomb.bin"
    path.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), part, json.dumps(kwargs), str(headroom), *preload],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, f"child exited {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    return result.stdout


# --- images ----------------------------------------------------------------------------------


@pytest.mark.parametrize("image_decode", ["rgb8", "l8", "pil"])  # simplejpeg fast path, Pillow, Pillow
def test_jpeg_claiming_20000x20000_is_refused_under_a_memory_cap(tmp_path: Path, image_decode: str) -> None:
    if image_decode == "rgb8":
        pytest.importorskip("simplejpeg")
    bomb = _jpeg_claiming(20000, 20000)
    assert len(bomb) < 1000
    message = _decode_in_capped_child(tmp_path, "jpg", bomb, IMAGE_HEADROOM, image_decode=image_decode)
    assert "'bomb/0'" in message and "'jpg'" in message and "/data/hostile" in message
    assert "400,000,000 pixels" in message or "400000000 pixels" in message
    assert "MAX_IMAGE_PIXELS" in message
    if image_decode == "rgb8":  # refused by the fast path's own header check, not left to Pillow
        assert "JPEG image of 20000x20000 = 400,000,000 pixels" in message


def test_fast_path_refusal_names_size_limit_and_how_to_raise_it() -> None:
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(image_decode="rgb8").decode_part("jpg", _jpeg_claiming(20000, 20000), key="s/1", dataset="/ds/a")
    message = str(info.value)
    assert "sample 's/1', part 'jpg' of dataset /ds/a" in message
    assert "20000x20000 = 400,000,000 pixels" in message and f"{PILLOW_DEFAULT:,} pixels" in message
    assert "SampleDecoder(max_image_pixels=" in message
    assert isinstance(info.value, DecodeError)


def test_png_claiming_huge_size_is_refused() -> None:
    with pytest.raises(DecompressionBombError, match="SampleDecoder"):
        SampleDecoder(image_decode="rgb8").decode_part("png", _png_claiming(30000, 30000), key="s/2")


def _jpeg(height: int = 48, width: int = 64) -> bytes:
    return _encode(_photo(height, width), "JPEG", quality=90)


@pytest.mark.parametrize(
    ("part", "data", "kwargs"),
    [
        ("jpg", _jpeg(), {"image_decode": "rgb8"}),  # simplejpeg
        ("jpg", _jpeg(), {"image_decode": "torchrgb"}),  # simplejpeg
        ("jpg", _jpeg(), {"image_decode": "l8"}),  # Pillow
        ("jpg", _jpeg(), {"image_decode": "pil"}),  # Pillow
        ("jpg", _jpeg(), {"image_decode": "rgb8", "image_max_size": 8}),  # simplejpeg at 1/8: the declared size counts
        ("jpg", _jpeg(), {"image_decode": "torchrgb8", "image_min_side": 6}),  # simplejpeg at 1/8
        ("jpg", _jpeg(), {"image_decode": "l8", "image_min_side": 6}),  # Pillow with draft at 1/8
        ("jpg", _jpeg(), {"image_decode": "pil", "image_min_side": 12}),  # Pillow with draft at 1/4
        ("png", _encode(_photo(48, 64), "PNG"), {"image_decode": "rgb8"}),  # Pillow
        ("webp", _encode(_photo(48, 64), "WEBP", lossless=True), {"image_decode": "rgba8"}),  # Pillow
    ],
)
def test_lowered_limit_is_honoured_on_every_path(part: str, data: bytes, kwargs: dict) -> None:
    pixels = 48 * 64
    assert SampleDecoder(max_image_pixels=pixels, **kwargs).decode_part(part, data) is not None  # at the limit: decoded
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(max_image_pixels=pixels - 1, **kwargs).decode_part(part, data, key="k")
    assert f"64x48 = {pixels:,} pixels" in str(info.value) and f"limit of {pixels - 1:,} pixels" in str(info.value)
    assert "max_image_pixels" in str(info.value)


def test_fast_path_checks_the_header_without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("simplejpeg")
    def no_pillow(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow must not be used for this JPEG")

    monkeypatch.setattr(Image, "open", no_pillow)
    assert SampleDecoder(image_decode="rgb8", max_image_pixels=48 * 64).decode_part("jpg", _jpeg()).shape == (48, 64, 3)
    with pytest.raises(DecompressionBombError):
        SampleDecoder(image_decode="rgb8", max_image_pixels=100).decode_part("jpg", _jpeg())


def test_default_follows_pillow_and_refuses_above_the_limit_not_twice_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 40x40 = 1600 pixels: above Pillow's limit of 1000 but below twice it, where Pillow only warns.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = _jpeg(40, 40)
    with pytest.raises(DecompressionBombError, match="limit of 1,000 pixels"):
        SampleDecoder(image_decode="rgb8").decode_part("jpg", data)  # fast path
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(DecompressionBombError, match="limit of 1,000 pixels"):
        SampleDecoder(image_decode="pil").decode_part("jpg", data)  # Pillow warns, we refuse
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the usual way to switch Pillow's check off
    assert SampleDecoder(image_decode="rgb8").decode_part("jpg", data).shape == (40, 40, 3)
    assert SampleDecoder(image_decode="pil").decode_part("jpg", data).size == (40, 40)


def test_explicit_limit_above_pillows_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = _jpeg(60, 60)  # 3600 pixels: over twice Pillow's limit
    assert SampleDecoder(image_decode="rgb8", max_image_pixels=10_000).decode_part("jpg", data).shape == (60, 60, 3)
    assert SampleDecoder(image_decode="rgb8", max_image_pixels=None).decode_part("jpg", data).shape == (60, 60, 3)
    # Pillow still applies its own check to what it decodes; the message says which setting to raise.
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(image_decode="pil", max_image_pixels=10_000).decode_part("jpg", data, key="k")
    assert "PIL.Image.MAX_IMAGE_PIXELS" in str(info.value) and "'k'" in str(info.value)


def test_decode_image_bytes_takes_the_limit_too() -> None:
    with pytest.raises(DecompressionBombError):
        decode_image_bytes(_jpeg(), "rgb8", max_pixels=10)
    with pytest.raises(DecompressionBombError):
        decode_image_bytes(_jpeg(), "pil", max_pixels=10)
    assert decode_image_bytes(_jpeg(), "rgb8", max_pixels=None).shape == (48, 64, 3)
    with pytest.raises(DecompressionBombError, match="3x2 = 6 pixels"):
        image.check_image_pixels(3, 2, 5)


# --- gzip ------------------------------------------------------------------------------------


def test_gzip_bomb_of_2_gib_is_refused_under_a_memory_cap(tmp_path: Path) -> None:
    bomb = _gzip_of_zeros(2 << 30)
    assert len(bomb) < 4 << 20
    message = _decode_in_capped_child(tmp_path, "txt.gz", bomb)  # the default limit: 1 GiB
    assert "'bomb/0'" in message and "'txt.gz'" in message and "/data/hostile" in message
    assert f"{1 << 30:,} bytes" in message and "SampleDecoder(max_decompressed_bytes=" in message


@pytest.mark.parametrize("name", ["txt.gz", "gz", "json.gz"])
def test_gzip_limit_is_exact_and_configurable(name: str) -> None:
    raw = b'"' + b"a" * 10_000 + b'"'
    data = gzip.compress(raw)
    assert SampleDecoder(max_decompressed_bytes=len(raw)).decode_part(name, data) is not None
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(max_decompressed_bytes=len(raw) - 1).decode_part(name, data, key="k7", dataset="/ds")
    message = str(info.value)
    assert f"sample 'k7', part {name!r} of dataset /ds" in message and f"{len(raw) - 1:,} bytes" in message
    assert SampleDecoder(max_decompressed_bytes=None).decode_part(name, data) is not None


def test_gunzip_matches_gzip_decompress_on_valid_streams() -> None:
    members = gzip.compress(b"first ") + b"\x00\x00" + gzip.compress(b"second", mtime=0) + gzip.compress(b"")
    for data in (b"", gzip.compress(b""), gzip.compress(os.urandom(100_000)), members, gzip.compress(bytes(50 << 20))):
        assert basic.gunzip(data) == gzip.decompress(data)
    # Larger than one input piece (1 MiB), members ending inside and at the edge of a piece.
    big = gzip.compress(os.urandom(3 << 20), compresslevel=1)
    edge = gzip.compress(os.urandom(100), mtime=0)
    for data in (big, big + edge + big, gzip.compress(os.urandom((1 << 20) - 200), compresslevel=0) + edge):
        assert basic.gunzip(data) == gzip.decompress(data)
        with pytest.raises((EOFError, zlib.error)):
            basic.gunzip(data[: len(data) - 5])
    assert basic.gunzip(members, max_bytes=len(b"first second")) == b"first second"
    with pytest.raises(DecompressionBombError):  # the limit counts every member
        basic.gunzip(members, max_bytes=len(b"first second") - 1)


@pytest.mark.parametrize("data", [gzip.compress(b"x" * 1000)[:-10], gzip.compress(b"abc")[:12], b"not gzip", gzip.compress(b"a") + b"junk"])
def test_broken_gzip_is_still_a_plain_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError, match="gzip") as info:
        SampleDecoder().decode_part("txt.gz", data, key="z")
    assert not isinstance(info.value, DecompressionBombError)


# --- settings and policy ---------------------------------------------------------------------


def test_config_keeps_default_keys_and_adds_set_limits() -> None:
    default = SampleDecoder().config()
    assert "max_image_pixels" not in default and "max_decompressed_bytes" not in default
    assert SampleDecoder(max_image_pixels="pillow", max_decompressed_bytes=1 << 30).config() == default
    config = SampleDecoder(max_image_pixels=None, max_decompressed_bytes=5).config()
    assert config == {**default, "max_image_pixels": None, "max_decompressed_bytes": 5}
    assert json.loads(json.dumps(config)) == config


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_image_pixels": 0},
        {"max_image_pixels": -5},
        {"max_image_pixels": 1.5},
        {"max_image_pixels": True},
        {"max_image_pixels": "auto"},
        {"max_decompressed_bytes": 0},
        {"max_decompressed_bytes": "1G"},
        {"max_decompressed_bytes": False},
    ],
)
def test_bad_limits_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        SampleDecoder(**kwargs)


def test_a_bomb_is_a_bad_sample_the_guard_skips() -> None:
    calls: list[BaseException] = []
    sample_guard = guard.SampleGuard(lambda exc, sample, sources: calls.append(exc), tolerance=0)
    decoder = SampleDecoder(max_decompressed_bytes=10)
    item = {"__key__": "k", "txt.gz": gzip.compress(b"x" * 100)}
    assert sample_guard.call(item, decoder, item) is guard.DROPPED
    assert isinstance(calls[0], DecompressionBombError)
    assert not isinstance(calls[0], guard.SYSTEM_EXCEPTIONS)


def test_a_bomb_in_a_dataset_skips_its_sample_and_the_loader_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "gz"
    write_tar(root / "a.tar", [(f"s{i:03d}", {"txt.gz": gzip.compress(b"x" * (5000 if i == 3 else 10))}) for i in range(8)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt.gz"}}))

    class Encoder(DefaultTaskEncoder):
        decoder = SampleDecoder(max_decompressed_bytes=1000)

    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(root, worker_config=worker_config, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False, task_encoder=Encoder())
    keys = [sample.__key__ for sample in get_loader(ds)]
    assert keys == [f"s{i:03d}" for i in range(8) if i != 3]
    assert any("DecompressionBombError" in record.getMessage() and "s003" in record.getMessage() for record in caplog.records)


# --- containers: .npy, .npz, .pth ------------------------------------------------------------


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"shape": shape, "fortran_order": False, "descr": descr})
    return buf.getvalue()


def _deflated_zeros(prefix: bytes, size: int) -> bytes:
    """Raw deflate data of ``prefix`` and ``size`` zero bytes (about 1000:1), built from one
    compressed 16 MiB block repeated: after a full flush the same input compresses the same."""
    block = 16 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    whole = compressor.compress(bytes(block)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return head + whole * (size // block) + compressor.compress(bytes(size % block)) + compressor.flush()


def _zip(members: list[tuple[str, bytes, int, int]], crcs: dict[str, int] | None = None) -> bytes:
    """A zip archive of ``(name, payload, method, declared size)`` members, written by hand so that
    a payload can be precompressed and a declared size can lie. A deflated member's CRC is 0
    unless ``crcs`` gives it: a bound must refuse such a member before its end, where zipfile
    checks the CRC."""
    out, central = bytearray(), bytearray()
    for name, payload, method, declared in members:
        raw = name.encode()
        crc = zlib.crc32(payload) if method == 0 else (crcs or {}).get(name, 0)
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, len(payload), declared, len(raw), 0, 0, 0, 0, 0, len(out)) + raw
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(payload), declared, len(raw), 0) + raw + payload
    count = len(members)
    return bytes(out + central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), len(out), 0))


NPZ_BOMB = 1_140_000_000  # bytes of zeros in one member: past the default limit of 1 GiB, as in the issue


def test_npy_header_declaring_8_tib_is_refused_before_allocating_under_a_memory_cap(tmp_path: Path) -> None:
    bomb = _npy_header((1 << 40,))
    message = _decode_in_capped_child(tmp_path, "npy", bomb)
    assert "'bomb/0'" in message and "'npy'" in message and "/data/hostile" in message
    assert f"limit of {1 << 30:,} bytes" in message and f"shape ({1 << 40},) of float64 = {8 << 40:,} bytes" in message
    assert "SampleDecoder(max_decompressed_bytes=" in message


def test_npz_member_of_1_gib_of_zeros_is_refused_under_a_memory_cap(tmp_path: Path) -> None:
    count = NPZ_BOMB // 8
    payload = _deflated_zeros(_npy_header((count,)), count * 8)
    bomb = _zip([("x.npy", payload, zipfile.ZIP_DEFLATED, len(_npy_header((count,))) + count * 8)])
    assert len(bomb) < 1_200_000
    message = _decode_in_capped_child(tmp_path, "npz", bomb)
    assert "'bomb/0'" in message and "'npz'" in message and f"limit of {1 << 30:,} bytes" in message
    assert "the npz archive (the declared sizes of its 1 member): 1,140,000,128 bytes" in message


@pytest.mark.parametrize("kind", ["array", "bytes"])
def test_npz_members_are_bounded_by_a_lowered_limit(kind: str) -> None:
    """The issue's second case: 32 MiB allowed, a 260 KB part holding 256 MiB."""
    size = 256 << 20
    prefix = _npy_header((size // 8,)) if kind == "array" else b""
    bomb = _zip([("a.npy" if kind == "array" else "a.bin", _deflated_zeros(prefix, size), zipfile.ZIP_DEFLATED, len(prefix) + size)])
    assert len(bomb) < 300_000
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(max_decompressed_bytes=32 << 20).decode_part("npz", bomb, key="k", dataset="/ds", shard="s.tar")
    message = str(info.value)
    assert "sample 'k', part 'npz' of dataset /ds, shard s.tar" in message and f"limit of {32 << 20:,} bytes" in message
    assert f"{len(prefix) + size:,} bytes" in message


def test_npz_member_that_understates_its_size_is_refused_by_its_array_header() -> None:
    """The zip says 1 KB (with the CRC of those 1 KB); the array header inside says 256 MiB:
    refused before allocating."""
    size = 256 << 20
    header = _npy_header((size // 8,))
    first_kb = (header + bytes(1024))[:1024]
    bomb = _zip([("a.npy", _deflated_zeros(header, size), zipfile.ZIP_DEFLATED, 1024)], crcs={"a.npy": zlib.crc32(first_kb)})
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(max_decompressed_bytes=32 << 20).decode_part("npz", bomb, key="k")
    assert f"member 'a.npy' of the npz archive declares shape ({size // 8},) of float64 = {size:,} bytes" in str(info.value)
    # Within the limit, the same lie is a truncated member, found before allocating too.
    with pytest.raises(DecodeError, match="only .* bytes follow the header"):
        SampleDecoder().decode_part("npz", bomb, key="k")


def test_npz_with_other_compression_methods_is_refused() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("a.bin", b"x" * 100)
    with pytest.raises(DecodeError, match="compression method 12; only stored and deflated"):
        SampleDecoder().decode_part("npz", buf.getvalue(), key="k")


def test_npy_and_npz_limits_are_exact() -> None:
    array = np.arange(1000, dtype=np.int64)
    npy = io.BytesIO()
    np.save(npy, array)
    assert np.array_equal(SampleDecoder(max_decompressed_bytes=8000).decode_part("npy", npy.getvalue()), array)
    with pytest.raises(DecompressionBombError, match="8,000 bytes"):
        SampleDecoder(max_decompressed_bytes=7999).decode_part("npy", npy.getvalue())
    npz = io.BytesIO()
    np.savez_compressed(npz, a=array, b=array)
    members = sum(info.file_size for info in zipfile.ZipFile(io.BytesIO(npz.getvalue())).infolist())
    decoded = SampleDecoder(max_decompressed_bytes=members).decode_part("npz", npz.getvalue())
    assert decoded.keys() == {"a", "b"} and np.array_equal(decoded["b"], array)
    with pytest.raises(DecompressionBombError):
        SampleDecoder(max_decompressed_bytes=members - 1).decode_part("npz", npz.getvalue())


def _pth_claiming(numel: int, storage: bytes, method: int) -> bytes:
    """What ``torch.save`` writes for a uint8 tensor of ``numel`` elements, its storage record
    replaced by ``storage`` (deflated or stored): built from a small tensor whose element count
    in the pickle is patched, so that nothing big is ever allocated here."""
    marker = 0xABCDE  # a tensor of this many elements pickles its count as this 4-byte int
    buf = io.BytesIO()
    torch = pytest.importorskip("torch")
    torch.save(torch.zeros(marker, dtype=torch.uint8), buf)
    source = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    members = []
    for info in source.infolist():
        data = source.read(info)
        if info.filename.endswith("data.pkl"):
            assert data.count(struct.pack("<i", marker)) >= 1
            data = data.replace(struct.pack("<i", marker), struct.pack("<i", numel))
        if info.filename.endswith("/data/0"):
            members.append((info.filename, storage, method, numel))
        else:
            members.append((info.filename, data, zipfile.ZIP_STORED, len(data)))
    return _zip(members)


def test_pth_storage_of_1_gib_of_zeros_is_refused_under_a_memory_cap(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    bomb = _pth_claiming(NPZ_BOMB, _deflated_zeros(b"", NPZ_BOMB), zipfile.ZIP_DEFLATED)
    assert len(bomb) < 1_200_000
    message = _decode_in_capped_child(tmp_path, "pth", bomb, preload=("torch",))
    assert "'bomb/0'" in message and "'pth'" in message and f"limit of {1 << 30:,} bytes" in message
    assert "the torch zip archive (the declared sizes of its 7 members)" in message


def test_pth_within_the_limit_still_loads_and_a_lowered_limit_refuses_it() -> None:
    torch = pytest.importorskip("torch")
    small = _pth_claiming(1000, _deflated_zeros(b"", 1000), zipfile.ZIP_DEFLATED)
    assert torch.equal(SampleDecoder().decode_part("pth", small), torch.zeros(1000, dtype=torch.uint8))
    with pytest.raises(DecompressionBombError, match="SampleDecoder\\(max_decompressed_bytes="):
        SampleDecoder(max_decompressed_bytes=999).decode_part("pth", small, key="k")


# --- decode work: JPEG scans -----------------------------------------------------------------


def _segments(data: bytes) -> list[tuple[int, bytes]]:
    """``(marker, bytes)`` of each segment of a JPEG after SOI, a scan with its entropy data."""
    out, pos = [], 2
    while data[pos + 1] != 0xD9:
        end = pos + 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if data[pos + 1] == 0xDA:  # entropy-coded data runs to the next marker
            while data[end] != 0xFF or data[end + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 1
        out.append((data[pos + 1], data[pos:end]))
        pos = end
    return out


def _jpeg_with_scans(extra: int, size: int = 512) -> bytes:
    """A progressive grey JPEG with ``extra`` copies of its last scan (an AC refinement with one
    end-of-band run: 12 to 16 bytes) before EOI: each copy is a pass over the whole image for libjpeg,
    which only warns that the progression is inconsistent."""
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size), 128, np.uint8)).save(buf, format="JPEG", progressive=True, quality=90)
    data = buf.getvalue()
    last_scan = [segment for marker, segment in _segments(data) if marker == 0xDA][-1]
    assert len(last_scan) <= 16
    return data[:-2] + last_scan * extra + data[-2:]


def test_count_jpeg_scans_walks_the_markers() -> None:
    plain = _jpeg_with_scans(0)
    standard = sum(marker == 0xDA for marker, _ in _segments(plain))
    assert standard == 6  # libjpeg's progressive script for grey
    assert image.count_jpeg_scans(plain) == standard
    assert image.count_jpeg_scans(_jpeg_with_scans(1500)) == standard + 1500
    assert image.count_jpeg_scans(_jpeg()) == 1  # baseline, every component in its one scan
    noise = _encode(np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8), "JPEG", quality=95, progressive=True)
    assert image.count_jpeg_scans(noise) == 10  # libjpeg's colour script; 0xFF00 stuffing in the data
    assert image.count_jpeg_scans(_jpeg()[:300]) <= 1 and image.count_jpeg_scans(b"\xff\xd8") == 0


@pytest.mark.parametrize("image_decode", ["rgb8", "torchrgb", "l8", "pil"])  # fast path and Pillow
def test_jpeg_with_1200_empty_scans_is_refused_before_decoding(image_decode: str) -> None:
    bomb = _jpeg_with_scans(1200, size=2048)  # 2048x2048: about 20 s of decoding (twice) before the limit
    assert len(bomb) < 40_000
    with pytest.raises(DecompressionBombError) as info:
        SampleDecoder(image_decode=image_decode).decode_part("jpg", bomb, key="s/9", dataset="/ds", shard="a.tar")
    message = str(info.value)
    assert "sample 's/9', part 'jpg' of dataset /ds, shard a.tar" in message
    assert "JPEG image with 1,206 scans, more than 100" in message and "SampleDecoder(max_jpeg_scans=" in message


def test_jpeg_scan_limit_is_exact_and_configurable() -> None:
    data = _jpeg_with_scans(4, size=64)  # 6 + 4 scans
    assert SampleDecoder(image_decode="l8", max_jpeg_scans=10).decode_part("jpg", data).shape == (64, 64)
    with pytest.raises(DecompressionBombError, match="10 scans, more than 9"):
        SampleDecoder(image_decode="l8", max_jpeg_scans=9).decode_part("jpg", data)
    assert SampleDecoder(image_decode="l8", max_jpeg_scans=None).decode_part("jpg", _jpeg_with_scans(200, size=16)).shape == (16, 16)
    with pytest.raises(ConfigError, match="max_jpeg_scans"):
        SampleDecoder(max_jpeg_scans=0)
    assert SampleDecoder(max_jpeg_scans=7).config()["max_jpeg_scans"] == 7 and "max_jpeg_scans" not in SampleDecoder().config()


def test_a_jpeg_scan_bomb_in_a_dataset_is_skipped_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "scans"
    write_tar(root / "a.tar", [(f"s{i:03d}", {"jpg": _jpeg_with_scans(1000 if i == 2 else 0, size=32)}) for i in range(5)])
    prepare_dataset(root, split_ratio=(1, 0, 0), progress=False, num_workers=1)
    (root / ".nv-meta/dataset.yaml").write_text(yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "ImageSample"}, "field_map": {"image": "jpg"}}))
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(root, worker_config=worker_config, batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
    loader = get_loader(ds)
    assert [sample.__key__ for sample in loader] == ["s000", "s001", "s003", "s004"]
    [listed] = loader.skip_report()["listed"]
    assert listed["key"] == "s002" and listed["shard"] == "a.tar" and listed["reason"].startswith("DecompressionBombError")
    assert "1,006 scans, more than 100" in listed["reason"]


def test_a_truncated_jpeg_is_not_decoded_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("simplejpeg")
    truncated = _jpeg(64, 64)[:-40]
    opened: list[object] = []
    pillow_open = Image.open

    def recording_open(*args: object, **kwargs: object) -> Image.Image:
        opened.append(args)
        return pillow_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", recording_open)
    with pytest.raises(DecodeError, match="Premature end of JPEG file"):
        SampleDecoder(image_decode="rgb8").decode_part("jpg", truncated, key="t")
    assert opened == []  # refused by the fast path, not decoded a second time by Pillow
    with pytest.raises(DecodeError, match="truncated"):  # what Pillow says of it
        SampleDecoder(image_decode="pil").decode_part("jpg", truncated, key="t")
    assert len(opened) == 1
