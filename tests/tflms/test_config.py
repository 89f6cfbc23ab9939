"""LMSConfig: validation names the field, echoes the value and says the fix."""

import json

import numpy as np
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
        ("device", 3, "a device string such as '/device:GPU:0'"),
        ("host_device", "cpu", "names no device index"),
        ("host_device", "/gpu:*", "Write it as '/device:GPU:0'"),
        ("device", "GPU", "names no device index"),
        ("host_device", "/physical_device:CPU:0", "unknown part 'physical_device:CPU:0'"),
        ("device", "/device:CPU:0", "a different device from host_device"),
        ("device", "/cpu:0", "a different device from host_device"),
        ("incl_scopes", "conv", "Wrap a single value in a list"),
        ("excl_types", ["Relu", ""], "non-empty strings"),
        ("serialization", ["5:2"], "0 <= lo <= hi"),
        ("serialization", ["a:b"], "lo:hi"),
        ("memory_budget", 0, "must be a positive size. Received memory_budget=0"),
        ("memory_budget", -1, "must be a positive size. Received memory_budget=-1"),
        ("memory_budget", "-2GiB", "must be a positive size. Received memory_budget='-2GiB'"),
        ("memory_budget", "lots", "a byte count, a size such as '16GiB', or a device preset"),
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


def test_numpy_integers_are_accepted_as_plain_ints():
    cfg = LMSConfig(
        swapout_threshold=np.int64(5),
        swapin_ahead=np.int32(2),
        sync_mode=np.int64(1),
        batch_size=np.int16(8),
        n_tensors=np.uint8(3),
        min_tensor_bytes=np.int64(4096),
        safety_margin=np.float32(0.25),
    )
    assert (cfg.swapout_threshold, cfg.swapin_ahead, cfg.sync_mode, cfg.batch_size) == (5, 2, 1, 8)
    assert all(
        type(v) is int
        for v in (cfg.swapout_threshold, cfg.swapin_ahead, cfg.sync_mode, cfg.n_tensors)
    )
    assert LMSConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "spec",
    [
        "/cpu:0",
        "CPU:1",
        "/device:gpu:3",
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:worker/task:1/device:GPU:0",
        "/gpu:*",
        "cpu",
        "/device:XLA_GPU:0",
        "",
        "/task:2",
    ],
)
def test_device_parser_agrees_with_tensorflow(spec):
    import tensorflow as tf

    from tflms.utils.devices import canonical

    assert canonical(spec) == tf.DeviceSpec.from_string(spec).to_string()


@pytest.mark.parametrize("spec", ["foo", "/device:CPU", "/physical_device:GPU:0", "CPU:x"])
def test_device_parser_refuses_what_tensorflow_refuses(spec):
    import tensorflow as tf

    from tflms.utils.devices import parse_device

    with pytest.raises(ValueError):
        tf.DeviceSpec.from_string(spec)
    with pytest.raises(ValueError):
        parse_device(spec)


def test_replace_validates_and_keeps_the_other_fields():
    config = LMSConfig(swapout_threshold=4, memory_budget="16GiB", link="nvlink2")
    changed = config.replace(swapin_ahead=2, recompute=True)
    assert (changed.swapin_ahead, changed.recompute, changed.swapout_threshold) == (2, True, 4)
    assert (changed.memory_budget, changed.link) == (16 << 30, "nvlink2")
    with pytest.raises(ConfigError, match="swapin_ahead=0"):
        config.replace(swapin_ahead=0)
    with pytest.raises(TypeError, match="plan"):
        config.replace(plan={"swapin_ahead": 2})  # the stage groups are gone: fields only
