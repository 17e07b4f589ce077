import gzip
import io
import json
import logging
import pickle
import sys
import types
import zipfile

import numpy as np
import pytest
import torch

from megatron_energon_lite import decode, policy
from megatron_energon_lite.decode import (
    SampleDecoder,
    UntrustedDataError,
    basic,
    decoder_for,
    register_decoder,
    registered_decoders,
)
from megatron_energon_lite.errors import (
    ConfigError,
    DecodeError,
    MissingDependencyError,
)
from megatron_energon_lite.pipeline import guard


@pytest.fixture
def clean_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_DECODERS", dict(decode._DECODERS))


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(basic, "_warned", set())


@pytest.fixture
def no_trust(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Without the environment opt-ins; a fresh once-per-process log (returned)."""
    monkeypatch.delenv(basic.TRUST_PICKLE_ENV, raising=False)
    logged: set[str] = set()
    monkeypatch.setattr(policy, "_logged", logged)
    return logged


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _pth(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class Payload:
    """A class instance: needs real unpickling."""

    def __init__(self, value: int) -> None:
        self.value = value


@pytest.mark.parametrize("ext", ["txt", "text", "transcript", "caption.txt", "a.b.text"])
def test_text(ext: str) -> None:
    value = "héllo wörld ✓\nline 2"
    assert SampleDecoder().decode_part(ext, value.encode("utf-8")) == value


@pytest.mark.parametrize("ext", ["TXT", "a.b.Text", "meta.JSON", "state.PKL", "cls.GZ"])
def test_non_image_extensions_are_case_sensitive_like_energon(ext: str) -> None:
    data = b"42"
    assert SampleDecoder(allow_pickle=True).decode_part(ext, data) == data


@pytest.mark.parametrize("ext", ["cls", "cls2", "index", "inx", "id"])
@pytest.mark.parametrize("value", [0, 7, -3, 123456789012345])
def test_int(ext: str, value: int) -> None:
    assert SampleDecoder().decode_part(ext, f" {value}\n".encode()) == value


@pytest.mark.parametrize("ext", ["json", "jsn", "detail.json"])
def test_json(ext: str) -> None:
    value = {"caption": "a cat", "boxes": [[1, 2.5, 3, 4]], "ok": True, "none": None, "ü": "✓"}
    assert SampleDecoder().decode_part(ext, json.dumps(value).encode()) == value


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        np.array([[1, -2], [3, 4]], dtype=np.int64),
        np.array([True, False]),
        np.zeros((0, 5), dtype=np.uint8),
        np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        np.array(7.5),  # 0-d
        np.arange(6, dtype=">i2"),  # big-endian
        np.array(["a", "bc"]),
        np.zeros(3, dtype=[("x", "<i4"), ("y", "f8")]),
        np.zeros(2, dtype=[("€", "<i4")]),  # a field name outside latin-1: format version 3.0
    ],
)
@pytest.mark.filterwarnings("ignore:Stored array in format 3.0")
def test_npy_roundtrip(array: np.ndarray) -> None:
    """Our reader (which checks the declared size before allocating) gives numpy.load's arrays."""
    data = _npy(array)
    out = SampleDecoder().decode_part("npy", data)
    reference = np.load(io.BytesIO(data))
    assert isinstance(out, np.ndarray) and out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable and out.flags.c_contiguous == reference.flags.c_contiguous and out.flags.f_contiguous == reference.flags.f_contiguous
    npz = SampleDecoder().decode_part("npz", _npz(a=array))
    assert npz["a"].dtype == array.dtype and npz["a"].shape == array.shape
    np.testing.assert_array_equal(npz["a"], array)


def test_npz_gives_dict_of_arrays() -> None:
    a, b = np.arange(5, dtype=np.int16), np.eye(3, dtype=np.float32)
    out = SampleDecoder().decode_part("npz", _npz(a=a, b=b))
    assert sorted(out) == ["a", "b"]
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)
    assert out["b"].dtype == np.float32


def test_npy_object_arrays_need_allow_pickle(no_trust: set[str]) -> None:
    data = _npy(np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(DecodeError, match="allow_pickle") as info:
        SampleDecoder().decode_part("npy", data, key="obj")
    assert isinstance(info.value.__cause__, ValueError)
    out = SampleDecoder(allow_pickle=True).decode_part("npy", data)
    assert out.dtype == object and out[0] == {"a": 1} and out[1] is None


def test_npz_members_as_numpy_load_gives_them() -> None:
    """Compressed or not; a member that is not an array comes back as bytes, as numpy.load does."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("notes.txt", b"hello")
        archive.writestr("fake.npy", b"not an array")
        with archive.open("real.npy", "w") as member:
            np.save(member, np.arange(4))
    with np.load(io.BytesIO(buf.getvalue())) as reference:
        expected = {name: reference[name] for name in reference.files}
    out = SampleDecoder().decode_part("npz", buf.getvalue())
    assert out.keys() == expected.keys() == {"notes.txt", "fake", "real"}
    assert out["notes.txt"] == b"hello" and out["fake"] == b"not an array"
    np.testing.assert_array_equal(out["real"], expected["real"])
    compressed = io.BytesIO()
    np.savez_compressed(compressed, a=np.eye(30))
    np.testing.assert_array_equal(SampleDecoder().decode_part("npz", compressed.getvalue())["a"], np.eye(30))


def test_npz_member_with_a_bad_crc_is_a_decode_error() -> None:
    data = bytearray(_npz(a=np.arange(100)))
    data[data.index(np.arange(100).tobytes()) + 8] ^= 1  # a stored member's bytes: the CRC no longer fits
    with pytest.raises(DecodeError, match="CRC"):
        SampleDecoder().decode_part("npz", bytes(data), key="k")


def test_npz_rejects_npy_bytes() -> None:
    with pytest.raises(DecodeError, match="npz"):
        SampleDecoder().decode_part("npz", _npy(np.arange(3)), key="k")


def test_pth_tensors_load_with_weights_only() -> None:
    obj = {"weights": torch.arange(6, dtype=torch.float16).reshape(2, 3), "ids": [1, 2], "name": "x"}
    out = SampleDecoder().decode_part("pth", _pth(obj))
    assert out["ids"] == [1, 2] and out["name"] == "x"
    assert out["weights"].dtype == torch.float16 and torch.equal(out["weights"], obj["weights"])


def test_pth_arbitrary_objects_need_allow_pickle(no_trust: set[str]) -> None:
    data = _pth(Payload(5))
    with pytest.raises(DecodeError, match="torch.load") as info:
        SampleDecoder().decode_part("pth", data, key="k9")
    assert "allow_pickle=True" in str(info.value)
    assert SampleDecoder(allow_pickle=True).decode_part("pth", data).value == 5


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd", "state.pkl"])
def test_pickle_is_refused_by_default_naming_part_key_and_opt_ins(ext: str, no_trust: set[str]) -> None:
    data = pickle.dumps(Payload(3))
    with pytest.raises(UntrustedDataError) as info:
        SampleDecoder().decode({ext: data, "txt": b"fine"}, key="sample_07", dataset="/data/ds")
    message = str(info.value)
    assert f"part {ext!r} of sample 'sample_07'" in message and "/data/ds" in message
    assert "SampleDecoder(allow_pickle=True)" in message and "ENERGON_LITE_TRUST_PICKLE=1" in message
    # A DecodeError that is also a ConfigError: the sample guard stops instead of skipping them all.
    assert isinstance(info.value, DecodeError) and isinstance(info.value, ConfigError)
    assert "ConfigError" in [cls.__name__ for cls in guard.SYSTEM_EXCEPTIONS]


def test_decode_pickle_called_directly_refuses_too(no_trust: set[str]) -> None:
    with pytest.raises(UntrustedDataError, match="ENERGON_LITE_TRUST_PICKLE"):
        basic.decode_pickle(pickle.dumps(1), SampleDecoder())


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd"])
def test_pickle_with_allow_pickle_argument(ext: str, no_trust: set[str]) -> None:
    decoded = SampleDecoder(allow_pickle=True).decode_part(ext, pickle.dumps(Payload(3)), key="k")
    assert isinstance(decoded, Payload) and decoded.value == 3
    assert not no_trust  # an explicit argument logs nothing


def test_pickle_with_environment_variable(no_trust: set[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    decoder = SampleDecoder()  # built before the variable is set, like a class-level default decoder
    monkeypatch.setenv(basic.TRUST_PICKLE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.energon_mode"):
        for i in range(3):
            assert decoder.decode_part("pkl", pickle.dumps(Payload(i)), key=f"k{i}", dataset="/a").value == i
        assert decoder.decode_part("pkl", pickle.dumps(Payload(9)), key="k", dataset="/b").value == 9
    logs = [r.getMessage() for r in caplog.records]
    assert len(logs) == 2 and "ENERGON_LITE_TRUST_PICKLE" in logs[0] and "'k0'" in logs[0] and "/b" in logs[1]
    # numpy object arrays and arbitrary torch files follow the same opt-in
    assert decoder.decode_part("npy", _npy(np.array([{"a": 1}], dtype=object)))[0] == {"a": 1}
    assert decoder.decode_part("pth", _pth(Payload(5))).value == 5
    monkeypatch.setenv(basic.TRUST_PICKLE_ENV, "0")
    with pytest.raises(UntrustedDataError):
        decoder.decode_part("pkl", pickle.dumps(1))


def test_pickle_under_energons_policy_unpickles_and_logs_once_per_dataset(no_trust: set[str], caplog: pytest.LogCaptureFixture) -> None:
    """What a loader planned under as_energon decodes with (SampleDecoder.under its policy)."""
    decoder = SampleDecoder()
    energons = decoder.under(policy.ENERGON)
    assert decoder.under(policy.PLAIN) is decoder and energons.config() == decoder.config()  # not part of the fingerprint
    with caplog.at_level(logging.WARNING, logger="megatron_energon_lite.energon_mode"):
        for dataset in ("/a", "/a", "/b"):
            assert energons.decode_part("pickle", pickle.dumps(Payload(4)), key="k", dataset=dataset).value == 4
        with pytest.raises(UntrustedDataError):  # the decoder it was made from keeps ours
            decoder.decode_part("pickle", pickle.dumps(Payload(4)), key="k", dataset="/a")
    logs = [r.getMessage() for r in caplog.records]
    assert len(logs) == 2 and all("as Energon does" in line for line in logs)
    assert "/a" in logs[0] and "/b" in logs[1]


def test_untrusted_pickle_bytes_leaves_the_part_undecoded(no_trust: set[str]) -> None:
    data = pickle.dumps(Payload(3))
    decoder = SampleDecoder(untrusted_pickle="bytes")
    assert decoder.decode_part("pkl", data, key="k") == data
    assert decoder.config()["untrusted_pickle"] == "bytes" and "untrusted_pickle" not in SampleDecoder().config()
    with pytest.raises(ConfigError, match="untrusted_pickle"):
        SampleDecoder(untrusted_pickle="skip")


def test_config_is_plain_json_and_tracks_settings() -> None:
    config = SampleDecoder().config()
    assert json.loads(json.dumps(config)) == config
    assert config == {
        "type": "SampleDecoder",
        "image_decode": "torchrgb",
        "av_decode": "AVDecoder",
        "video_decode_audio": False,
        "guess_content": False,
        "allow_pickle": False,
        "image_max_size": None,
        "av_byte_budget": 1 << 30,
        "av_backend": f"pyav {__import__('av').__version__}",
    }
    other = SampleDecoder(image_decode="pil", av_decode="torch", video_decode_audio=True, allow_pickle=True, image_max_size=256)
    assert other.config() == {**config, "image_decode": "pil", "av_decode": "torch", "video_decode_audio": True, "allow_pickle": True, "image_max_size": 256}
    assert "image_decode='pil'" in repr(other)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"av_decode": "opencv"}, "opencv"),
        ({"image_max_size": 0}, "image_max_size"),
        ({"image_max_size": 12.5}, "image_max_size"),
        ({"image_max_size": True}, "image_max_size"),
        ({"allow_pickle": "yes"}, "allow_pickle"),
        ({"video_decode_audio": 1}, "video_decode_audio"),
    ],
)
def test_bad_settings_raise_config_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SampleDecoder(**kwargs)


@pytest.mark.parametrize(("name", "expected"), [("txt.gz", "gzipped text"), ("detail.json.gz", {"a": [1]}), ("cls.gz", 42)])
def test_gz_is_decompressed_then_decoded(name: str, expected: object) -> None:
    raw = json.dumps(expected).encode() if isinstance(expected, dict) else str(expected).encode()
    assert SampleDecoder().decode_part(name, gzip.compress(raw)) == expected


def test_plain_gz_and_unknown_gz_become_decompressed_bytes() -> None:
    assert SampleDecoder().decode_part("gz", gzip.compress(b"abc")) == b"abc"
    assert SampleDecoder().decode_part("bin.gz", gzip.compress(b"\x00\x01")) == b"\x00\x01"


def test_corrupt_gz_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="gzip") as info:
        SampleDecoder().decode_part("txt.gz", b"not gzip at all", key="z1")
    assert "'z1'" in str(info.value) and "'txt.gz'" in str(info.value)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("ext", ["bin", "dat", "xyz", "", "tar"])
def test_unknown_extensions_stay_bytes(ext: str) -> None:
    data = b"\x00\x01raw"
    out = SampleDecoder().decode_part(ext, data)
    assert out == data and isinstance(out, bytes)


def test_bytes_like_inputs_and_non_bytes_passthrough() -> None:
    decoder = SampleDecoder()
    assert decoder.decode_part("txt", bytearray(b"ab")) == "ab"
    assert decoder.decode_part("json", memoryview(b'{"x": 1}')) == {"x": 1}
    already = {"decoded": True}
    assert decoder.decode_part("json", already) is already


def test_decode_whole_sample() -> None:
    parts = {
        "__key__": b"raw key bytes",
        "__restore_key__": ("ds", 3),
        "__meta__.json": b'{"kept": "as bytes"}',
        "txt": b"caption",
        "detail.json": b'{"k": 1}',
        "cls": b"4",
        "bin": b"\xff",
    }
    original = dict(parts)
    out = SampleDecoder().decode(parts, key="s0")
    assert out == {
        "__key__": b"raw key bytes",
        "__restore_key__": ("ds", 3),
        "__meta__.json": b'{"kept": "as bytes"}',
        "txt": "caption",
        "detail.json": {"k": 1},
        "cls": 4,
        "bin": b"\xff",
    }
    assert parts == original  # input untouched
    assert SampleDecoder()({"__key__": "s1", "txt": b"x"}) == {"__key__": "s1", "txt": "x"}


def test_decode_file_splits_key_like_energon() -> None:
    decoder = SampleDecoder()
    assert decoder.decode_file("folder/0001.detail.json", b'{"a": 2}') == {"a": 2}
    with pytest.raises(DecodeError) as info:
        decoder.decode_file("folder/0001.cls", b"x")
    assert "'folder/0001'" in str(info.value)


@pytest.mark.parametrize(
    ("part", "data", "decoder_name", "cause"),
    [
        ("txt", b"\xff\xfe bad utf-8", "text (utf-8)", UnicodeDecodeError),
        ("cls", b"three", "integer", ValueError),
        ("json", b"{not json", "json", json.JSONDecodeError),
        ("npy", b"\x93NUMPY garbage", "numpy .npy", ValueError),
    ],
)
def test_decode_errors_name_key_part_and_decoder(part: str, data: bytes, decoder_name: str, cause: type) -> None:
    with pytest.raises(DecodeError) as info:
        SampleDecoder().decode({"__key__": "k", part: data}, key="shard_3/sample_17")
    message = str(info.value)
    assert "'shard_3/sample_17'" in message
    assert f"part {part!r}" in message
    assert f"{decoder_name} decoder" in message
    assert "fix:" in message and "where:" in message and "found:" in message
    assert isinstance(info.value.__cause__, cause)
    assert cause.__name__ in message


def test_msgpack_and_cbor_stay_bytes_without_their_library(monkeypatch: pytest.MonkeyPatch, fresh_warnings: None) -> None:
    for name in ("msgpack", "cbor2", "cbor"):
        monkeypatch.setitem(sys.modules, name, None)  # makes the import fail
    for ext in ("mp", "msg", "msgpack", "cbor"):
        assert SampleDecoder().decode_part(ext, b"\x81\xa1a\x01") == b"\x81\xa1a\x01"


def test_msgpack_and_cbor_use_their_library_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bytes]] = []
    fake_msgpack = types.ModuleType("msgpack")
    fake_msgpack.unpackb = lambda data: calls.append(("msgpack", data)) or {"from": "msgpack"}  # type: ignore[attr-defined]
    fake_cbor2 = types.ModuleType("cbor2")
    fake_cbor2.loads = lambda data: calls.append(("cbor2", data)) or {"from": "cbor2"}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "msgpack", fake_msgpack)
    monkeypatch.setitem(sys.modules, "cbor2", fake_cbor2)
    assert SampleDecoder().decode_part("msgpack", b"m") == {"from": "msgpack"}
    assert SampleDecoder().decode_part("cbor", b"c") == {"from": "cbor2"}
    assert calls == [("msgpack", b"m"), ("cbor2", b"c")]


def test_real_msgpack_roundtrip() -> None:
    msgpack = pytest.importorskip("msgpack")
    value = {"a": [1, 2, 3], "b": "x"}
    assert SampleDecoder().decode_part("mp", msgpack.packb(value)) == value


def test_register_decoder_adds_an_extension(clean_table: None) -> None:
    seen = []

    def decode_upper(data: bytes, decoder: SampleDecoder) -> str:
        seen.append(decoder)
        return data.decode().upper()

    register_decoder(["shout", "yell"], decode_upper, name="shout", ignore_case=True)
    decoder = SampleDecoder()
    assert decoder.decode_part("a.SHOUT", b"hi") == "HI"
    assert decoder.decode_part("yell", b"yo") == "YO"
    assert seen == [decoder, decoder]
    assert decoder_for("shout").name == "shout" and "yell" in registered_decoders()
    register_decoder("shout yell", decode_upper)  # the same function again: fine


def test_register_decoder_conflicts_and_bad_extensions(clean_table: None) -> None:
    def other(data: bytes, decoder: SampleDecoder) -> str:
        return "other"

    with pytest.raises(ConfigError, match="'txt' already has a decoder") as info:
        register_decoder(["txt"], other)
    assert "text (utf-8)" in str(info.value)
    assert SampleDecoder().decode_part("txt", b"x") == "x"
    register_decoder(["txt"], other, replace=True)
    assert SampleDecoder().decode_part("txt", b"x") == "other"
    for bad in ("a.b", "", "x/y"):
        with pytest.raises(ConfigError, match="extension"):
            register_decoder([bad], other)
    with pytest.raises(ConfigError, match="callable"):
        register_decoder(["newext"], "not callable")  # type: ignore[arg-type]


def test_missing_dependency_is_not_wrapped(clean_table: None) -> None:
    def needs_av(data: bytes, decoder: SampleDecoder) -> None:
        raise MissingDependencyError("install the av extra")

    register_decoder(["vid"], needs_av)
    with pytest.raises(MissingDependencyError):
        SampleDecoder().decode_part("vid", b"...")


def test_builtin_table() -> None:
    table = registered_decoders()
    for ext in ("txt", "text", "transcript", "cls", "cls2", "index", "inx", "id", "json", "jsn", "npy", "npz", "pth", "pkl", "pickle", "pyd", "mp", "msgpack", "cbor", "jpg", "png"):
        assert ext in table, ext
    assert list(table) == sorted(table)
    assert decoder_for("JPG") is decoder_for("jpg") and decoder_for("MP4") is None  # AV extensions are exact, as Energon's
    assert decoder_for("mp4") is decoder_for("wav") is not None


@pytest.mark.energon
def test_basic_parts_match_webdataset() -> None:
    autodecode = pytest.importorskip("webdataset.autodecode")
    reference = autodecode.Decoder([])
    parts = {
        "txt": "ünïcode".encode(),
        "transcript": b"words",
        "cls": b"12",
        "id": b" 5 ",
        "json": b'{"a": [1, {"b": null}]}',
        "detail.json": b'{"x": 1.5}',
        "txt.gz": gzip.compress(b"zipped"),
        "gz": gzip.compress(b"raw"),
        "bin": b"\x00\x01",
        "npy": _npy(np.arange(12, dtype=np.int32).reshape(3, 4)),
    }
    ours = SampleDecoder().decode(parts, key="k")
    for name, data in parts.items():
        theirs = reference.decode1(name, data)
        if isinstance(theirs, np.ndarray):
            np.testing.assert_array_equal(ours[name], theirs)
            assert ours[name].dtype == theirs.dtype
        else:
            assert ours[name] == theirs and type(ours[name]) is type(theirs), name
