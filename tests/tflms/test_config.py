"""LMSConfig: validation names the field, echoes the value and says the fix."""

import json

import pytest

from tflms import LMSConfig
from tflms.errors import ConfigError


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("swapout_threshold", -1, "swapout_threshold=-1"),
        ("swapout_threshold", 2.5, "an int >= 0"),
        ("swapin_ahead", 0, "swapin_ahead=0"),
        ("swapin_groupby", -3, "swapin_groupby=-3"),
        ("sync_mode", 4, "0, 1, 2 or 3"),
        ("sync_mode", True, "sync_mode=True"),
        ("batch_size", 0, "batch_size=0"),
        ("n_tensors", 0, "Use None for no cap"),
        ("min_tensor_bytes", "lots", "cannot read 'lots' as a byte count"),
        ("min_tensor_bytes", -5, "min_tensor_bytes=-5"),
        ("host_device", "", "host_device=''"),
        ("host_device", "/device:WHAT:0:1:2", "a TensorFlow device string"),
        ("device", 3, "a device string or None"),
        ("incl_scopes", "conv", "Wrap a single value in a list"),
        ("excl_types", ["Relu", ""], "non-empty strings"),
        ("serialization", ["5:2"], "0 <= lo <= hi"),
        ("serialization", ["a:b"], "lo:hi"),
    ],
)
def test_invalid_values_are_rejected_with_a_useful_message(field, value, fragment):
    with pytest.raises(ConfigError) as err:
        LMSConfig(**{field: value})
    message = str(err.value)
    assert f"LMSConfig.{field}" in message
    assert fragment in message


def test_string_sizes_and_levels_are_normalized():
    cfg = LMSConfig(min_tensor_bytes="1MiB", serialization=[7, "2:4", "2:4"], incl_types=["Conv2D"])
    assert cfg.min_tensor_bytes == 2**20
    assert cfg.serialization == ((2, 4), (7, 7))
    assert cfg.incl_types == ("Conv2D",)


def test_json_round_trip_and_unknown_keys():
    cfg = LMSConfig(
        device="/device:GPU:1", swapin_ahead=3, excl_scopes=["loss"], serialization=["1:2"]
    )
    again = LMSConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ConfigError, match=r"Unknown LMSConfig option\(s\) \['swap_treshold'\]"):
        LMSConfig.from_dict({"swap_treshold": 3})


def test_replace_validates_again():
    with pytest.raises(ConfigError):
        LMSConfig().replace(swapin_ahead=0)
    assert LMSConfig().replace(swapin_ahead=2).swapin_ahead == 2
