"""Guards the public surface: every exported name exists, is sorted, and nothing else leaks."""

import megatron_energon_lite as lite


def test_all_is_sorted_and_importable() -> None:
    assert lite.__all__ == sorted(lite.__all__, key=str)
    for name in lite.__all__:
        assert hasattr(lite, name), name


def test_no_unlisted_public_names() -> None:
    public = {n for n in vars(lite) if not n.startswith("_")}
    submodules = {"decode", "errors", "samples", "format", "storage", "pipeline", "cli", "synthetic"}
    assert public - submodules - set(lite.__all__) == set()


def test_energon_sample_names_are_exported() -> None:
    energon_names = {
        "Sample", "TextSample", "CaptioningSample", "ImageSample", "ImageClassificationSample",
        "VQASample", "VidQASample", "MultiChoiceVQASample", "OCRSample", "InterleavedSample",
        "SimilarityInterleavedSample", "CrudeSample", "SkipSample", "FatalSampleError",
    }
    assert energon_names <= set(lite.__all__)
