"""Command-line options are generated from LMSConfig: names, help, types, defaults."""

import argparse
import dataclasses

import pytest

from tflms import LMSConfig
from tflms.cli.options import ConfigField, add_config_options, config_fields, config_from_args
from tflms.errors import ConfigError


def parser():
    p = argparse.ArgumentParser(prog="t")
    add_config_options(p)
    return p


def test_every_field_is_an_option_with_its_docstring_and_default():
    fields = config_fields()
    assert [f.name for f in fields] == [f.name for f in dataclasses.fields(LMSConfig)]
    help_text = parser().format_help()
    for field in fields:
        assert field.doc, f"LMSConfig.{field.name} has no attribute docstring"
        assert field.option in help_text
    assert "(default: 40)" in help_text  # swapout_threshold
    assert "3: both 1 and 2" in help_text  # SYNC_MODES inlined into --sync-mode
    (threshold,) = [f for f in fields if f.name == "swapout_threshold"]
    assert threshold.doc.startswith("A tensor is swapped out for each consumer")


def test_values_are_converted_by_annotation_and_validated_by_lms_config():
    args = parser().parse_args(
        [
            "--batch-size",
            "16",
            "--min-tensor-bytes",
            "64KiB",
            "--serialization",
            "3,10:12",
            "--incl-scopes",
            "model/enc, model/dec",
            "--device",
            "/device:GPU:1",
        ]
    )
    config = config_from_args(args)
    assert config.batch_size == 16 and config.min_tensor_bytes == 64 * 1024
    assert config.serialization == ((3, 3), (10, 12))
    assert config.incl_scopes == ("model/enc", "model/dec")
    assert config.device == "/device:GPU:1"
    assert config_from_args(parser().parse_args([])) == LMSConfig()


def test_none_resets_optional_values_from_a_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"n_tensors": 4, "batch_size": 8}')
    config = config_from_args(parser().parse_args(["--config", str(path), "--n-tensors", "none"]))
    assert (config.n_tensors, config.batch_size) == (None, 8)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], "batch_size must be an int >= 1. Received batch_size=0"),
        (["--swapin-ahead", "1.5"], "Received swapin_ahead='1.5'"),
        (["--excl-types", ""], None),  # an empty list is valid
    ],
)
def test_invalid_values_get_lms_config_messages(argv, message):
    args = parser().parse_args(argv)
    if message is None:
        assert config_from_args(args).excl_types == ()
        return
    with pytest.raises(ConfigError, match=message):
        config_from_args(args)


def test_kinds_cover_the_annotation_styles_lms_config_uses():
    def field(annotation):
        from tflms.cli.options import _kinds

        return ConfigField("x_bytes", annotation, _kinds(annotation), None, "")

    assert field("int | str | None").convert("16GiB") == "16GiB"
    assert field("int | str | None").convert("1024") == 1024
    assert field("int | str | None").convert("None") is None
    assert field("float").convert("0.25") == 0.25
    assert field("tuple[str, ...]").convert("a,b") == ["a", "b"]
    assert field("int | str | None").metavar == "SIZE"
