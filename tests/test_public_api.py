"""Guards the public surface: every exported name exists, is sorted, and nothing else leaks."""

import types

import megatron_energon_lite as lite


def test_all_is_sorted_and_importable() -> None:
    assert lite.__all__ == sorted(lite.__all__, key=str)
    for name in lite.__all__:
        assert hasattr(lite, name), name


def test_no_unlisted_public_names() -> None:
    # Submodules show up as attributes once anything imports them; they are not API names.
    public = {n for n, v in vars(lite).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public - set(lite.__all__) == set()


def test_energon_sample_names_are_exported() -> None:
    energon_names = {
        "Sample", "TextSample", "CaptioningSample", "ImageSample", "ImageClassificationSample",
        "VQASample", "VidQASample", "MultiChoiceVQASample", "OCRSample", "InterleavedSample",
        "SimilarityInterleavedSample", "CrudeSample", "SkipSample", "FatalSampleError",
    }
    assert energon_names <= set(lite.__all__)
