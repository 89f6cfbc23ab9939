"""The six reference models of the tflms tests, at sizes a CPU trains 50 steps of in seconds.

All come from :mod:`tflms.zoo`; each entry of :data:`MODELS` takes a sample
count and returns ``(compiled model, x, y)`` with fixed seeds, so two calls
give the same initial weights and data.
"""

from __future__ import annotations

from tensorflow.python.eager import context

from tflms import zoo

BATCH = 4

SIZES = {
    "mlp": lambda: zoo.mlp(),
    "cnn_bn": lambda: zoo.cnn(),
    "resnet": lambda: zoo.resnet(),
    "unet3d": lambda: zoo.unet3d(16, depth=2, base_filters=4, channels=2, classes=3),
    "transformer": lambda: zoo.transformer(),
    "lstm": lambda: zoo.lstm(),
}


def _with_data(build):
    def make(n: int):
        model = build()
        return (model, *zoo.synthetic_data(model, n))

    return make


MODELS = {name: _with_data(build) for name, build in SIZES.items()}
mlp = MODELS["mlp"]
cnn_bn = MODELS["cnn_bn"]


def registered_swap_ops() -> set[str]:
    """Names of tflms swap ops in the train functions registered with the eager context."""
    ctx = context.context()
    found = set()
    for name in ctx.list_function_names():
        if "one_step_on_data" in name:
            found.update(n.name for n in ctx.get_function_def(name).node_def if "lms/" in n.name)
    return found


def swap_ops_in(train_function) -> set[str]:
    """Names of tflms swap ops in the graphs a Keras train function has traced.

    Keras 3 returns a plain closure over its ``tf.function`` steps; their
    concrete functions (and the functions nested in them) are searched.
    """
    found = set()
    for cell in train_function.__closure__ or ():
        functions = getattr(cell.cell_contents, "_list_all_concrete_functions", None)
        for concrete in functions() if functions else ():
            graph_def = concrete.graph.as_graph_def()
            nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
            found.update(n.name for n in nodes if "lms/" in n.name)
    return found
