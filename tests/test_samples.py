import dataclasses
import subprocess
import sys
import typing

import numpy as np
import pytest
import torch
from PIL import Image

from megatron_energon_lite import samples
from megatron_energon_lite.errors import ConfigError
from megatron_energon_lite.samples import (
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    SourceInfo,
    TextSample,
    TokensSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
    format_value,
    register_sample_type,
    registered_sample_types,
    sample_type_by_name,
)

MISSING = dataclasses.MISSING
BASE = [("__key__", MISSING), ("__restore_key__", ()), ("__subflavors__", None), ("__sources__", None)]

# Field names, order and defaults after the base fields, as read from Energon 7.4.1's flavors/*.py.
EXPECTED_FIELDS = {
    TextSample: [("text", MISSING)],
    CaptioningSample: [("image", MISSING), ("caption", MISSING)],
    ImageSample: [("image", MISSING)],
    ImageClassificationSample: [("image", MISSING), ("label", None), ("label_name", None)],
    VQASample: [("image", MISSING), ("context", MISSING), ("answers", None), ("answer_weights", None)],
    VidQASample: [("video", MISSING), ("context", MISSING), ("answers", None), ("answer_weights", None)],
    MultiChoiceVQASample: [("image", MISSING), ("context", MISSING), ("choices", None), ("correct_choice_idx", 0)],
    OCRSample: [("image", MISSING), ("text", MISSING)]
    + [
        (name, None)
        for name in (
            "block_boxes",
            "block_classes",
            "block_text",
            "lines_boxes",
            "lines_text",
            "words_boxes",
            "words_text",
            "chars_boxes",
            "chars_text",
        )
    ],
    InterleavedSample: [("sequence", MISSING)],
    SimilarityInterleavedSample: [
        ("images", MISSING),
        ("texts", MISSING),
        ("audio", None),
        ("video", None),
        ("similarity_matrix", None),
        ("matched_text_indices", None),
    ],
    VQAOCRSample: [
        ("image", MISSING),
        ("context", MISSING),
        ("text", MISSING),
        ("answers", None),
        ("answer_weights", None),
        ("words_boxes", None),
        ("words_text", None),
    ],
    TokensSample: [("tokens", MISSING)],
}


def _fields(cls: type) -> list[tuple[str, object]]:
    return [(f.name, f.default) for f in dataclasses.fields(cls)]


def _source(i: int) -> SourceInfo:
    return SourceInfo(dataset_path=f"/data/ds{i}", index=i, shard_name=f"shard_{i}.tar", file_names=(f"k{i}.txt",))


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samples, "_SAMPLE_TYPES", dict(samples._SAMPLE_TYPES))


@pytest.mark.parametrize("cls", list(EXPECTED_FIELDS), ids=lambda c: c.__name__)
def test_fields_order_and_defaults(cls: type) -> None:
    assert _fields(cls) == BASE + EXPECTED_FIELDS[cls]
    assert all(f.kw_only for f in dataclasses.fields(cls))
    assert issubclass(cls, Sample)
    assert not hasattr(cls(**{n: "x" for n, d in _fields(cls) if d is MISSING}), "__dict__")  # slots


def test_keyword_only_construction() -> None:
    with pytest.raises(TypeError):
        TextSample("key", (), None, None, "text")  # type: ignore[misc]
    with pytest.raises(TypeError):
        TextSample(__key__="k")  # type: ignore[call-arg]
    sample = TextSample(__key__="k", text="hello")
    assert (sample.__key__, sample.__restore_key__, sample.__subflavors__, sample.__sources__, sample.text) == ("k", (), None, None, "hello")


def test_type_hints_resolve_without_torch_import() -> None:
    hints = typing.get_type_hints(OCRSample)
    assert list(hints) == [f.name for f in dataclasses.fields(OCRSample)]
    assert hints["text"] is str


def test_importing_samples_does_not_import_torch() -> None:
    code = (
        "import sys, megatron_energon_lite; before = set(sys.modules); "
        "import megatron_energon_lite.samples; "
        "added = set(sys.modules) - before; "
        "print(sorted(m for m in added if m.split('.')[0] in ('torch', 'numpy', 'PIL')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_source_info_is_frozen_and_positional_or_keyword() -> None:
    by_kw = SourceInfo(dataset_path="/d", index=3, shard_name="s.tar", file_names=("a.jpg", "a.txt"))
    assert by_kw == SourceInfo("/d", 3, "s.tar", ("a.jpg", "a.txt"))
    assert [f.name for f in dataclasses.fields(SourceInfo)] == ["dataset_path", "index", "shard_name", "file_names"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        by_kw.index = 4  # type: ignore[misc]
    assert hash(by_kw) == hash(SourceInfo("/d", 3, "s.tar", ("a.jpg", "a.txt")))


def test_derive_from_copies_base_fields_only() -> None:
    base = CaptioningSample(
        __key__="k", __restore_key__=("ds", 7), __subflavors__={"a": 1}, __sources__=(_source(0),), image="img", caption="cap"
    )
    derived = TextSample.derive_from(base, text="new")
    assert isinstance(derived, TextSample)
    assert (derived.__key__, derived.__restore_key__, derived.__subflavors__, derived.__sources__) == (
        "k",
        ("ds", 7),
        {"a": 1},
        (_source(0),),
    )
    assert derived.text == "new"
    overridden = TextSample.derive_from(base, text="t", __key__="other")
    assert overridden.__key__ == "other" and overridden.__restore_key__ == ("ds", 7)
    with pytest.raises(TypeError):
        TextSample.derive_from(base, caption="not a TextSample field")


@dataclasses.dataclass(kw_only=True, slots=True)
class JoinedSample(Sample):
    image: object = None
    caption: str | None = None
    text: str | None = None


def test_from_joined_merges_in_order_and_concatenates_sources() -> None:
    first = CaptioningSample(
        __key__="k1", __restore_key__=("a", 1), __subflavors__={"f": 1}, __sources__=(_source(1),), image="img1", caption="c1"
    )
    second = TextSample(__key__="k2", __restore_key__=("b", 2), __subflavors__={"f": 2}, __sources__=(_source(2), _source(3)), text="t2")
    third = CaptioningSample(__key__="k3", image="img3", caption="c3")
    joined = JoinedSample.from_joined(first, None, second, third)
    assert (joined.__key__, joined.__restore_key__, joined.__subflavors__) == ("k1", ("a", 1), {"f": 1})
    assert joined.__sources__ == (_source(1), _source(2), _source(3))
    assert (joined.image, joined.caption, joined.text) == ("img3", "c3", "t2")

    with_override = JoinedSample.from_joined(first, second, caption="forced")
    assert with_override.caption == "forced" and with_override.text == "t2"


def test_from_joined_errors() -> None:
    one = TextSample(__key__="k", text="t")
    with pytest.raises(ConfigError, match="primary sample"):
        JoinedSample.from_joined()
    with pytest.raises(ConfigError, match="primary sample"):
        JoinedSample.from_joined(None, one)
    with pytest.raises(ConfigError, match="keyword arguments"):
        JoinedSample.from_joined(one, other=one)
    vqa = VQASample(__key__="k", image="i", context="q")
    with pytest.raises(ConfigError, match="context") as info:
        JoinedSample.from_joined(one, vqa)
    assert "answers" in str(info.value) and "JoinedSample" in str(info.value)


def test_from_joined_without_sources_gives_empty_tuple() -> None:
    joined = TextSample.from_joined(TextSample(__key__="a", text="x"), TextSample(__key__="b", text="y"))
    assert joined.__sources__ == () and joined.text == "y" and joined.__key__ == "a"


@dataclasses.dataclass(kw_only=True, slots=True)
class CaptionWithScore(CaptioningSample):
    score: float = 0.0


def test_extend_copies_all_fields() -> None:
    src = CaptioningSample(__key__="k", __restore_key__=("r",), __sources__=(_source(0),), image="img", caption="cap")
    ext = CaptionWithScore.extend(src, score=0.5)
    assert isinstance(ext, CaptionWithScore)
    assert (ext.__key__, ext.__restore_key__, ext.__sources__, ext.image, ext.caption, ext.score) == (
        "k",
        ("r",),
        (_source(0),),
        "img",
        "cap",
        0.5,
    )
    replaced = CaptionWithScore.extend(src, caption="new")
    assert replaced.caption == "new" and replaced.score == 0.0
    with pytest.raises(ConfigError, match="CaptionWithScore"):
        CaptionWithScore.extend(TextSample(__key__="k", text="t"))


def test_repr_is_compact() -> None:
    tensor = torch.full((3, 40, 60), 12345.0)
    sample = VQASample(__key__="key0", image=tensor, context="q" * 500, answers=["yes", "no"], answer_weights=torch.tensor([0.25, 0.75]))
    text = repr(sample)
    assert text.startswith("VQASample(__key__='key0'")
    assert "shape=(3, 40, 60)" in text and "float32" in text
    assert "12345" not in text and "0.25" not in text
    assert "q" * 81 not in text and "500 chars" in text
    assert "['yes', 'no']" in text
    assert str(sample) == text
    assert len(text) < 400


def test_repr_images_arrays_bytes() -> None:
    image = Image.new("RGB", (7, 5), color=(200, 100, 50))
    sample = InterleavedSample(__key__="k", sequence=[image, np.full((4, 2), 77, dtype=np.uint16), b"\x00" * 1000, "short"])
    text = repr(sample)
    assert "PIL.Image(size=(7, 5), mode=RGB)" in text
    assert "ndarray(shape=(4, 2), dtype=uint16)" in text
    assert "bytes(len=1000)" in text and "\\x00" not in text
    assert "'short'" in text
    many = format_value(list(range(1000)))
    assert many.startswith("[0, 1, 2") and "1000 items" in many and "999" not in many


def test_str_is_compact_for_user_subclass_with_generated_repr() -> None:
    @dataclasses.dataclass(kw_only=True)
    class MySample(Sample):
        data: object

    sample = MySample(__key__="k", data=torch.full((100,), 4242.0))
    assert "4242" in repr(sample)  # the dataclass-generated repr, untouched
    assert "4242" not in str(sample) and "shape=(100,)" in str(sample)


def test_pin_memory_keeps_non_tensor_fields() -> None:
    sample = TextSample(__key__="k", __subflavors__={"a": [1, 2]}, __sources__=(_source(0),), text="t")
    pinned = sample.pin_memory()
    assert pinned == sample and pinned is not sample


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs an accelerator")
def test_pin_memory_pins_tensors() -> None:
    sample = SimilarityInterleavedSample(__key__="k", images=[torch.ones(2)], texts=["a"], similarity_matrix=torch.zeros(1, 1))
    pinned = sample.pin_memory()
    assert pinned.images[0].is_pinned() and pinned.similarity_matrix.is_pinned()


def test_registry_holds_all_builtins_sorted() -> None:
    registry = registered_sample_types()
    assert set(registry) == {cls.__name__ for cls in EXPECTED_FIELDS}
    assert list(registry) == sorted(registry)
    for name, cls in registry.items():
        assert sample_type_by_name(name) is cls
    assert sample_type_by_name("CrudeSample") is None
    assert sample_type_by_name("NoSuchSample") is None
    registry.clear()  # a copy: the registry itself is untouched
    assert sample_type_by_name("TextSample") is TextSample


def test_crude_sample_is_a_plain_dict() -> None:
    crude = CrudeSample(jpg=b"x", __key__="k")
    assert isinstance(crude, dict) and not isinstance(crude, Sample)
    assert crude == {"jpg": b"x", "__key__": "k"}
    crude["txt"] = "t"
    assert sorted(crude) == ["__key__", "jpg", "txt"]


def test_register_sample_type_as_decorator(clean_registry: None) -> None:
    @register_sample_type
    @dataclasses.dataclass(kw_only=True, slots=True)
    class AudioSample(Sample):
        audio: object

    assert sample_type_by_name("AudioSample") is AudioSample
    assert register_sample_type(AudioSample) is AudioSample  # same class again: fine
    assert "AudioSample" in registered_sample_types()


def test_register_sample_type_rejects_conflicts_and_non_samples(clean_registry: None) -> None:
    @dataclasses.dataclass(kw_only=True)
    class TextSample(Sample):  # noqa: F811 - the clash is the point
        text: str

    with pytest.raises(ConfigError, match="already registered") as info:
        register_sample_type(TextSample)
    assert "megatron_energon_lite.samples.TextSample" in str(info.value)
    assert sample_type_by_name("TextSample") is samples.TextSample
    register_sample_type(TextSample, replace=True)
    assert sample_type_by_name("TextSample") is TextSample

    @dataclasses.dataclass
    class NotASample:
        x: int

    for bad in (NotASample, CrudeSample, "TextSample", 3):
        with pytest.raises(ConfigError, match="Sample"):
            register_sample_type(bad)  # type: ignore[arg-type]


@pytest.mark.energon
def test_fields_match_installed_energon() -> None:
    energon = pytest.importorskip("megatron.energon")
    from megatron.energon.flavors.vqa_and_ocr import VQAOCRSample as EnergonVQAOCRSample

    for cls in EXPECTED_FIELDS:
        if cls is TokensSample:
            continue  # ours: Energon has no type for Megatron .bin/.idx token data
        theirs = EnergonVQAOCRSample if cls is VQAOCRSample else getattr(energon, cls.__name__)
        ours_fields = _fields(cls)
        their_fields = _fields(theirs)
        # Energon's __restore_key__ has no default; ours defaults to () so samples built by hand need none.
        assert their_fields[1] == ("__restore_key__", MISSING)
        assert ours_fields[:1] + ours_fields[2:] == their_fields[:1] + their_fields[2:], cls.__name__
        assert [f.kw_only for f in dataclasses.fields(theirs)] == [f.kw_only for f in dataclasses.fields(cls)]
    assert [f.name for f in dataclasses.fields(energon.SourceInfo)] == [f.name for f in dataclasses.fields(SourceInfo)]
    assert issubclass(energon.CrudeSample, dict)


def test_fields_by_name_on_samples_and_batches() -> None:
    sample = CaptioningSample(__key__="k", image=torch.zeros(3, 2, 2), caption="a cat")
    assert sample["caption"] == "a cat" and sample["image"] is sample.image and sample["__key__"] == "k"
    assert "caption" in sample and "missing" not in sample and 0 not in sample
    batch = samples.generic_batch([sample, CaptioningSample(__key__="j", image=torch.ones(3, 2, 2), caption="a dog")])
    assert batch["image"].shape == (2, 3, 2, 2) and batch["caption"] == ["a cat", "a dog"]

    @dataclasses.dataclass(kw_only=True, slots=True)
    class ImageBatch(samples.Batch):
        image: list

    image_batch = ImageBatch.from_samples([sample])
    assert image_batch["image"] == [sample.image] and image_batch["__key__"] == ["k"]
    for obj, name in ((sample, "images"), (image_batch, "caption"), (sample, 0)):
        with pytest.raises(KeyError) as info:
            obj[name]
        message = str(info.value)
        assert type(obj).__name__ in message and repr(name) in message and "image" in message and "__key__" in message
    with pytest.raises(TypeError, match="not iterable"):  # no positional iteration through __getitem__
        list(sample)
