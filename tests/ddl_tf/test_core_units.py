"""Pure core pieces: fusion plans, compression, auto policy, descriptors, timeline, shards."""

import json

import ml_dtypes
import numpy as np
import pytest

from ddl_tf.core.algorithms.selection import DEFAULT_POLICY, AutoPolicy, load_policy
from ddl_tf.core.algorithms.steps import shard_layout
from ddl_tf.core.collectives.fusion import pack, plan_buckets, unpack
from ddl_tf.core.collectives.negotiation import DESCRIPTOR_BYTES, Descriptor
from ddl_tf.core.numerics import halfconv
from ddl_tf.core.numerics.aligned import is_aligned
from ddl_tf.core.numerics.compression import Compression
from ddl_tf.core.numerics.mpi import check_reducible, reduce_into, reduce_rows
from ddl_tf.core.numerics.reduce_ops import ReduceOp
from ddl_tf.core.numerics.scaling import scale
from ddl_tf.core.timeline import NullTimeline, Timeline, merge_traces, rank_path
from ddl_tf.errors import ConfigError

F4, F2, I4 = np.dtype("float32"), np.dtype("float16"), np.dtype("int32")


def test_buckets_respect_threshold_order_and_dtype_groups():
    # members are padded to 64 bytes: two 40-byte tensors take 128 bytes of a bucket
    buckets = plan_buckets((F4, F4, F2, F4, I4, F4), (10, 10, 10, 30, 5, 1), 128)
    assert [(b.dtype, b.members) for b in buckets] == [
        (F4, (0, 1)),
        (F4, (3,)),  # 120 bytes: 128 padded, more than what is left, alone
        (F4, (5,)),
        (F2, (2,)),
        (I4, (4,)),
    ]
    assert all(b.nbytes <= 128 or len(b.members) == 1 for b in buckets)
    assert plan_buckets((F4, F4), (10, 10), 80)[0].members == (0,)
    assert plan_buckets((F4, F4), (10, 10), 0)[0].members == (0,)
    assert len(plan_buckets((F4,) * 100, (0,) * 100, 1 << 20)) == 1  # empty tensors fuse


def test_pack_unpack_round_trip_leaves_inputs_untouched():
    arrays = [np.arange(6, dtype=F4).reshape(2, 3), np.zeros(0, F4), np.float32(7.0) * np.ones(())]
    (bucket,) = plan_buckets((F4, F4, F4), (6, 0, 1), 1 << 10)
    buf = pack(bucket, arrays)
    buf += 1
    views = unpack(bucket, buf, [a.shape for a in arrays])
    assert views[0].shape == (2, 3) and views[1].shape == (0,) and views[2].shape == ()
    np.testing.assert_array_equal(views[0], arrays[0] + 1)
    assert arrays[0][0, 0] == 0


@pytest.mark.parametrize("dtype", [F4, F2, I4, np.dtype("int8"), np.dtype("complex128")])
def test_fused_members_start_on_64_byte_boundaries_with_zero_gaps(dtype):
    # TensorFlow adopts only 64-byte aligned memory as a tensor without copying it
    sizes = (3, 17, 0, 1, 40)
    arrays = [np.full(n, 5, dtype) for n in sizes]
    (bucket,) = plan_buckets((dtype,) * len(sizes), sizes, 1 << 20)
    buf = pack(bucket, arrays)
    assert is_aligned(buf) and buf.size == bucket.elements
    views = unpack(bucket, buf, [a.shape for a in arrays])
    assert all(is_aligned(views[i]) for i in range(len(sizes)) if sizes[i])
    used = np.zeros(buf.size, bool)
    for offset, size in zip(bucket.offsets, bucket.sizes, strict=True):
        used[offset : offset + size] = True
    assert (buf[used] == 5).all() and (buf[~used] == 0).all()


def test_pack_casts_to_the_bucket_dtype_as_astype_rounds():
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32) * 1e3
    for wire in (F2, np.dtype(ml_dtypes.bfloat16)):
        (bucket,) = plan_buckets((wire,), (x.size,), 1 << 20)
        assert pack(bucket, [x]).view(np.uint16).tolist() == x.astype(wire).view(np.uint16).tolist()


def test_scale_out_matches_the_new_array_bit_for_bit():
    rng = np.random.default_rng(1)
    for dtype in (F4, F2, np.dtype("float64"), I4, np.dtype(ml_dtypes.bfloat16)):
        x = (rng.normal(size=257) * 100).astype(dtype)
        expected = scale(x, 1 / 3)
        inplace = x.copy()
        assert scale(inplace, 1 / 3, out=inplace) is inplace
        assert inplace.tobytes() == expected.tobytes()
        assert scale(x, 1.0) is x
        other = np.empty_like(x)
        assert scale(x, 1.0, out=other) is other and other.tobytes() == x.tobytes()


def test_half_compression_round_trips_floats_and_passes_other_dtypes():
    x = np.array([1.0, -2.5, 3.14159], np.float64)
    for compressor, wire in ((Compression.fp16, F2), (Compression.bf16, ml_dtypes.bfloat16)):
        packed, ctx = compressor.compress(x)
        assert packed.dtype == wire
        back = compressor.decompress(packed, ctx)
        assert back.dtype == np.float64
        # one rounding to 8 (bfloat16) or 11 (float16) significant bits: at most 2**-8
        np.testing.assert_allclose(back, x, rtol=2.0**-8)
        ints = np.arange(3)
        assert compressor.compress(ints)[0] is ints
    assert Compression.get(None) is Compression.none
    with pytest.raises(ConfigError, match="Unknown compression 'zip'"):
        Compression.get("zip")


def test_local_reductions_accumulate_halves_in_float32():
    rows = np.array([[2048], [1], [1], [1]], np.float16)
    out = np.empty(1, np.float16)
    reduce_rows(rows, ReduceOp.SUM, out)
    assert out[0] == 2052  # float16 accumulation would stay at 2048
    seq = np.array([2048], np.float16)
    for _ in range(3):
        reduce_into(seq, np.array([1], np.float16), ReduceOp.SUM)
    assert seq[0] == 2048  # one rounding per hop, as a ring on a half-precision wire does


def test_reducibility_checks_say_what_to_do():
    check_reducible(np.dtype(np.int32), ReduceOp.AVERAGE)  # Horovod defines it (truncated mean)
    with pytest.raises(ConfigError, match="cast to int32"):
        check_reducible(np.dtype(np.bool_), ReduceOp.SUM)
    with pytest.raises(ConfigError, match="complex"):
        check_reducible(np.dtype(np.complex64), ReduceOp.MAX)
    check_reducible(np.dtype(ml_dtypes.bfloat16), ReduceOp.AVERAGE)


@pytest.mark.parametrize("n", [0, 1, 5, 17])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_shards_cover_the_buffer_exactly(n, parts):
    counts, displs = shard_layout(n, parts)
    assert sum(counts) == n and len(counts) == parts
    assert max(counts) - min(counts) <= 1
    assert list(displs) == [sum(counts[:i]) for i in range(parts)]


def test_auto_policy_rules_and_files(tmp_path):
    policy = AutoPolicy(
        {"single_node": ((1024, "flat"), (None, "ring")), "multi_node": ((None, "hierarchical"),)}
    )
    kwargs = {"hierarchical_ok": True, "custom_op": False}
    assert policy.choose(1024, num_nodes=1, **kwargs) == "flat"
    assert policy.choose(1025, num_nodes=1, **kwargs) == "ring"
    assert policy.choose(10, num_nodes=2, **kwargs) == "hierarchical"
    assert policy.choose(10, num_nodes=2, hierarchical_ok=False, custom_op=False) == "flat"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy.to_json()))
    assert load_policy(path).digest() == policy.digest() != DEFAULT_POLICY.digest()
    assert load_policy(None) is DEFAULT_POLICY
    path.write_text(json.dumps({"single_node": [[None, "tree"]]}))
    with pytest.raises(ConfigError, match="bad rule"):
        load_policy(path)
    with pytest.raises(ConfigError, match="could not be read"):
        load_policy(tmp_path / "missing.json")


def test_descriptors_are_fixed_size_and_digest_every_field():
    a = Descriptor.make("allreduce", "g", ((("float32", (3,)),), "sum"))
    b = Descriptor.make("allreduce", "g", ((("float32", (4,)),), "sum"))
    assert a.digest != b.digest
    assert Descriptor.make("barrier", None).summary == "barrier "
    long = Descriptor.make("allreduce", "x" * 1000)
    raw = long.encode(seq=3)
    assert len(raw) == DESCRIPTOR_BYTES
    seq, digest, error, flags, summary = Descriptor.decode(raw)
    assert (seq, digest, error) == (3, long.digest, 0) and summary.startswith("allreduce 'xxx")
    assert flags == 2  # allreduce: ranks inside join() take part
    assert Descriptor.decode(Descriptor.make("barrier", None).encode(seq=1)).flags == 0
    assert Descriptor.decode(Descriptor.joined().encode(seq=1)).flags == 1


def test_timeline_streams_per_rank_and_merges(tmp_path):
    path = tmp_path / "trace.json"
    timelines = [Timeline(path, rank=r, host="h") for r in range(2)]
    for r, tl in enumerate(timelines):
        with tl.phase("allreduce 'g'", bytes=8 * r):
            with tl.phase("negotiate"):
                pass
    # the stream is readable before close (array format without the closing bracket)
    text = rank_path(path, 0).read_text()
    assert json.loads(text.rstrip().rstrip(",") + "]")[0]["ph"] == "M"
    merge_traces(path, [tl.close() for tl in timelines])
    events = json.loads(path.read_text())["traceEvents"]
    assert sorted((e["pid"], e["name"]) for e in events if e["ph"] == "X") == [
        (0, "allreduce 'g'"),
        (0, "negotiate"),
        (1, "allreduce 'g'"),
        (1, "negotiate"),
    ]
    assert not rank_path(path, 1).exists()
    assert timelines[0].close() == []
    assert NullTimeline().phase("x") is NullTimeline().phase("y")


HALVES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def _f32_bit_patterns(rng) -> np.ndarray:
    """Random float32 bit patterns plus the values where half-precision rounding is decided."""
    bits = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 6e-8, 3e-8], "f4")
    halves = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore", over="ignore"):
        near = [(halves.view(h).astype(np.float32) * np.float32(1 + 2**-12)) for h in HALVES]
    return np.concatenate([bits, edges, *near]).astype(np.float32)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_half_conversions_match_numpy_bit_for_bit(dtype, compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(halfconv, "_kernels", None)
    every_half = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    ours, ref = halfconv.to_float32(every_half), every_half.astype(np.float32)
    nan = np.isnan(ref)
    assert (np.isnan(ours) == nan).all() and ours[~nan].tobytes() == ref[~nan].tobytes()
    x = _f32_bit_patterns(np.random.default_rng(3))
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(dtype)
    ours = halfconv.from_float32(x, np.empty(x.shape, dtype))
    nan = np.isnan(ref.astype(np.float32))
    assert (np.isnan(ours.astype(np.float32)) == nan).all()
    assert ours[~nan].view(np.uint16).tolist() == ref[~nan].view(np.uint16).tolist()
    for n in range(17):  # the vector loops' tails
        y = x[1000 : 1000 + n]
        with np.errstate(over="ignore", invalid="ignore"):
            expected = y.astype(dtype).tobytes()
        assert halfconv.cast_into(y, np.empty(n, dtype)).tobytes() == expected
    strided = every_half[::3]  # not contiguous: numpy converts it
    assert halfconv.to_float32(strided).tobytes() == strided.astype(np.float32).tobytes()


def test_half_conversions_are_compiled_here():
    # the extension is optional for users without a C compiler; this machine has one
    assert halfconv.COMPILED == ("float16", "bfloat16"), (
        "ddl_tf.core.numerics.halfkernels was not built (float16 sums fall back to slow numpy "
        "conversions); reinstall with a C compiler: pip install -e ."
    )


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_half_reductions_accumulate_in_float32_and_round_once(dtype, compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(halfconv, "_kernels", None)
    rng = np.random.default_rng(4)
    rows = (rng.normal(size=(3, 1001)) * 300).astype(dtype)
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        ufunc = {
            ReduceOp.SUM: np.add,
            ReduceOp.MIN: np.minimum,
            ReduceOp.MAX: np.maximum,
            ReduceOp.PRODUCT: np.multiply,
        }[op]
        dst = rows[0].copy()
        reduce_into(dst, rows[1], op)
        with np.errstate(over="ignore"):
            pair = ufunc(rows[0].astype(np.float32), rows[1].astype(np.float32)).astype(dtype)
            every = ufunc.reduce(rows.astype(np.float32), axis=0).astype(dtype)
        assert dst.tobytes() == pair.tobytes()
        out = np.empty(rows.shape[1], dtype)
        reduce_rows(rows, op, out)
        assert out.tobytes() == every.tobytes()
    specials = np.array([np.inf, -np.inf, 65504, -65504, 0.0, -0.0, np.nan], np.float32)
    dst, src = specials.astype(dtype), specials[::-1].astype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = (dst.astype(np.float32) + src.astype(np.float32)).astype(dtype)
    reduce_into(dst, src, ReduceOp.SUM)
    nan = np.isnan(expected.astype(np.float32))
    assert (np.isnan(dst.astype(np.float32)) == nan).all()
    assert dst[~nan].tobytes() == expected[~nan].tobytes()


def test_an_unknown_allreduce_name_is_a_config_error_naming_the_choices():
    from ddl_tf.core.algorithms.allreduce import make_allreduce

    with pytest.raises(ConfigError, match="use flat, ring, asa or hierarchical"):
        make_allreduce("butterfly", comm=None)
