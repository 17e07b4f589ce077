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


def test_our_additions_are_exported() -> None:
    # The map view for Megatron/BioNeMo samplers, its epoch tools, and the .bin/.idx sample type.
    ours = {"EpochIndex", "IdentityEpochWrapper", "MapStyleDataset", "MultiEpochResampler", "TokensSample", "get_map_dataset"}
    assert ours <= set(lite.__all__)


# Energon 7.4.1's ``megatron.energon.__all__`` (96 names), which code written for Energon imports.
ENERGON_7_4_NAMES = [
    "AugmentTaskEncoder", "BaseCoreDatasetFactory", "BaseWebdatasetFactory", "Batch",
    "BatchDataset", "BlendDataset", "CachePool", "CaptioningSample", "CaptioningWebdataset",
    "ConcatDataset", "Cooker", "CrudeJsonlDatasetFactory", "CrudeSample", "CrudeWebdataset",
    "DatasetLoader", "DatasetLoaderInterface", "DecodeFileStore", "DefaultCrudeJsonlDatasetFactory",
    "DefaultDecoderWebdatasetFactory", "DefaultGenericWebdatasetFactory", "DefaultTaskEncoder",
    "DirectLazy", "EpochizeDataset", "FileCacheLazy", "FileStore", "FileStoreCachePool",
    "FileStoreDecoder", "FilterDataset", "GcDataset", "GroupBatchDataset",
    "ImageClassificationSample", "ImageClassificationWebdataset", "ImageSample", "ImageWebdataset",
    "InterleavedSample", "InterleavedWebdataset", "IterMapDataset", "JoinedWebdatasetFactory",
    "Lazy", "LimitDataset", "LogSampleDataset", "MapDataset", "Metadataset", "MetadatasetV2",
    "MixBatchDataset", "MockLazy", "MultiChoiceVQASample", "MultiChoiceVQAWebdataset",
    "NoCachePool", "OCRSample", "OCRWebdataset", "PackingDataset", "PrimaryFileStore",
    "RepeatDataset", "Sample", "SampleDecoder", "SavableDataLoader", "SavableDataset",
    "ShuffleBufferDataset", "SimilarityInterleavedSample", "SimilarityInterleavedWebdataset",
    "SkipSample", "SourceInfo", "StandardWebdatasetFactory", "SystemFileStore", "TaskEncoder",
    "TextSample", "TextWebdataset", "VQAOCRWebdataset", "VQASample", "VQAWebdataset", "VidQASample",
    "VidQAWebdataset", "WorkerConfig", "__version__", "basic_sample_keys", "batch_list",
    "batch_pad_stack", "batch_stack", "concat_pad", "cooker", "edataclass", "generic_batch",
    "generic_concat", "get_loader", "get_savable_loader", "get_train_dataset", "get_val_dataset",
    "get_val_datasets", "homogeneous_concat_mix", "load_dataset", "log_exception",
    "prepare_metadataset", "reraise_exception", "stateless", "traverse_metadataset",
]


def test_every_energon_7_4_public_name_exists() -> None:
    assert len(ENERGON_7_4_NAMES) == 96
    missing = [name for name in ENERGON_7_4_NAMES if not hasattr(lite, name)]
    assert missing == []
    assert set(ENERGON_7_4_NAMES) <= set(lite.__all__)
