"""DDLConfig and the env module: parsing, Horovod fallbacks, validation messages."""

import pytest

from ddl_tf import env
from ddl_tf.config import DEFAULT_FUSION_THRESHOLD, DDLConfig
from ddl_tf.core.reduce_ops import Average, ReduceOp, Sum, parse_op
from ddl_tf.errors import ConfigError


def test_defaults_match_the_documented_values():
    cfg = DDLConfig.from_env({})
    assert cfg.algorithm == "auto"
    assert cfg.fusion_threshold_bytes == DEFAULT_FUSION_THRESHOLD == 64 * 1024 * 1024
    assert cfg.stall_warning_seconds == 60 and cfg.stall_shutdown_seconds == 0
    assert cfg.check_collectives and cfg.abort_on_error
    assert cfg.compression == "none" and cfg.timeline is None


def test_ddl_names_win_over_horovod_fallbacks():
    environ = {
        "HOROVOD_FUSION_THRESHOLD": "1024",
        "DDL_FUSION_THRESHOLD": "2048",
        "HOROVOD_TIMELINE": "/tmp/h.json",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "10",
    }
    cfg = DDLConfig.from_env(environ)
    assert cfg.fusion_threshold_bytes == 2048
    assert cfg.timeline == "/tmp/h.json"
    assert (cfg.stall_warning_seconds, cfg.stall_shutdown_seconds) == (5.0, 10.0)
    assert DDLConfig.from_env({"HOROVOD_FUSION_THRESHOLD": "1024"}).fusion_threshold_bytes == 1024


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DDL_ALLREDUCE_ALGO": "fastest"}, "Received algorithm='fastest'"),
        ({"DDL_COMPRESSION": "int8"}, "Received compression='int8'"),
        ({"DDL_FUSION_THRESHOLD": "64MB"}, "DDL_FUSION_THRESHOLD='64MB'"),
        ({"DDL_FUSION_THRESHOLD": "-1"}, "fusion_threshold_bytes=-1"),
        ({"DDL_STALL_WARNING_SECONDS": "0"}, "stall_warning_seconds=0.0"),
        ({"DDL_STALL_WARNING_SECONDS": "soon"}, "DDL_STALL_WARNING_SECONDS='soon'"),
        ({"DDL_CHECK_COLLECTIVES": "maybe"}, "DDL_CHECK_COLLECTIVES='maybe'"),
        (
            {"DDL_STALL_WARNING_SECONDS": "60", "DDL_STALL_SHUTDOWN_SECONDS": "5"},
            "must not be shorter",
        ),
    ],
)
def test_bad_values_raise_config_errors_that_echo_the_value(environ, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DDLConfig.from_env(environ)


def test_algorithm_and_compression_names_are_case_insensitive():
    cfg = DDLConfig.from_env({"DDL_ALLREDUCE_ALGO": "RING", "DDL_COMPRESSION": "FP16"})
    assert (cfg.algorithm, cfg.compression) == ("ring", "fp16")


def test_fingerprint_covers_settings_that_must_agree_and_ignores_local_ones():
    base = DDLConfig()
    assert base.fingerprint() == base.replace(timeline="/x", stall_warning_seconds=5).fingerprint()
    assert base.fingerprint() != base.replace(algorithm="ring").fingerprint()
    assert base.fingerprint() != base.replace(fusion_threshold_bytes=0).fingerprint()


def test_env_helpers_read_only_the_given_mapping():
    assert env.get("DDL_X_UNSET", {}) is None
    assert env.get(env.DDL_TIMELINE, {"DDL_TIMELINE": "  "}) is None
    assert env.get_first(["A", "B"], {"B": "2"}) == ("B", "2")
    assert env.ddl_variables({"DDL_A": "1", "HOROVOD_B": "2", "PATH": "/bin", "DDL_E": ""}) == {
        "DDL_A": "1",
        "HOROVOD_B": "2",
    }


def test_reduce_op_parsing_follows_horovod():
    assert parse_op(None) is Average
    assert parse_op(None, average=False) is Sum
    assert parse_op("MAX") is ReduceOp.MAX
    with pytest.raises(ConfigError, match="not both"):
        parse_op(Sum, average=True)
    with pytest.raises(NotImplementedError, match="Adasum is not implemented"):
        parse_op(ReduceOp.ADASUM)  # UnsupportedError: Horovod users catch NotImplementedError
    with pytest.raises(ConfigError, match="Unknown reduction 'mean'"):
        parse_op("mean")
