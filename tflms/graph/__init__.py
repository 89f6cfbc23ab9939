"""Analysis: read-only views of TensorFlow graphs and their protobufs.

:func:`build_view` turns a ``tf.Graph``/``FuncGraph`` into the annotated
``networkx.DiGraph`` that planning and simulation work on; it never mutates
TensorFlow objects. :mod:`~tflms.graph.op_signatures` reads output names and
dtypes of ``NodeDef`` protobufs, :mod:`~tflms.graph.graph_def` imports
``GraphDef``/``FunctionDef`` protobufs into graphs for analysis.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "CONTROL_FLOW_TYPES": "tflms.graph.view",
        "SWAP_ATTR": "tflms.graph.view",
        "TensorInfo": "tflms.graph.view",
        "assign_levels": "tflms.graph.view",
        "build_view": "tflms.graph.view",
        "consumers": "tflms.graph.view",
    },
)
