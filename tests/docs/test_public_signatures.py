"""What ``help()`` shows of the public API: no sentinel objects and no private parameters."""

import inspect

import pytest

import megatron_energon_lite as lite

# The entry points a user calls and the dataset factories (Energon's names) they construct.
PUBLIC = ["get_train_dataset", "get_val_dataset", "get_val_datasets", "get_loader", "get_savable_loader", "get_map_dataset", "WorkerConfig", "SampleDecoder", "Blender", "CaptioningWebdataset", "CrudeWebdataset", "DefaultDecoderWebdatasetFactory"]


@pytest.mark.parametrize("name", PUBLIC)
def test_signature_shows_no_sentinel_or_private_parameter(name):
    signature = inspect.signature(getattr(lite, name))
    assert "object at 0x" not in str(signature), f"{name}{signature}"
    private = [parameter for parameter in signature.parameters if parameter.startswith("_")]
    assert private == [], f"{name} has private parameters {private}"


def test_task_encoder_default_is_none():
    assert inspect.signature(lite.get_train_dataset).parameters["task_encoder"].default is None
    assert inspect.signature(lite.get_val_dataset).parameters["task_encoder"].default is None


def test_the_package_ships_its_type_marker():
    from importlib.resources import files

    assert files("megatron_energon_lite").joinpath("py.typed").is_file()
