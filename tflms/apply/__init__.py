"""Apply: execute a plan on a graph - the only stage that mutates - and check the result.

One applier core (:func:`apply_with`) drives three editors, so every graph
representation gets the same rewrite: a live ``tf.Graph``/``FuncGraph``
(:mod:`~tflms.apply.graph_editor`), a copy of the analysis view
(:mod:`~tflms.apply.view_editor`) and ``GraphDef``/``FunctionDef`` protobufs
(:mod:`~tflms.apply.proto_editor`). :func:`validate` checks the contracts a
rewritten graph must satisfy.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Editor": "tflms.apply.core",
        "apply_plan": "tflms.apply.core",
        "apply_to_view": "tflms.apply.core",
        "apply_with": "tflms.apply.core",
        "validate": "tflms.apply.validation",
    },
)
