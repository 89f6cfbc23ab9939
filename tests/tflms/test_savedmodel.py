"""Saved models: reading every format, rewriting the training graphs, training identically."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import fingerprint_pb2
from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

from examples import saved_models as sm
from tflms import LMSConfig
from tflms.errors import ConfigError
from tflms.saved_model.read import read_model
from tflms.saved_model.resource_args import resource_arguments
from tflms.saved_model.rewrite import analyze_model, rewrite_model
from tflms.saved_model.write import write_model

SWAP = LMSConfig(swapout_threshold=3, swapin_ahead=2, min_tensor_bytes=0, batch_size=sm.BATCH)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "tf2": sm.export_tf2(root / "tf2"),
        "nested": sm.export_tf2(root / "nested", nested=True),
        "tf1": sm.export_tf1(root / "tf1"),
        "graph_def": sm.write_graph_def(root / "train.pb"),
        "keras": sm.export_keras(root / "keras"),
    }


def rewrite(src, dst, config=SWAP):
    analysis = analyze_model(read_model(src), config)
    write_model(rewrite_model(analysis), dst)
    return analysis


def assert_same_training(train, src, dst, steps=3):
    losses_a, vars_a = train(src, steps)
    losses_b, vars_b = train(dst, steps)
    assert losses_a == losses_b
    assert len(vars_a) == len(vars_b) > 0
    for a, b in zip(vars_a, vars_b, strict=True):
        np.testing.assert_array_equal(a, b)


def test_formats_and_training_targets(models):
    expected = {
        "tf2": ("saved_model_v2", ["__inference_train_"]),
        "tf1": ("saved_model_v1", ["meta_graph[0]"]),
        "graph_def": ("graph_def", ["graph"]),
    }
    for key, (fmt, training) in expected.items():
        model = read_model(models[key])
        assert model.format == fmt
        names = [t.name for t in model.targets() if t.trains]
        assert len(names) == len(training)
        assert all(n.startswith(p) for n, p in zip(names, training, strict=True)), names


def test_resource_arguments_get_the_variable_shapes(models):
    model = read_model(models["tf2"])
    (train,) = [t for t in model.targets() if t.trains]
    assert train.unsized_resources == 0
    graph = train.import_graph()
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert reads and all(op.outputs[0].shape.is_fully_defined() for op in reads)
    matmuls = [
        op.outputs[0].shape.as_list() for op in graph.get_operations() if op.type == "MatMul"
    ]
    assert [sm.BATCH, sm.WIDTH] in matmuls


def test_nested_functions_inherit_resources_from_their_callers(models):
    meta_graph = read_model(models["nested"]).message.meta_graphs[0]
    known = resource_arguments(meta_graph)
    forward = [name for name in known if name.startswith("__forward_forward")]
    assert forward, sorted(known)  # reached only through the StatefulPartitionedCall in train
    shapes = {tuple(d.size for d in shape.dim) for _, shape in known[forward[0]].values()}
    assert shapes == {(sm.WIDTH, sm.WIDTH)}


@pytest.mark.parametrize(
    "key, train",
    [
        ("tf2", sm.train_tf2),
        ("nested", sm.train_tf2),
        ("tf1", sm.train_tf1),
        ("graph_def", sm.train_graph_def),
        ("keras", sm.train_keras),
    ],
)
def test_rewritten_model_loads_and_trains_bit_for_bit_like_the_original(
    models, tmp_path, key, train
):
    dst = tmp_path / ("out.pb" if key == "graph_def" else "out")
    analysis = rewrite(models[key], dst)
    assert analysis.swaps > 0
    rewritten = read_model(dst)
    swap_ops = [
        n.name for t in rewritten.targets() for n in t.nodes if n.name.startswith("lms/swapout_")
    ]
    assert len(swap_ops) == analysis.swaps
    assert_same_training(train, models[key], dst)


def test_only_training_functions_change_the_rest_stays_byte_identical(models, tmp_path):
    dst = tmp_path / "out"
    rewrite(models["tf2"], dst)
    before = {t.name: t for t in read_model(models["tf2"]).targets()}
    after = {t.name: t for t in read_model(dst).targets()}
    assert before.keys() == after.keys()
    for name, target in before.items():
        assert (_bytes(target) == _bytes(after[name])) != target.trains, name
    # and everything around the functions: signatures, object graph, saver
    a, b = read_model(models["tf2"]).message, read_model(dst).message
    for meta_a, meta_b in zip(a.meta_graphs, b.meta_graphs, strict=True):
        assert meta_a.object_graph_def == meta_b.object_graph_def
        assert meta_a.signature_def == meta_b.signature_def
        assert meta_a.graph_def.node == meta_b.graph_def.node


def _bytes(target):
    """A function's bytes; a graph's nodes (its library holds the functions)."""
    if target.kind == "function":
        return target.proto.SerializeToString(deterministic=True)
    return [n.SerializeToString(deterministic=True) for n in target.nodes]


def test_the_rewritten_function_is_what_tf_saved_model_load_runs(models, tmp_path):
    dst = tmp_path / "out"
    rewrite(models["tf2"], dst)
    loaded = tf.saved_model.load(str(dst))
    (concrete,) = loaded.train._list_all_concrete_functions()  # noqa: SLF001
    names = [op.name for op in concrete.graph.get_operations()]
    assert any(n.startswith("lms/swapout_") for n in names)
    swap_out = next(op for op in concrete.graph.get_operations() if op.name.startswith("lms/"))
    assert swap_out.device == "/device:CPU:0"


def test_fingerprint_is_recomputed_for_the_new_model(models, tmp_path):
    dst = tmp_path / "out"
    rewrite(models["tf2"], dst)

    def read(path):
        return fingerprint_pb2.FingerprintDef.FromString((path / "fingerprint.pb").read_bytes())

    fresh = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(str(dst)))
    assert read(dst).saved_model_checksum == fresh.saved_model_checksum
    assert read(dst).saved_model_checksum != read(models["tf2"]).saved_model_checksum
    assert read(dst).checkpoint_hash == read(models["tf2"]).checkpoint_hash  # same variables
    assert tf.saved_model.experimental.read_fingerprint(str(dst)).saved_model_checksum
    assert not (tmp_path / "tf1_out" / "fingerprint.pb").exists()
    rewrite(models["tf1"], tmp_path / "tf1_out")  # the TF1 Builder writes none: neither do we
    assert not (tmp_path / "tf1_out" / "fingerprint.pb").exists()


def test_variables_and_assets_are_copied_not_linked(models, tmp_path):
    dst = tmp_path / "out"
    rewrite(models["tf2"], dst)
    src_files = sorted(
        p.relative_to(models["tf2"]) for p in models["tf2"].rglob("*") if p.is_file()
    )
    dst_files = sorted(p.relative_to(dst) for p in dst.rglob("*") if p.is_file())
    assert src_files == dst_files
    assert any(p.parts[0] == "assets" for p in dst_files)
    for rel in dst_files:
        if rel.parts[0] in ("variables", "assets"):
            a, b = models["tf2"] / rel, dst / rel
            assert not b.is_symlink()
            assert os.stat(a).st_ino != os.stat(b).st_ino
            assert a.read_bytes() == b.read_bytes()


def test_text_graph_defs_are_written_as_text(models, tmp_path):
    graph_def = tf.compat.v1.GraphDef.FromString(models["graph_def"].read_bytes())
    src = tmp_path / "train.pbtxt"
    src.write_text(str(graph_def))
    dst = tmp_path / "out.pbtxt"
    rewrite(src, dst)
    assert read_model(dst).text and "lms/swapout_" in dst.read_text()
    assert_same_training(sm.train_graph_def, models["graph_def"], _binary(dst, tmp_path))
    rewrite(src, tmp_path / "out.pb")  # the destination's suffix picks the format
    assert not read_model(tmp_path / "out.pb").text


def _binary(text_path, tmp_path):
    from google.protobuf import text_format

    graph_def = text_format.Parse(text_path.read_text(), tf.compat.v1.GraphDef())
    out = tmp_path / "from_text.pb"
    out.write_bytes(graph_def.SerializeToString())
    return out


def test_unknown_batch_dimensions_need_the_batch_size_option(models):
    with pytest.raises(ConfigError, match=r"batch size of .* is unknown.*--batch-size N"):
        analyze_model(read_model(models["tf1"]), SWAP.replace(batch_size=None))
    sized = analyze_model(read_model(models["tf1"]), SWAP).training[0]
    assert sized.view.graph["batch_size"] == sm.BATCH
    relu_bytes = [d["outputs"][0].bytes for n, d in sized.view.nodes(data=True) if n == "relu0"]
    assert relu_bytes == [sm.BATCH * sm.WIDTH * 4]
    unplanned = analyze_model(read_model(models["tf1"]), SWAP.replace(batch_size=None), plan=False)
    assert not unplanned.training[0].plan.swaps  # a plan from a file will replace it


def test_the_split_option_is_refused_for_saved_models_naming_the_front_ends(models):
    with pytest.raises(ConfigError, match=r"max_op_bytes=1048576 .*LMSCallback.*unset"):
        analyze_model(read_model(models["tf1"]), SWAP.replace(max_op_bytes=1 << 20))
