"""DDLConfig and the env module: parsing, Horovod fallbacks, validation messages."""

import pytest

from ddl_tf import env
from ddl_tf.config import DEFAULT_FUSION_THRESHOLD, DDLConfig
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.core.numerics.compression import Compression
from ddl_tf.core.numerics.reduce_ops import Average, ReduceOp, Sum, parse_op
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
    assert (
        parse_op("adasum") is ReduceOp.ADASUM
    )  # the engine runs it (ddl_tf.core.algorithms.adasum)
    with pytest.raises(ConfigError, match="Unknown reduction 'mean'"):
        parse_op("mean")


def test_a_reduce_spec_is_parsed_once_from_horovods_keywords():
    spec = ReduceSpec.of(None, average=False, compression="FP16", postscale_factor=2.0)
    assert spec.op is Sum and spec.compressor is Compression.fp16 and spec.wrapper is None
    assert spec.scaled and ReduceSpec.of().compressor is None  # None: the job's default

    class Horovodish:  # a Horovod-style compressor: applied around the collective
        def compress(self, tensor):
            return tensor, None

        def decompress(self, tensor, ctx):
            return tensor

    wrapped = ReduceSpec.of(compression=Horovodish())
    assert isinstance(wrapped.wrapper, Horovodish) and wrapped.compressor is Compression.none
    with pytest.raises(ConfigError, match="Unknown compression"):
        ReduceSpec.of(compression=3)
    # built directly (as the engine's callers may), a spec still holds parsed values only
    with pytest.raises(ConfigError, match=r"ReduceSpec.of\('sum'\)"):
        ReduceSpec(op="sum")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="compressor must be a Compressor"):
        ReduceSpec(compressor="fp16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prescale_factor must be a number"):
        ReduceSpec.of(prescale_factor="2")  # type: ignore[arg-type]


def test_a_gradient_spec_turns_the_predivide_factor_into_scale_factors():
    spec = ReduceSpec.for_gradients(gradient_predivide_factor=8.0)
    assert (spec.prescale_factor, spec.postscale_factor) == (0.125, 8.0)
    with pytest.raises(ConfigError, match="only applies to op=Average"):
        ReduceSpec.for_gradients(op=Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ConfigError, match="must be a number > 0"):
        ReduceSpec.for_gradients(gradient_predivide_factor=0.0)


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("trace", "DEBUG"),
        ("debug", "DEBUG"),
        ("Info", "INFO"),
        ("warn", "WARNING"),
        ("fatal", "CRITICAL"),
    ],
)
def test_horovod_log_levels_map_to_python_levels(value, level):
    assert DDLConfig.from_env({"HOROVOD_LOG_LEVEL": value}).log_level == level


def test_an_unknown_log_level_names_the_accepted_ones():
    with pytest.raises(ConfigError, match="Unknown log level 'loud'. Use one of trace, debug"):
        DDLConfig.from_env({"DDL_LOG_LEVEL": "loud"})


def test_horovod_knobs_map_to_their_ddl_equivalents():
    assert DDLConfig.from_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}).algorithm == "hierarchical"
    both = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "DDL_ALLREDUCE_ALGO": "ring"}
    assert DDLConfig.from_env(both).algorithm == "ring"
    assert DDLConfig.from_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}).algorithm == "auto"
    # DYNAMIC: Horovod starts the timeline later with start_timeline(); no file named DYNAMIC
    assert DDLConfig.from_env({"HOROVOD_TIMELINE": "DYNAMIC"}).timeline is None
    quiet = DDLConfig.from_env(
        {"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    )
    assert quiet.stall_warning_seconds == float("inf") and quiet.stall_shutdown_seconds == 0
    named = DDLConfig.from_env({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90"})
    assert named.stall_shutdown_setting == "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
    assert DDLConfig.from_env({}).stall_shutdown_setting == "DDL_STALL_SHUTDOWN_SECONDS"


def test_horovod_knobs_without_equivalent_are_listed_for_one_warning():
    config = DDLConfig.from_env({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_AUTOTUNE": "1"})
    assert config.ignored_settings == ("HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")
    assert DDLConfig.from_env({}).ignored_settings == ()


def test_dynamic_process_sets_flag_is_read_and_shared():
    assert DDLConfig.from_env({"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}).dynamic_process_sets
    assert not DDLConfig.from_env({}).dynamic_process_sets
    on, off = DDLConfig.from_env({"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}), DDLConfig.from_env({})
    assert on.fingerprint() != off.fingerprint()  # ranks must agree on it


def test_every_horovod_variable_has_a_status_on_the_migration_page():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "migrating-from-horovod.md").read_text()
    names = set(env.HOROVOD_IGNORED) | {
        getattr(env, n) for n in dir(env) if n.startswith("HOROVOD_") and n != "HOROVOD_IGNORED"
    }
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, (
        f"add these to docs/migrating-from-horovod.md#environment-variables: {missing}"
    )
